"""OOM1xx: how much data a step holds (batch size, datasets on the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg, int_value, is_false, method_call, string_value
from oom_lsp.analysis.dataflow import is_backward_call
from oom_lsp.analysis.facts.sizes import tensor_size
from oom_lsp.analysis.facts.workload import MATTERS, Stake, format_bytes, workload_of
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Report, Rule, Valid, deferred_report, short_code
from oom_lsp.analysis.rules._devices import file_uses_cuda, is_device_expression
from oom_lsp.analysis.rules._scan import descendants, is_optimizer_like
from oom_lsp.fixes.batch_size import lower_batch_size

# --- OOM101 ------------------------------------------------------------------

# torch's own batching classes: `batch_size` is their second parameter.
_TORCH_BATCHERS = {
    "torch.utils.data.DataLoader",
    "torch.utils.data.dataloader.DataLoader",
    "torch.utils.data.BatchSampler",
    "torch.utils.data.sampler.BatchSampler",
}
# Settings that are the number of samples one device trains on per step.
# Global/total/effective batch sizes are not (gradient accumulation or data
# parallelism may split them), nor evaluation batch sizes: evaluation runs
# under no_grad and keeps no activations for a backward pass.
_BATCH_SIZE_FIELDS = {
    "batch_size",
    "batchsize",
    "train_batch_size",
    "per_device_train_batch_size",
    "per_gpu_train_batch_size",
    "per_device_batch_size",
    "device_batch_size",
    "micro_batch_size",
    "micro_batch_size_per_gpu",
    "train_micro_batch_size_per_gpu",
    "mini_batch_size",
    "minibatch_size",
}
# Command-line spellings: `--batch-size`, `--bs`, `--train-batch-size`...
_BATCH_SIZE_OPTIONS = _BATCH_SIZE_FIELDS | {"bs", "train_bs"}
# DeepSpeed config dicts: there `train_batch_size` is the global batch
# (micro batch x accumulation x GPUs), not what one GPU holds.
_DEEPSPEED_KEYS = {"train_micro_batch_size_per_gpu", "zero_optimization"}
# Callees whose keyword arguments are training settings or feed a loader:
# `TrainingArguments`, `SFTConfig`, `TrainConfig`, `Namespace`, `MNISTDataModule`,
# `NeighborLoader`, `build_dataloader`.
_CONFIG_CALLEE_RE = re.compile(
    r"(Config|Configuration|Arguments|Args|Params|Parameters|Settings|HParams|Hparams|HyperParams|"
    r"Hyperparameters|Namespace|DataModule)$|(?i:loader)$"
)
_ARGPARSE_METHODS = {"add_argument"}
# Words that name an evaluation split: `test_loader = DataLoader(val_set, ...)`.
_EVALUATION_WORDS = {
    "test", "val", "valid", "validation", "eval", "evaluation", "dev",
    "testset", "valset", "evalset", "devset", "testloader", "valloader", "evalloader", "testdata", "valdata",
}  # fmt: skip
_CLI_OPTION_FUNCTIONS = {"click.option", "typer.Option"}


def _option_name(text: str) -> str:
    return text.lstrip("-").lower().replace("-", "_")


def _words(name: str) -> set[str]:
    """`val_loader` -> {val, loader}; `EvalConfig` -> {eval, config}."""
    return {word.lower() for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)}


def _names_evaluation(name: str | None) -> bool:
    return name is not None and bool(_EVALUATION_WORDS & _words(name))


@dataclass
class _Constant:
    literal: cst.Integer
    path: tuple[cst.CSTNode, ...]


class LargeBatchSize(Rule):
    """
    ## What it does
    Flags a literal batch size above the configured limit (`max-batch-size`,
    32 by default) that reaches a `DataLoader` or a training config: the
    `batch_size` of `torch.utils.data.DataLoader` however it is imported, an
    argparse `--batch-size` default, a config dict key, a dataclass or class
    field, or a `TrainingArguments`-like keyword named `batch_size`,
    `per_device_train_batch_size`, `micro_batch_size`..., including through a
    constant (`BATCH_SIZE = 256`), which is then where it is reported.
    Evaluation batch sizes (`eval_batch_size`, `--test-batch-size`, a loader
    over `val_set`) are not flagged: evaluation runs without a backward pass.

    Off by default: select it with `--select OOM101` (or
    `extend-select = ["OOM101"]`) and set `max-batch-size` to what your GPU
    holds for your models. A batch size is a hyperparameter, and whether one
    fits depends on the GPU, the model and the input size, which a file
    rarely shows: on real training scripts nearly every literal above 32 it
    flagged was a standard recipe that fits. For a measured answer, run
    `oom-lsp estimate` (OOM100 reports a batch that does not fit the GPU).

    ## Why is this bad?
    The activations a training step keeps for the backward pass grow linearly
    with the batch: a batch of 256 holds 8x the activations of a batch of 32,
    and for most models they, not the weights, are what runs out of memory.
    The same effective batch is reachable with a smaller one and gradient
    accumulation.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=256, shuffle=True)
    ```

    ## Use instead
    ```python
    ACCUMULATION_STEPS = 8  # effective batch: 32 x 8 = 256
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / ACCUMULATION_STEPS
        loss.backward()
        if (step + 1) % ACCUMULATION_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Unsafe: the fix only lowers the literal to the limit. A smaller batch
    changes the optimisation (the learning rate and the number of steps per
    epoch usually go with the batch size, and batch norm sees fewer samples),
    so add gradient accumulation yourself where the effective batch matters.
    """

    code = "OOM101"
    advisory = True
    name = "large-batch-size"
    summary = "A literal batch size above the configured limit reaches a DataLoader or a training config."
    why = "Activation memory grows linearly with the batch size."
    remedy = "Lower the batch size and accumulate gradients over several steps to keep the effective batch."
    fix_applicability = Applicability.UNSAFE
    # A batch size is a hyperparameter: whether it fits depends on the GPU,
    # the model and the input size, which one file rarely shows.
    default_enabled = False

    VALID = [
        Valid(
            """\
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=32, shuffle=True)
            """
        ),
        # A higher limit configured for this project.
        Valid(
            """\
            import torch
            loader = torch.utils.data.DataLoader(train_set, batch_size=64)
            """,
            settings={"max_batch_size": 64},
        ),
        # The batch size comes through a splat or from the command line.
        Valid(
            """\
            from torch.utils.data import DataLoader
            loader_kwargs = {"num_workers": 4}
            loader = DataLoader(train_set, **loader_kwargs)
            other = DataLoader(train_set, batch_size=args.batch_size)
            """
        ),
        # Preprocessing batches on the CPU (datasets.map), a user's function,
        # and a global batch split by accumulation.
        Valid(
            """\
            import torch
            tokenized = raw.map(tokenize, batched=True, batch_size=1000)
            def evaluate(model, batch_size=512):
                ...
            evaluate(model, batch_size=512)
            ds_config = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8}
            """
        ),
        # Evaluation settings: no backward pass, no activations kept for it.
        Valid(
            """\
            import torch
            parser.add_argument("--test-batch-size", type=int, default=1000)
            test_kwargs = {"batch_size": 1000}
            val_loader = torch.utils.data.DataLoader(val_set, batch_size=256)
            loader = torch.utils.data.DataLoader(test_dataset, batch_size=256)
            """
        ),
        # A local class called DataLoader is not torch's: its second
        # positional parameter is not known to be a batch size.
        Valid(
            """\
            import torch
            class DataLoader:
                def __init__(self, items, chunk):
                    self.items, self.chunk = items, chunk
            loader = DataLoader(items, 256)
            """
        ),
        # A constant that is reassigned is not a constant.
        Valid(
            """\
            from torch.utils.data import DataLoader
            BATCH_SIZE = 256
            if small_gpu:
                BATCH_SIZE = 16
            loader = DataLoader(train_set, batch_size=BATCH_SIZE)
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("gpt2-medium").cuda()
            loader = DataLoader(dataset, batch_size=64)
            max_length = 1024
            for batch in loader:
                loss = model(batch.cuda(), labels=batch.cuda()).loss
                loss.backward()
            """,
            line=6,
            by_default=True,
        ),
        Invalid(
            """\
            from torch.utils.data import DataLoader as DL
            loader = DL(train_set, batch_size=256, shuffle=True)
            """,
            line=2,
            expected_fix="""\
            from torch.utils.data import DataLoader as DL
            loader = DL(train_set, batch_size=32, shuffle=True)
            """,
        ),
        # Positional, multi-line, through `import torch as T`.
        Invalid(
            """\
            import torch as T
            loader = T.utils.data.DataLoader(
                train_set,
                128,  # bigger is faster
                shuffle=True,
            )
            """,
            line=4,
            expected_fix="""\
            import torch as T
            loader = T.utils.data.DataLoader(
                train_set,
                32,  # bigger is faster
                shuffle=True,
            )
            """,
        ),
        Invalid(
            """\
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch-size", type=int, default=512)
            """,
            line=3,
            expected_fix="""\
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch-size", type=int, default=32)
            """,
        ),
        # A module constant flowing into the loader: reported on the constant.
        Invalid(
            """\
            import torch
            BATCH_SIZE = 1_024
            def make_loader(ds):
                return torch.utils.data.DataLoader(ds, batch_size=BATCH_SIZE)
            """,
            line=2,
            expected_fix="""\
            import torch
            BATCH_SIZE = 32
            def make_loader(ds):
                return torch.utils.data.DataLoader(ds, batch_size=BATCH_SIZE)
            """,
        ),
        Invalid(
            """\
            from transformers import TrainingArguments
            args = TrainingArguments(
                output_dir="out",
                per_device_train_batch_size=64,
            )
            """,
            line=4,
            expected_fix="""\
            from transformers import TrainingArguments
            args = TrainingArguments(
                output_dir="out",
                per_device_train_batch_size=16,
            )
            """,
            settings={"max_batch_size": 16},
        ),
        # A dataclass field and a config dict.
        Invalid(
            """\
            import torch
            from dataclasses import dataclass
            @dataclass
            class TrainConfig:
                lr: float = 3e-4
                micro_batch_size: int = 96
            config = {"lr": 3e-4, "batch_size": 100}
            """,
            line=6,
            expected_fix="""\
            import torch
            from dataclasses import dataclass
            @dataclass
            class TrainConfig:
                lr: float = 3e-4
                micro_batch_size: int = 32
            config = {"lr": 3e-4, "batch_size": 32}
            """,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._limit = context.settings.max_batch_size
        # (scope, name) -> its integer-literal assignment; None once the name
        # is bound again in that scope (an assignment, a parameter, a loop,
        # an import). The scope is the enclosing function, None for the module.
        self._constants: dict[tuple[cst.FunctionDef | None, str], _Constant | None] = {}
        # (scope, name) -> the first batch-size setting it reaches; resolved
        # against the constants once the whole file has been seen.
        self._flows: dict[tuple[cst.FunctionDef | None, str], str] = {}
        # Dict literals nested under an evaluation key.
        self._evaluation_dicts: set[cst.Dict] = set()

    # --- which names are constants ------------------------------------------
    def _bind(self, name: str, constant: _Constant | None = None) -> None:
        key = (self.context.tracker.current_function, name)
        self._constants[key] = None if key in self._constants else constant

    def visit_Global(self, node: cst.Global) -> None:
        # `global BATCH_SIZE` in a function: the module constant may change.
        for item in node.names:
            self._constants[(None, item.name.value)] = None

    def visit_Assign(self, node: cst.Assign) -> None:
        literal = node.value if isinstance(node.value, cst.Integer) else None
        for target in node.targets:
            self._bind_target(target.target, literal if len(node.targets) == 1 else None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind_target(node.target, node.value if isinstance(node.value, cst.Integer) else None)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, None)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is not None and isinstance(node.asname.name, cst.Name):
            self._bind(node.asname.name.value)
        else:
            name = dotted_name(node.name)
            if name is not None:
                self._bind(name.split(".")[0])

    def _bind_target(self, target: cst.BaseExpression, literal: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            constant = None
            if isinstance(literal, cst.Integer):
                constant = _Constant(literal, tuple(self.context.tracker.statements))
            self._bind(target.value, constant)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind_target(element.value, None)

    # --- where batch sizes go -------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.context.call_name(node)
        if qualified in _TORCH_BATCHERS:
            if self._for_evaluation(node):
                return
            arg = get_arg(node, "batch_size", 1)
            if arg is not None and arg is not UNKNOWN:
                self._check(arg.value, f"the batch_size of {qualified.rsplit('.', 1)[-1]}")
            return
        called = method_call(node)
        if (called is not None and called[1] in _ARGPARSE_METHODS) or qualified in _CLI_OPTION_FUNCTIONS:
            self._check_option(node)
            return
        if self._is_config_callee(node, qualified) and not self._for_evaluation(node):
            auto = get_arg(node, "auto_find_batch_size")
            if auto is UNKNOWN or (isinstance(auto, cst.Arg) and not is_false(auto.value)):
                return  # Hugging Face halves the batch itself on an out-of-memory error
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value.lower() in _BATCH_SIZE_FIELDS:
                    self._check(arg.value, arg.keyword.value)

    def _for_evaluation(self, call: cst.Call | None = None) -> bool:
        """Whether the setting is for evaluation, by the name it is assigned
        to (`test_kwargs = {...}`, `val_loader = DataLoader(...)`), the name
        of the callee (`EvalConfig(...)`) or of the dataset a loader reads
        (`DataLoader(test_set, ...)`): evaluation keeps no activations for
        backward."""
        names = []
        if call is not None:
            names.append(dotted_name(call.func))
            dataset = get_arg(call, "dataset", 0)
            if isinstance(dataset, cst.Arg):
                names.append(dotted_name(dataset.value))
        statement = self.context.tracker.current_statement
        if isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign):
            names.extend(dotted_name(target.target) for target in statement.body[0].targets)
        return any(_names_evaluation(name) for name in names)

    def _is_config_callee(self, node: cst.Call, qualified: str | None) -> bool:
        if qualified is not None:
            return _CONFIG_CALLEE_RE.search(qualified.rsplit(".", 1)[-1]) is not None
        # Not imported: a builtin, or a class or function of this file.
        if not isinstance(node.func, cst.Name):
            return False  # `self.make(...)`, `ds.map(...)`: unknown receivers
        name = node.func.value
        if name == "dict":
            return not any(name == "dict" for _, name in self._constants)  # not rebound: the builtin
        return _CONFIG_CALLEE_RE.search(name) is not None

    def _check_option(self, node: cst.Call) -> None:
        names = [string_value(arg.value) for arg in node.args if arg.keyword is None and not arg.star]
        option = next(
            (name for name in names if name is not None and _option_name(name) in _BATCH_SIZE_OPTIONS), None
        )
        default = get_arg(node, "default")
        if option is not None and isinstance(default, cst.Arg):
            self._check(default.value, f"the default of {option}")

    def visit_Dict(self, node: cst.Dict) -> None:
        keys = {
            string_value(element.key) for element in node.elements if isinstance(element, cst.DictElement)
        }
        if "batched" in keys or node in self._evaluation_dicts or self._for_evaluation():
            return  # `datasets.map` keyword arguments (CPU preprocessing), evaluation settings
        for element in node.elements:
            if not isinstance(element, cst.DictElement):
                continue
            key = string_value(element.key)
            if isinstance(element.value, cst.Dict) and _names_evaluation(key):
                self._evaluation_dicts.add(element.value)  # {"eval": {"batch_size": 256}}
            if key is None or key.lower() not in _BATCH_SIZE_FIELDS:
                continue
            if key == "train_batch_size" and keys & _DEEPSPEED_KEYS:
                continue
            self._check(element.value, f'the "{key}" key')

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not isinstance(node.body, cst.IndentedBlock) or _names_evaluation(node.name.value):
            return
        for statement in node.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target, value = small.targets[0].target, small.value
                elif isinstance(small, cst.AnnAssign) and small.value is not None:
                    target, value = small.target, small.value
                else:
                    continue
                if not isinstance(target, cst.Name) or target.value.lower() not in _BATCH_SIZE_FIELDS:
                    continue
                if isinstance(value, cst.Call) and self.context.call_name(value) == "dataclasses.field":
                    default = get_arg(value, "default")
                    if default is None or default is UNKNOWN:
                        continue
                    value = default.value
                self._check(value, f"the field {node.name.value}.{target.value}", statement)

    def _check(self, value: cst.BaseExpression, reaches: str, statement: cst.CSTNode | None = None) -> None:
        """A batch-size setting: report a literal above the limit, remember a
        name that may be a constant."""
        if isinstance(value, cst.Name):
            self._flows.setdefault((self.context.tracker.current_function, value.value), reaches)
            return
        number = int_value(value)
        if number is None or number <= self._limit:
            return
        path = tuple(self.context.tracker.statements)
        if statement is not None:
            path = (*path, statement)
        message, fix, stake = self._finding(value, number, reaches)
        self.context.add_report(deferred_report(self, value, message, fix, path, proven=stake is not None))

    def _finding(
        self, literal: cst.BaseExpression, number: int, reaches: str
    ) -> tuple[str, FixSpec, Stake | None]:
        limit = self._limit
        stake = self._stake_at(number)
        message = f"Batch size {number} is above the limit of {limit} ({short_code(reaches, 48)})"
        if stake is not None:
            message = f"Batch size {number} is above the limit of {limit}: {stake.text}"
        assert isinstance(literal, cst.Integer)
        fix = FixSpec(
            title=f"Lower the batch size to {limit}",
            edits=lower_batch_size(literal, limit),
            applicability=Applicability.UNSAFE,
        )
        return message, fix, stake

    def _stake_at(self, number: int) -> Stake | None:
        """The activations of a loop that iterates batches of this size, when
        the sizes show at least 2 GiB (the limit is about memory, not the number)."""
        workload = workload_of(self.context)
        for scope in workload.program.functions:
            loops = {id(loop): loop for call in scope.calls for loop in call.loops if type(loop) is cst.For}
            for loop in loops.values():
                batch = workload.batch_of(loop, scope)
                if batch is None or batch.value != number:
                    continue
                stake = workload.activations(loop, scope)
                if stake is not None and stake.bytes >= 2 * MATTERS:
                    return stake
        return None

    def leave_Module(self, original_node: cst.Module) -> None:
        reported: set[int] = set()
        for (scope, name), reaches in self._flows.items():
            # A function's own binding first, else the module's.
            key = (scope, name) if (scope, name) in self._constants else (None, name)
            constant = self._constants.get(key)
            if constant is None or id(constant) in reported:
                continue
            reported.add(id(constant))
            number = int_value(constant.literal)
            if number is None or number <= self._limit:
                continue
            message, fix, stake = self._finding(constant.literal, number, f"{name}, {reaches}")
            self.context.add_report(
                deferred_report(self, constant.literal, message, fix, constant.path, proven=stake is not None)
            )


# --- OOM102 ------------------------------------------------------------------

# Name parts that say "a split of a dataset" and "what the split holds":
# `X_train`, `train_x`, `train_data`, `all_inputs`, `val_labels`.
_SPLIT_WORDS = {
    "train",
    "training",
    "test",
    "val",
    "valid",
    "validation",
    "eval",
    "all",
    "full",
    "whole",
    "entire",
}
_DATA_WORDS = {
    "x", "y", "data", "inputs", "input", "labels", "label", "targets", "target", "images", "imgs",
    "features", "feats", "tokens", "ids", "samples", "examples", "set", "tensors", "sequences", "texts",
}  # fmt: skip
_DATASET_NAMES = {"dataset", "data_set", "trainset", "testset", "valset", "full_data", "whole_data"}
# Attributes of a dataset object that hold all of its samples (torchvision's
# `train_set.data` / `.targets`, TensorDataset's `.tensors`, pandas' `.values`).
_DATA_ATTRIBUTES = {"data", "targets", "tensors", "values", "features", "labels"}
# Functions that read a whole dataset into memory.
_DATA_SOURCES_RE = re.compile(
    r"^(numpy\.(load|loadtxt|genfromtxt|fromfile|memmap)|pandas\.read_\w+|sklearn\.datasets\.(load|fetch|make)_\w+)$"
)
# Tensor constructors and reshapes that keep "this is the whole dataset".
_TENSOR_CONSTRUCTORS = {
    "torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor",
    "torch.LongTensor", "torch.stack", "torch.cat", "torch.vstack", "numpy.array", "numpy.asarray",
    "numpy.stack", "numpy.concatenate", "numpy.vstack",
}  # fmt: skip
_KEEPING_METHODS = {
    "float", "long", "int", "half", "double", "astype", "reshape", "view", "to_numpy", "numpy", "permute",
    "unsqueeze", "squeeze", "contiguous", "transpose", "flatten", "type", "clone", "detach",
}  # fmt: skip
# Functions that run once per batch: what they move is a batch.
_PER_BATCH_FUNCTION_RE = re.compile(
    r"(^|_)step$|^(forward|__getitem__|__iter__|__next__)$|collate|^on_|batch", re.IGNORECASE
)
# Paths passed to `torch.load` that hold data, not a checkpoint.
_DATA_FILE_RE = re.compile(
    r"(^|[/_.-])(train|test|val|valid|data|dataset|features|tokens)([/_.-]|$)", re.IGNORECASE
)
_CHECKPOINT_FILE_RE = re.compile(r"model|ckpt|checkpoint|weights|state|optim|epoch", re.IGNORECASE)


# Data small by construction, whatever its name: a synthetic toy set (a course's
# `make_circles(1000)`, `torch.arange(0, 1, 0.02)`, `torch.randn(64, 10)`) or a few
# items drawn with `random.sample`. Moving it to the GPU whole is what it is for.
_SMALL_ELEMENTS = 10_000_000  # 40 MB of float32
# sklearn's generators: n_features when the call does not say (make_regression's
# default, the largest of them).
_SKLEARN_GENERATOR_RE = re.compile(r"^sklearn\.datasets\.(samples_generator\.)?make_\w+$")
_DEFAULT_GENERATED_FEATURES = 100
_SHAPED_FACTORIES = {
    "torch.rand", "torch.randn", "torch.zeros", "torch.ones", "torch.empty", "numpy.random.rand",
    "numpy.random.randn", "numpy.zeros", "numpy.ones", "numpy.empty",
}  # fmt: skip
_SAMPLERS = {"random.sample", "random.choices"}
# Functions whose result is as large as their data arguments.
_SPLITTERS = {"sklearn.model_selection.train_test_split", "numpy.append", "numpy.hstack", "torch.hstack"}


def _dataset_named(name: str) -> bool:
    lower = name.lower()
    if lower in _DATASET_NAMES or lower.endswith("dataset"):
        return True
    words = lower.split("_")
    return (
        len(words) <= 3 and bool(_SPLIT_WORDS.intersection(words)) and bool(_DATA_WORDS.intersection(words))
    )


class DatasetOnDevice(Rule):
    """
    ## What it does
    Flags a whole dataset moved to the GPU at once, before batching:
    `torch.tensor(X_train).cuda()`, `torch.from_numpy(features).to(device)`,
    `train_set.data.cuda()`, on an expression that clearly holds a whole
    dataset (read with `np.load` / `pd.read_csv` / `sklearn.datasets`, built
    from them with `torch.tensor` / `torch.from_numpy`, or named like
    `X_train`, `train_data`, `dataset`, `all_inputs`). Moving a batch inside
    the training loop, or the model, is the right pattern and is not flagged.
    Neither is an evaluation script (code under `no_grad` or a model in
    `.eval()`, and no backward pass or optimizer step anywhere in the file):
    without gradients, optimizer state or saved activations beside it, a
    feature bank moved to the GPU whole for a k-NN search is its working set.

    ## Why is this bad?
    Everything moved stays in GPU memory for the whole run, next to the
    model, its gradients, the optimizer state and the activations of each
    step, and it grows with the dataset, not with the batch: a dataset that
    fits today runs out of memory when the data doubles, and leaves less room
    for a larger model or batch.

    ## Example
    ```python
    X_train = torch.from_numpy(np.load("x_train.npy")).to(device)
    for i in range(0, len(X_train), 32):
        loss = criterion(model(X_train[i : i + 32]), y_train[i : i + 32])
    ```

    ## Use instead
    ```python
    train_set = TensorDataset(torch.from_numpy(np.load("x_train.npy")), y_train)
    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = criterion(model(x), y)
    ```
    """

    code = "OOM102"
    advisory = True
    name = "dataset-on-device"
    summary = "A whole dataset is moved to the GPU at once instead of batch by batch."
    why = (
        "It stays on the GPU for the whole run, next to the model, its gradients and every step's "
        "activations, and grows with the data, not the batch."
    )
    remedy = "Keep it on the CPU and move each batch in the loop (pin_memory=True, non_blocking=True)."

    VALID = [
        # Each batch is moved inside the loop.
        Valid(
            """\
            import torch
            device = torch.device("cuda")
            for X_train, y_train in loader:
                X_train, y_train = X_train.to(device), y_train.to(device)
            """
        ),
        # The model is moved, not data; the dataset stays on the CPU.
        Valid(
            """\
            import torch as T
            model = Net().cuda()
            train_set = T.utils.data.TensorDataset(T.from_numpy(X_train), T.from_numpy(y_train))
            """
        ),
        # A per-batch function and a Lightning hook move batches.
        Valid(
            """\
            import torch
            def collate_fn(samples):
                train_x = torch.stack([s[0] for s in samples])
                return train_x.cuda()
            class Module:
                def training_step(self, batch, batch_idx):
                    x_train = batch[0].to("cuda")
            """
        ),
        # A slice with a computed bound is a batch; a dtype cast is no move.
        Valid(
            """\
            import torch
            def get_batch(i):
                return X_train[i * 32 : (i + 1) * 32].cuda()
            X_train = X_train.to(torch.float32)
            """
        ),
        # Where it goes comes through a splat; a local `cuda` is not the method.
        Valid(
            """\
            import torch
            model.cuda()
            X_train = X_train.to(**placement)
            def cuda(t):
                return t
            X_test = cuda(X_test)
            """
        ),
        # An evaluation script: features of a frozen model, searched on the GPU.
        Valid(
            """\
            import torch
            model = load_backbone().cuda().eval()
            train_features = torch.load("out/train_features.pth")
            train_features = train_features.cuda()
            top1 = knn_classify(train_features, model, k=20)
            """
        ),
        # CPU-only: `device` may well be the CPU.
        Valid(
            """\
            import torch
            device = "cpu"
            X_train = torch.tensor(X_train).to(device)
            """
        ),
        # Toy data small by construction (the shapes of a PyTorch course's notebooks):
        # a generated set of 1,000 points, 50 points of a line, 16 sampled word ids.
        Valid(
            """\
            import random
            import numpy as np
            import torch
            from sklearn.datasets import make_circles
            from sklearn.model_selection import train_test_split
            device = "cuda"
            n_samples = 1000
            X, y = make_circles(n_samples, noise=0.03, random_state=42)
            X = torch.from_numpy(X).type(torch.float)
            X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
            X_train, y_train = X_train.to(device), y_train.to(device)
            weight, bias = 0.7, 0.3
            X = torch.arange(0, 1, 0.02).unsqueeze(dim=1)
            y = weight * X + bias
            X_test = X[40:].to(device)
            valid_examples = np.array(random.sample(range(100), 16 // 2))
            valid_examples = torch.LongTensor(valid_examples).to(device)
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            model = torch.nn.Linear(12288, 10).cuda()
            train_x = torch.randn(100_000, 3, 64, 64)
            train_x = train_x.cuda()
            for i in range(0, 100_000, 64):
                loss = model(train_x[i : i + 64].flatten(1)).sum()
                loss.backward()
            """,
            line=5,
            by_default=True,
        ),
        Invalid(
            """\
            import torch
            all_x = load_samples()
            inputs = torch.tensor(all_x).cuda()
            """,
            line=3,
        ),
        # Generated, but 400 million numbers.
        Invalid(
            """\
            import torch
            from sklearn.datasets import make_classification
            X_train, y_train = make_classification(n_samples=4_000_000, n_features=100)
            X_train = torch.from_numpy(X_train).cuda()
            """,
            line=4,
        ),
        Invalid(
            """\
            import numpy as np
            import torch as T
            device = T.device("cuda" if T.cuda.is_available() else "cpu")
            features = np.load("features.npy")
            X = T.from_numpy(features[:, :-1]).float().to(device)
            """,
            line=5,
        ),
        Invalid(
            """\
            import torch
            from torchvision import datasets
            train_set = datasets.MNIST("data", train=True, download=True)
            images = train_set.data.cuda()
            """,
            line=4,
        ),
        # Built on the device directly, across several lines.
        Invalid(
            """\
            import torch
            def main(X_train, y_train):
                X_train = torch.as_tensor(
                    X_train,
                    device="cuda:0",
                )
            """,
            line=3,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._candidates: list[Report] = []
        # Names bound to a whole dataset, per function (None: module level).
        self._holders: dict[cst.FunctionDef | None, set[str]] = {}
        # Names bound to data small by construction, and to numbers, per function.
        self._small: dict[cst.FunctionDef | None, set[str]] = {}
        self._numbers: dict[cst.FunctionDef | None, dict[str, float]] = {}
        # Whether the file trains (a backward pass, an optimizer step) and
        # whether it evaluates (code under no_grad, a model put in `.eval()`).
        self._trains = False
        self._evaluates = False

    def leave_Assign(self, original_node: cst.Assign) -> None:
        # After the value's own calls were visited: `X = X.to(device)` is
        # checked with what X held before.
        node = original_node
        for target in node.targets:
            self._bind_sizes(target.target, node.value)
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        name = node.targets[0].target.value
        scope = self.context.tracker.current_function
        holders = self._holders.setdefault(scope, set())
        if self._holds_dataset(node.value) or self._is_data_file_load(node.value):
            holders.add(name)
        else:
            holders.discard(name)

    # --- data small by construction -------------------------------------------------

    def _bind_sizes(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        scope = self.context.tracker.current_function
        small = self._small.setdefault(scope, set())
        numbers = self._numbers.setdefault(scope, {})
        if isinstance(target, cst.Name):
            number = self._number(value)
            if number is None:
                numbers.pop(target.value, None)
            else:
                numbers[target.value] = number
            if self._is_small(value):
                small.add(target.value)
            else:
                small.discard(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            names = [element.value for element in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(names):
                for name, element in zip(names, value.elements):
                    self._bind_sizes(name, element.value)
                return
            # `X, y = make_circles(1000)`, `X_train, X_test, ... = train_test_split(X, y)`.
            whole = self._is_small(value)
            for name in names:
                if isinstance(name, cst.Name):
                    numbers.pop(name.value, None)
                    (small.add if whole else small.discard)(name.value)

    def _number(self, expr: cst.BaseExpression) -> float | None:
        if isinstance(expr, (cst.Integer, cst.Float)):
            try:
                return float(expr.evaluated_value)
            except (ValueError, OverflowError):
                return None
        if isinstance(expr, cst.Name):
            scope = self.context.tracker.current_function
            value = self._numbers.get(scope, {}).get(expr.value)
            return (
                value if value is not None or scope is None else self._numbers.get(None, {}).get(expr.value)
            )
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            value = self._number(expr.expression)
            return -value if value is not None else None
        if isinstance(expr, cst.BinaryOperation):
            left, right = self._number(expr.left), self._number(expr.right)
            if left is None or right is None:
                return None
            operator = expr.operator
            if isinstance(operator, cst.Add):
                return left + right
            if isinstance(operator, cst.Subtract):
                return left - right
            if isinstance(operator, cst.Multiply):
                return left * right
            if isinstance(operator, (cst.Divide, cst.FloorDivide)) and right:
                return left / right if isinstance(operator, cst.Divide) else float(left // right)
        return None

    def _elements(self, call: cst.Call, qualified: str) -> float | None:
        """How many elements a synthetic-data call makes, when its arguments say."""
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if qualified in ("torch.arange", "numpy.arange"):
            values = [self._number(value) for value in positional[:3]]
            if not values or None in values:
                return None
            start, end, step = (
                (0.0, values[0], 1.0) if len(values) == 1 else (*values[:2], (values[2:] or [1.0])[0])
            )
            return max(0.0, (end - start) / step) if step else None
        if qualified in ("torch.linspace", "torch.logspace", "numpy.linspace"):
            steps = get_arg(call, "steps" if qualified.startswith("torch") else "num", 2)
            return self._number(steps.value) if isinstance(steps, cst.Arg) else None
        if qualified in _SHAPED_FACTORIES or qualified in ("torch.randint", "torch.randperm"):
            if qualified == "torch.randperm":
                sizes = positional[:1]
            elif qualified == "torch.randint":
                size = get_arg(call, "size", len(positional) - 1 if positional else None)
                sizes = [size.value] if isinstance(size, cst.Arg) else []
            else:
                sizes = positional
            if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
                sizes = [element.value for element in sizes[0].elements]
            total = 1.0
            for size in sizes or [None]:
                number = self._number(size) if size is not None else None
                if number is None:
                    return None
                total *= number
            return total
        if _SKLEARN_GENERATOR_RE.match(qualified):
            samples = get_arg(call, "n_samples", 0)
            features = get_arg(call, "n_features")
            count = (
                100.0
                if samples is None
                else self._number(samples.value)
                if isinstance(samples, cst.Arg)
                else None
            )
            width = (
                _DEFAULT_GENERATED_FEATURES
                if features is None
                else self._number(features.value)
                if isinstance(features, cst.Arg)
                else None
            )
            return count * width if count is not None and width is not None else None
        return None

    def _is_small(self, expr: cst.BaseExpression) -> bool:
        """Data small by construction (under `_SMALL_ELEMENTS` elements)."""
        if self._number(expr) is not None:
            return True
        if isinstance(expr, cst.Name):
            scope = self.context.tracker.current_function
            return expr.value in self._small.get(scope, ()) or (
                scope is not None and expr.value in self._small.get(None, ())
            )
        if isinstance(expr, cst.Subscript):
            return self._is_small(expr.value)
        if isinstance(expr, (cst.Tuple, cst.List)):
            return len(expr.elements) <= _SMALL_ELEMENTS and all(
                self._is_small(element.value) for element in expr.elements
            )
        if isinstance(expr, cst.BinaryOperation):
            return self._is_small(expr.left) and self._is_small(expr.right)
        if isinstance(expr, cst.UnaryOperation):
            return self._is_small(expr.expression)
        if not isinstance(expr, cst.Call):
            return False
        qualified = self.context.call_name(expr)
        if qualified is not None:
            if qualified in _SAMPLERS:
                return True
            elements = self._elements(expr, qualified)
            if elements is not None:
                return elements <= _SMALL_ELEMENTS
            if qualified in _TENSOR_CONSTRUCTORS or qualified in _SPLITTERS:
                data = [arg.value for arg in expr.args if arg.keyword is None and not arg.star]
                return bool(data) and all(self._is_small(value) for value in data)
        called = method_call(expr)
        if called is not None and (called[1] in _KEEPING_METHODS or called[1] in ("to", "cuda", "cpu")):
            return self._is_small(called[0])
        return False

    def _is_data_file_load(self, expr: cst.BaseExpression) -> bool:
        """`torch.load("train_data.pt")`: data, not a checkpoint."""
        if not isinstance(expr, cst.Call) or self.context.call_name(expr) != "torch.load" or not expr.args:
            return False
        path = string_value(expr.args[0].value)
        return path is not None and bool(_DATA_FILE_RE.search(path)) and not _CHECKPOINT_FILE_RE.search(path)

    def _holds_dataset(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name):
            if _dataset_named(expr.value):
                return True
            scope = self.context.tracker.current_function
            return expr.value in self._holders.get(scope, ()) or (
                scope is not None and expr.value in self._holders.get(None, ())
            )
        if isinstance(expr, cst.Attribute):
            if _dataset_named(expr.attr.value):
                return True
            return expr.attr.value in _DATA_ATTRIBUTES and self._holds_dataset(expr.value)
        if isinstance(expr, cst.Subscript):
            # `data[:, :-1]` still holds all the samples; `X[i : i + 32]` is a
            # batch and `dataset[0]` one sample.
            return (
                isinstance(expr.slice[0].slice, cst.Slice)
                and not any(
                    isinstance(node, cst.Name) for element in expr.slice for node in descendants(element)
                )
                and self._holds_dataset(expr.value)
            )
        if isinstance(expr, cst.Call):
            qualified = self.context.call_name(expr)
            if qualified is not None and _DATA_SOURCES_RE.match(qualified):
                return True
            if qualified in _TENSOR_CONSTRUCTORS and expr.args:
                first = expr.args[0].value
                if isinstance(first, (cst.ListComp, cst.GeneratorExp)):
                    return self._holds_dataset(first.for_in.iter)
                return self._holds_dataset(first)
            called = method_call(expr)
            if called is not None and called[1] in _KEEPING_METHODS:
                return self._holds_dataset(called[0])
        return False

    def _named_dataset_built(self, move: cst.Call, moved: cst.BaseExpression) -> str | None:
        """`X_train = torch.from_numpy(load_images(...)).to(device)`: a tensor
        built from whatever the file's own loader returns, named as a dataset.
        The name, or None."""
        statement = self.context.tracker.current_statement
        if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
            statement.body[0], cst.Assign
        ):
            return None
        assign = statement.body[0]
        if assign.value is not move or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Name) or not _dataset_named(target.value):
            return None
        while (called := method_call(moved)) is not None and called[1] in _KEEPING_METHODS:
            moved = called[0]
        if isinstance(moved, cst.Call) and self.context.call_name(moved) in _TENSOR_CONSTRUCTORS:
            return target.value
        return None

    def visit_Call(self, node: cst.Call) -> None:
        tracker = self.context.tracker
        called = method_call(node)
        if not self._trains:
            self._trains = is_backward_call(node, self.context) or (
                called is not None and called[1] == "step" and is_optimizer_like(called[0])
            )
        if not self._evaluates:
            self._evaluates = tracker.in_no_grad or (
                called is not None and called[1] == "eval" and not node.args
            )
        if tracker.in_loop or any(_PER_BATCH_FUNCTION_RE.search(f.name.value) for f in tracker.functions):
            return
        moved: cst.BaseExpression | None = None
        if called is not None and called[1] == "cuda":
            moved = called[0]
        elif called is not None and called[1] == "to":
            device = get_arg(node, "device", 0)
            if (
                device is not None
                and device is not UNKNOWN
                and is_device_expression(device.value, self.context)
            ):
                moved = called[0]
        elif self.context.call_name(node) in ("torch.tensor", "torch.as_tensor") and node.args:
            device = get_arg(node, "device")
            if (
                device is not None
                and device is not UNKNOWN
                and is_device_expression(device.value, self.context)
            ):
                moved = node.args[0].value
        if moved is None or self._is_small(moved):
            return
        if self._holds_dataset(moved):
            shown = short_code(self.context.code_for(moved), 40)
        else:
            named = self._named_dataset_built(node, moved)
            if named is None:
                return
            shown = named
        size = tensor_size(self.context, moved, tracker.current_function)
        stake = size.bytes if size is not None else None
        message = f"The whole dataset {shown} is moved to the GPU at once"
        if stake is not None:
            message += f" ({format_bytes(stake)})"
        self._candidates.append(
            deferred_report(
                self, node, message, None, tuple(tracker.statements), proven=stake is not None and stake >= MATTERS
            )
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        # An evaluation script (a frozen model under no_grad or `.eval()`,
        # never a backward pass or an optimizer step) keeps no gradients,
        # optimizer state or saved activations on the GPU: a feature bank
        # moved there whole is the working set of its search, by design.
        if self._evaluates and not self._trains:
            return
        if self._candidates and file_uses_cuda(self.context):
            for report in self._candidates:
                self.context.add_report(report)


