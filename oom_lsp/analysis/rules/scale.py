"""OOM6xx: scaling a model (gradient checkpointing, DataParallel)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import (
    UNKNOWN,
    get_arg,
    has_splat,
    int_value,
    is_false,
    method_call,
    string_value,
)
from oom_lsp.analysis.facts import known_models
from oom_lsp.analysis.facts.datasets import trains_on_small_inputs
from oom_lsp.analysis.facts.sizes import model_size
from oom_lsp.analysis.facts.workload import LARGE_MODEL_PARAMETERS, SMALL_MODEL_PARAMETERS, parameter_count
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Report, Rule, Valid, short_code
from oom_lsp.analysis.rules._scan import descendants, is_optimizer_like
from oom_lsp.fixes.checkpointing import enable_gradient_checkpointing

# --- OOM601 ------------------------------------------------------------------

# Any of these in the file means it already deals with activation memory
# (HF `gradient_checkpointing_enable()` / `gradient_checkpointing=True`,
# `torch.utils.checkpoint`, FSDP's `apply_activation_checkpointing`, PEFT's
# `prepare_model_for_kbit_training`, which enables it by default, DeepSpeed's
# `activation_checkpointing` config). Matched on the text, comments included:
# when in doubt, stay silent.
_CHECKPOINTING_RE = re.compile(
    r"checkpointing|utils\.checkpoint|checkpoint_sequential"
    r"|prepare_model_for_kbit_training|activation_checkpoint"
)

# A parameter count in the model name: "7b", "13B", "1.1B", "bloom-1b7", "410m".
_SIZE_RE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([bm])(?:\d*)(?![a-z])", re.IGNORECASE)
# Without a size in the name: size words and families whose every release is
# >= 1B parameters (and at least 24 layers).
_LARGE_WORDS = {"large", "xl", "xxl"}
_LARGE_FAMILIES = {"llama", "mistral", "mixtral", "falcon", "gpt-j", "gpt-neox", "bloom"}
# Words of the names that test suites give to randomly initialised miniatures
# of an architecture ("tiny-random-LlamaForCausalLM", "llama-dummy",
# "mistral-debug"): a few layers a few units wide, whatever the family.
_MINIATURE_WORDS = {"tiny", "random", "dummy", "debug", "toy"}
# The smallest parameter count (in billions) named explicitly that counts as large.
_LARGE_BILLIONS = 1.0

_TRAINER_PACKAGES = ("transformers.", "trl.", "lightning.", "pytorch_lightning.")
# Calls through which a model gets trained: optimizers (through `.parameters()`),
# trainers, wrappers and preparers (through the model itself).
_WRAPPERS = {
    "prepare",
    "get_peft_model",
    "initialize",
    "DistributedDataParallel",
    "FullyShardedDataParallel",
    "DDP",
    "FSDP",
}
_OPTIMIZER_RE = re.compile(r"Adam|SGD|RMSprop|Adagrad|Adafactor|Lion|LAMB|Optim", re.IGNORECASE)


def is_large_model_name(name: str) -> bool:
    """Whether a Hub id or path names a model of >= 1B parameters, or one of
    the size words `large`/`xl`/`xxl` (gpt2-large, t5-xl: 24+ layers).

    A size in the name decides ("Qwen2-0.5B", "pythia-410m" are not large,
    "TinyLlama-1.1B" is); otherwise a test miniature's words say small
    ("tiny-random-Llama"), and a size word or a family with no small release
    says large.
    """
    last = name.rstrip("/").rsplit("/", 1)[-1].lower()
    sizes = _SIZE_RE.findall(last)
    if sizes:
        return any(unit.lower() == "b" and float(number) >= _LARGE_BILLIONS for number, unit in sizes)
    tokens = set(re.split(r"[-_.]", last))
    if tokens & _MINIATURE_WORDS:
        return False
    if tokens & _LARGE_WORDS:
        return True
    return any(family in last for family in _LARGE_FAMILIES)


def _last_segment(expr: cst.BaseExpression) -> str | None:
    name = dotted_name(expr)
    return name.rsplit(".", 1)[-1] if name else None


@dataclass
class _Candidate:
    call: cst.Call
    path: tuple[cst.CSTNode, ...]
    # A Hugging Face model: its name argument (or the module constant holding
    # it), the variable it is assigned to, and the assigning statement.
    model_name: str | None = None
    model_constant: str | None = None
    shadowing_parameters: frozenset[str] = frozenset()
    target: str | None = None
    statement: cst.SimpleStatementLine | None = None
    # A stack of layers: its depth, a literal or a parameter's default
    # (`layers_keyword`: callers may override it), or a config field read as
    # `config.<layers_field>` whose value is known only after the pass.
    is_stack: bool = False
    layers: int | None = None
    layers_keyword: str | None = None
    layers_field: str | None = None


class NoGradientCheckpointing(Rule):
    """
    ## What it does
    Flags a deep model trained in this file without gradient checkpointing:
    a Hugging Face `AutoModel*` / `*For...` `from_pretrained` of a large model
    (a size of 1B parameters or more in its name, `large`/`xl`/`xxl`, or the
    llama, mistral, mixtral, falcon, gpt-j, gpt-neox and bloom families,
    unless the name says it is a test miniature: `tiny`, `random`, `dummy`,
    `debug`, `toy`), or
    an `nn.TransformerEncoder`/`Decoder` with `num_layers >= 12`, or an
    `nn.ModuleList`/`nn.Sequential` of 12 or more `...Block`/`...Layer`
    modules. The file must train (`backward()`, `optimizer.step()`, a
    Trainer's `train()`/`fit()`), the Hugging Face model must reach the
    training (its parameters given to an optimizer, passed to a Trainer,
    `prepare`, `get_peft_model`, DDP/FSDP, or `.train()`), and nothing in the
    file may mention checkpointing (`gradient_checkpointing`,
    `torch.utils.checkpoint`, `prepare_model_for_kbit_training`...). A
    Trainer whose arguments come from outside the file (`HfArgumentParser`,
    `TrainingArguments(**config)`, a function parameter) may enable it
    there: the rule stays silent.

    ## Why is this bad?
    Autograd keeps every layer's intermediate activations until backward:
    activation memory is layers x batch x sequence x hidden x (a dozen or
    more tensors per layer), and for a 32-layer 7B model at 4k tokens it
    exceeds the weights themselves. Checkpointing keeps only each block's
    input and recomputes the rest during backward: activation memory drops
    to about one layer's worth, for roughly 30% more compute.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
    args = TrainingArguments("out", per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
    model.gradient_checkpointing_enable()
    args = TrainingArguments("out", per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    ```

    ## Fix safety
    Unsafe, and offered for Hugging Face models only: each step gets slower
    (the forward pass runs twice), the model's KV cache is turned off while
    training, and with PEFT adapters on a frozen base the inputs need
    `model.enable_input_require_grads()` or the reentrant checkpoint passes
    no gradient to the adapters. Review before applying.
    """

    code = "OOM601"
    advisory = True
    name = "no-gradient-checkpointing"
    summary = "A deep model is trained without gradient checkpointing: every layer's activations stay alive."
    why = "Autograd keeps every layer's activations until backward: memory grows with depth x batch x sequence."
    remedy = "model.gradient_checkpointing_enable(), or torch.utils.checkpoint around each block."
    fix_applicability = Applicability.UNSAFE

    VALID = [
        Valid(
            """\
            from transformers import AutoModelForCausalLM, Trainer
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
            model.gradient_checkpointing_enable()
            Trainer(model=model, args=args).train()
            """
        ),
        # Enabled through the training arguments.
        Valid(
            """\
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1")
            args = TrainingArguments("out", gradient_checkpointing=True)
            Trainer(model=model, args=args).train()
            """
        ),
        # A small model.
        Valid(
            """\
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("EleutherAI/pythia-410m")
            opt = torch.optim.AdamW(model.parameters())
            model(**batch).loss.backward()
            opt.step()
            """
        ),
        # A randomly initialised miniature of a large family, as tests use.
        Valid(
            """\
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("my-org/tiny-random-MistralForCausalLM")
            opt = torch.optim.AdamW(model.parameters())
            model(**batch).loss.backward()
            opt.step()
            """
        ),
        # Inference only: nothing trains.
        Valid(
            """\
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf")
            print(model.generate(**inputs))
            """
        ),
        # A frozen large encoder next to a small trained head.
        Valid(
            """\
            import torch
            from transformers import AutoModel
            encoder = AutoModel.from_pretrained("bert-large-uncased").eval()
            head = torch.nn.Linear(1024, 2)
            opt = torch.optim.SGD(head.parameters(), lr=0.1)
            head(features).sum().backward()
            opt.step()
            """
        ),
        # torch.utils.checkpoint around the blocks.
        Valid(
            """\
            import torch
            from torch import nn
            from torch.utils.checkpoint import checkpoint
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.blocks = nn.ModuleList([Block() for _ in range(24)])
                def forward(self, x):
                    for block in self.blocks:
                        x = checkpoint(block, x, use_reentrant=False)
                    return x
            loss.backward()
            """
        ),
        # A shallow stack.
        Valid(
            """\
            import torch.nn as nn
            encoder = nn.TransformerEncoder(layer, num_layers=6)
            encoder(x).sum().backward()
            """
        ),
        # The default depth is overridden by a caller.
        Valid(
            """\
            import torch.nn as nn
            class Encoder(nn.Module):
                def __init__(self, depth=16):
                    super().__init__()
                    self.layers = nn.TransformerEncoder(layer, num_layers=depth)
            encoder = Encoder(depth=args.depth)
            encoder(x).sum().backward()
            """
        ),
        # A config field that the script sets elsewhere.
        Valid(
            """\
            import torch
            from torch import nn
            class Config:
                n_layer: int = 24
            class Net(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
            config = Config()
            config.n_layer = args.layers
            opt = torch.optim.AdamW(Net(config).parameters())
            opt.step()
            """
        ),
        # The model name comes through a splat.
        Valid(
            """\
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(**config)
            opt = torch.optim.AdamW(model.parameters())
            model(**batch).loss.backward()
            """
        ),
        # Not transformers' AutoModel.
        Valid(
            """\
            from mylib import AutoModel
            model = AutoModel.from_pretrained("llama-7b")
            opt = torch.optim.AdamW(model.parameters())
            loss.backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")  # base
            args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True)
            trainer = Trainer(model=model, args=args, train_dataset=data)
            trainer.train()
            """,
            line=2,
            by_default=True,  # 6.7 B parameters: the table of known models says so
            expected_fix="""\
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")  # base
            model.gradient_checkpointing_enable()
            args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True)
            trainer = Trainer(model=model, args=args, train_dataset=data)
            trainer.train()
            """,
        ),
        # A name held in a module constant, a multi-line call, a manual loop.
        Invalid(
            """\
            import torch
            import transformers

            MODEL = "gpt2-xl"

            def main():
                lm = transformers.GPT2LMHeadModel.from_pretrained(
                    MODEL,
                    torch_dtype=torch.bfloat16,
                ).to("cuda")
                optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-5)
                for batch in loader:
                    lm(**batch).loss.backward()
                    optimizer.step()
            """,
            line=7,
            by_default=True,  # gpt2-xl: 1.6 B parameters
            expected_fix="""\
            import torch
            import transformers

            MODEL = "gpt2-xl"

            def main():
                lm = transformers.GPT2LMHeadModel.from_pretrained(
                    MODEL,
                    torch_dtype=torch.bfloat16,
                ).to("cuda")
                lm.gradient_checkpointing_enable()
                optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-5)
                for batch in loader:
                    lm(**batch).loss.backward()
                    optimizer.step()
            """,
        ),
        # A deep nn.TransformerEncoder: reported, no fix (not a Hugging Face model).
        Invalid(
            """\
            import torch
            from torch import nn
            encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8), 24)
            encoder(x).mean().backward()
            """,
            line=3,
        ),
        # A ModuleList of 12 blocks in a file that trains.
        Invalid(
            """\
            import torch.nn as nn
            class GPT(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.h = nn.ModuleList([Block(config) for _ in range(12)])
            model = GPT()
            opt = torch.optim.AdamW(model.parameters())
            opt.step()
            """,
            line=5,
        ),
        # The depth is a parameter's default...
        Invalid(
            """\
            import torch.nn as nn
            class Encoder(nn.Module):
                def __init__(self, width=512, depth=16):
                    super().__init__()
                    self.layers = nn.TransformerEncoder(layer, num_layers=depth)
            Encoder()(x).sum().backward()
            """,
            line=5,
        ),
        # ... or a config dataclass field.
        Invalid(
            """\
            import torch
            from dataclasses import dataclass
            from torch import nn

            @dataclass
            class Config:
                n_layer: int = 24

            class Net(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])

            model = Net(Config(n_layer=32))
            opt = torch.optim.AdamW(model.parameters())
            opt.step()
            """,
            line=12,
        ),
        # Passed to a Trainer positionally, loaded without assignment: no fix.
        Invalid(
            """\
            from transformers import AutoModelForSequenceClassification as Model, Trainer
            trainer = Trainer(Model.from_pretrained("roberta-large", num_labels=2))
            trainer.train()
            """,
            line=2,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._candidates: list[_Candidate] = []
        self._trains = False
        self._trainer_built = False
        self._train_or_fit_called = False
        self._trained_names: set[str] = set()
        self._frozen_names: set[str] = set()
        # `.eval()` alone freezes nothing (training scripts validate too);
        # `.eval()` and never `.train()` is a model used for inference.
        self._train_mode_names: set[str] = set()
        self._eval_mode_names: set[str] = set()
        # Class-level fields (`n_layer: int = 24`), keyword arguments and
        # attribute assignments seen anywhere: what can change a default depth.
        self._class_fields: dict[str, list[int | None]] = {}
        self._keyword_values: dict[str, list[cst.BaseExpression]] = {}
        self._assigned_attributes: set[str] = set()
        # Module-level `NAME = "string"`; None when assigned more than once.
        self._constants: dict[str, str | None] = {}
        # Training arguments given to a Trainer: names, and whether any comes
        # from somewhere this file cannot read; names bound to a
        # `TrainingArguments(...)`-like call written out in the file.
        self._trainer_argument_names: set[str] = set()
        self._trainer_arguments_unknown = False
        self._literal_arguments: set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            if _is_literal_arguments(node.value):
                self._literal_arguments.add(node.targets[0].target.value)
        for target in node.targets:
            if isinstance(target.target, cst.Attribute):
                self._assigned_attributes.add(target.target.attr.value)
            self._note_class_field(target.target, node.value)
        tracker = self.context.tracker
        if tracker.current_function is not None or tracker.in_loop or len(node.targets) != 1:
            return
        target = node.targets[0].target
        if isinstance(target, cst.Name):
            value = string_value(node.value)
            self._constants[target.value] = value if target.value not in self._constants else None

    def visit_Call(self, node: cst.Call) -> None:
        self._note_training(node)
        called = method_call(node)
        if called is not None and called[1] == "from_pretrained":
            self._note_pretrained(node, called[0])
            return
        qualified = self.context.call_name(node)
        if qualified in ("torch.nn.TransformerEncoder", "torch.nn.TransformerDecoder"):
            layers = get_arg(node, "num_layers", 1)
            if isinstance(layers, cst.Arg):
                self._note_stack(node, layers.value)
        elif qualified in ("torch.nn.ModuleList", "torch.nn.Sequential"):
            count = _repeated_blocks(node)
            if count is not None:
                self._note_stack(node, count)
        for argument in node.args:
            if argument.keyword is not None:
                self._keyword_values.setdefault(argument.keyword.value, []).append(argument.value)

    def _note_stack(self, node: cst.Call, count: cst.BaseExpression) -> None:
        candidate = _Candidate(call=node, path=tuple(self.context.tracker.statements), is_stack=True)
        function = self.context.tracker.current_function
        if isinstance(count, cst.Name) and function is not None:
            candidate.layers = _parameter_default(function, count.value)
            candidate.layers_keyword = count.value
        elif isinstance(count, cst.Attribute):
            candidate.layers_field = count.attr.value
        else:
            candidate.layers = int_value(count)
        if candidate.layers is not None or candidate.layers_field is not None:
            self._candidates.append(candidate)

    def _note_class_field(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        """`n_layer: int = 24` in a class body (a config dataclass)."""
        statements = self.context.tracker.statements
        if len(statements) >= 2 and isinstance(statements[-2], cst.ClassDef) and isinstance(target, cst.Name):
            self._class_fields.setdefault(target.value, []).append(int_value(value) if value else None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._note_class_field(node.target, node.value)

    def _note_pretrained(self, node: cst.Call, receiver: cst.BaseExpression) -> None:
        qualified = self.context.qualified_name(receiver)
        if qualified is None or not qualified.startswith("transformers."):
            return
        class_name = qualified.rsplit(".", 1)[-1]
        if not (
            class_name.startswith("AutoModel")
            or re.search(r"For[A-Z]\w*$", class_name)
            or class_name.endswith("LMHeadModel")
        ):
            return
        name_argument = get_arg(node, "pretrained_model_name_or_path", 0)
        if not isinstance(name_argument, cst.Arg):
            return
        tracker = self.context.tracker
        candidate = _Candidate(call=node, path=tuple(tracker.statements))
        candidate.model_name = string_value(name_argument.value)
        if candidate.model_name is None:
            if not isinstance(name_argument.value, cst.Name):
                return
            candidate.model_constant = name_argument.value.value
            function = tracker.current_function
            if function is not None:
                candidate.shadowing_parameters = frozenset(
                    node.value for node in descendants(function.params) if isinstance(node, cst.Name)
                )
        statement = tracker.current_statement
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            assign = statement.body[0]
            if (
                isinstance(assign, cst.Assign)
                and len(assign.targets) == 1
                and _loaded_model(assign.value) is node
            ):
                candidate.target = dotted_name(assign.targets[0].target)
                candidate.statement = statement
        self._candidates.append(candidate)

    def _note_training(self, node: cst.Call) -> None:
        called = method_call(node)
        qualified = self.context.call_name(node)
        last = _last_segment(node.func)
        if called is not None:
            receiver, method = called
            receiver_name = dotted_name(receiver)
            if method == "backward" or (method == "step" and is_optimizer_like(receiver)):
                self._trains = True
            elif method in ("train", "fit"):
                self._train_or_fit_called = True
                if method == "train" and receiver_name is not None and not (
                    node.args and is_false(node.args[0].value)
                ):
                    self._trained_names.add(receiver_name)
                    self._train_mode_names.add(receiver_name)
            elif method == "eval" and receiver_name is not None:
                self._eval_mode_names.add(receiver_name)
            elif method == "requires_grad_" and receiver_name is not None:
                if node.args and is_false(node.args[0].value):
                    self._frozen_names.add(receiver_name)
        if qualified == "torch.autograd.backward":
            self._trains = True
        if last is None:
            return
        if last.endswith("Trainer") and qualified is not None and qualified.startswith(_TRAINER_PACKAGES):
            self._trainer_built = True
            model = get_arg(node, "model", 0)
            if isinstance(model, cst.Arg):
                self._note_trained(model.value)
            self._note_trainer_arguments(get_arg(node, "args", 1))
        elif last in _WRAPPERS:
            for argument in node.args:
                if argument.keyword is None or argument.keyword.value == "model":
                    self._note_trained(argument.value)
        elif _OPTIMIZER_RE.search(last):
            for argument in node.args:
                for inner in descendants(argument.value):
                    parameters = method_call(inner)
                    if parameters is not None and parameters[1] in ("parameters", "named_parameters"):
                        self._note_trained(parameters[0])

    def _note_trainer_arguments(self, arguments: cst.Arg | None | object) -> None:
        """Training arguments this file cannot read (parsed from the command
        line or a config file) may turn gradient checkpointing on."""
        if arguments is None:
            return
        if not isinstance(arguments, cst.Arg):
            self._trainer_arguments_unknown = True
        elif isinstance(arguments.value, cst.Name):
            self._trainer_argument_names.add(arguments.value.value)
        elif not _is_literal_arguments(arguments.value):
            self._trainer_arguments_unknown = True

    def _note_trained(self, expr: cst.BaseExpression) -> None:
        loaded = _loaded_model(expr)
        if loaded is not None:
            # `Trainer(AutoModel.from_pretrained(...))`: the call itself is trained.
            self._trained_names.add(_call_reference(loaded))
            return
        name = dotted_name(expr)
        if name is not None:
            self._trained_names.add(name)

    def leave_Module(self, original_node: cst.Module) -> None:
        trains = self._trains or (self._trainer_built and self._train_or_fit_called)
        if not self._candidates or not trains or _CHECKPOINTING_RE.search(self.context.source):
            return
        for candidate in self._candidates:
            if candidate.is_stack:
                self._report_stack(candidate)
            else:
                self._report_pretrained(candidate)

    def _depth(self, candidate: _Candidate) -> int | None:
        """The stack's depth, unless something in the file may set another one."""
        if candidate.layers_field is not None:
            field = candidate.layers_field
            values = self._class_fields.get(field, [])
            if len(values) != 1 or field in self._assigned_attributes:
                return None
            depth, keyword = values[0], field
        else:
            depth, keyword = candidate.layers, candidate.layers_keyword
        if depth is None:
            return None
        if keyword is not None:
            overrides = [int_value(value) for value in self._keyword_values.get(keyword, [])]
            if any(override is None or override < 12 for override in overrides):
                return None
            depth = min([depth, *overrides])  # type: ignore[list-item]
        return depth

    def _report_stack(self, candidate: _Candidate) -> None:
        depth = self._depth(candidate)
        if depth is None or depth < 12:
            return
        candidate.layers = depth
        self.context.add_report(
            self._deferred(
                candidate,
                f"A stack of {candidate.layers} layers is trained without gradient checkpointing",
                None,
            )
        )

    def _report_pretrained(self, candidate: _Candidate) -> None:
        name = candidate.model_name
        if name is None and candidate.model_constant not in candidate.shadowing_parameters:
            name = self._constants.get(candidate.model_constant or "")
        if name is None or not is_large_model_name(name):
            return
        if self._trainer_arguments_unknown or self._trainer_argument_names - self._literal_arguments:
            return
        reference = candidate.target or _call_reference(candidate.call)
        if reference not in self._trained_names or reference in self._frozen_names:
            return
        if reference in self._eval_mode_names and reference not in self._train_mode_names:
            return
        fix = None
        if candidate.statement is not None and candidate.target is not None:
            fix = FixSpec(
                title=f"Call `{candidate.target}.gradient_checkpointing_enable()`",
                edits=enable_gradient_checkpointing(candidate.statement, candidate.target),
                applicability=Applicability.UNSAFE,
            )
        known = known_models.pretrained(name, None)
        size = f" ({parameter_count(known.parameters)} parameters)" if known is not None else ""
        self.context.add_report(
            self._deferred(
                candidate,
                f"Large model {short_code(repr(name), 48)}{size} is trained without gradient checkpointing",
                fix,
                # A billion parameters or more: every layer's activations are gigabytes at any batch.
                proven=known is not None and known.parameters >= LARGE_MODEL_PARAMETERS,
            )
        )

    def _deferred(
        self, candidate: _Candidate, message: str, fix: FixSpec | None, *, proven: bool | None = None
    ) -> Report:
        return Report(
            rule=type(self),
            node=candidate.call,
            message=message,
            fix=fix,
            statement=candidate.path[-1] if candidate.path else None,
            statement_path=candidate.path,
            proven=proven,
        )


def _is_literal_arguments(expr: cst.BaseExpression) -> bool:
    """`TrainingArguments(...)`, `SFTConfig(...)` with every option written out."""
    if not isinstance(expr, cst.Call) or has_splat(expr):
        return False
    last = _last_segment(expr.func) or ""
    return last.endswith("Arguments") or last.endswith("Config")


def _call_reference(call: cst.Call) -> str:
    """A key for a model that is never assigned to a name, which no dotted
    name can collide with."""
    return f"<call {id(call)}>"


def _loaded_model(expr: cst.BaseExpression) -> cst.Call | None:
    """The `from_pretrained` call of `X.from_pretrained(...)`, possibly followed
    by device or dtype moves (`.to("cuda")`, `.cuda()`, `.half()`)."""
    while True:
        called = method_call(expr)
        if called is None:
            return None
        receiver, method = called
        if method == "from_pretrained":
            return expr  # type: ignore[return-value]
        if method not in ("to", "cuda", "half", "bfloat16", "float"):
            return None
        expr = receiver


def _parameter_default(function: cst.FunctionDef, name: str) -> int | None:
    """The integer literal default of `function`'s parameter `name`."""
    parameters = function.params
    for parameter in (*parameters.posonly_params, *parameters.params, *parameters.kwonly_params):
        if parameter.name.value == name:
            return int_value(parameter.default) if parameter.default is not None else None
    return None


def _repeated_blocks(call: cst.Call) -> cst.BaseExpression | None:
    """N for `ModuleList([Block(...) for _ in range(N)])` or
    `Sequential(*[Layer() for _ in range(N)])`."""
    if len(call.args) != 1:
        return None
    comprehension = call.args[0].value
    if not isinstance(comprehension, (cst.ListComp, cst.GeneratorExp)):
        return None
    element = comprehension.elt
    block_name = _last_segment(element.func) if isinstance(element, cst.Call) else None
    if block_name is None or not (block_name.endswith("Block") or block_name.endswith("Layer")):
        return None
    loop = comprehension.for_in
    if loop.inner_for_in is not None or loop.ifs:
        return None
    iterator = loop.iter
    if not (isinstance(iterator, cst.Call) and dotted_name(iterator.func) == "range"):
        return None
    bounds = [argument.value for argument in iterator.args]
    if len(bounds) == 1:
        return bounds[0]
    if len(bounds) == 2 and int_value(bounds[0]) == 0:
        return bounds[1]
    return None


# --- OOM602 ------------------------------------------------------------------

_DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.data_parallel",
}


class DataParallelGather(Rule):
    """
    ## What it does
    Flags `nn.DataParallel(...)` (and `nn.parallel.data_parallel(...)`),
    unless it is given a single device, or it is the implementation of a
    DataParallel strategy: a method of a class named for DataParallel
    (`DataParallelStrategy`, `DPPlugin`) wrapping the module it is given,
    where the choice was made by whoever selected that strategy.

    ## Why is this bad?
    DataParallel runs one process: every step it copies the model to each
    GPU, scatters the batch, and gathers all outputs back on the first GPU,
    where the loss is computed and the replicas' gradients are reduced. GPU 0
    therefore holds the full batch's outputs (logits over a vocabulary are
    often the largest tensor of the step) plus the reduction buffers, and
    runs out of memory while the other GPUs are half empty; the balance gets
    worse with every GPU added. PyTorch recommends DistributedDataParallel
    instead even on one machine.

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    ```python
    # torchrun --nproc_per_node=4 train.py
    dist.init_process_group("nccl")
    model = DistributedDataParallel(model.to(rank), device_ids=[rank])
    ```
    """

    code = "OOM602"
    name = "data-parallel-gather"
    summary = "`nn.DataParallel` gathers outputs, loss and gradients on the first GPU, which runs out first."
    why = (
        "Every step's outputs, the loss and the replicas' gradients are gathered on the first GPU, which "
        "runs out of memory while the others are half empty."
    )
    remedy = "DistributedDataParallel, one process per GPU."

    VALID = [
        Valid(
            """\
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            """
        ),
        # Devices through a splat: maybe a single one.
        Valid("import torch\nmodel = torch.nn.DataParallel(model, **parallel_options)\n"),
        # A single device: nothing is gathered from other GPUs.
        Valid("import torch\nmodel = torch.nn.DataParallel(model, device_ids=[0])\n"),
        # Unwrapping, not constructing.
        Valid(
            """\
            import torch.nn as nn
            if isinstance(model, nn.DataParallel):
                model = model.module
            """
        ),
        # A local class with the same name.
        Valid(
            """\
            import torch
            class DataParallel:
                pass
            model = DataParallel(model)
            """
        ),
        # A library's DataParallel strategy: picking the strategy is the
        # choice, wrapping what it is handed is only its implementation.
        Valid(
            """\
            from torch.nn import DataParallel
            class DataParallelStrategy(Strategy):
                def setup_module(self, module):
                    return DataParallel(module=module, device_ids=self.devices)
            """
        ),
    ]
    INVALID = [
        Invalid("import torch\nmodel = torch.nn.DataParallel(model).cuda()\n", line=2),
        Invalid(
            """\
            import torch.nn as nn
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(
                    model,
                    device_ids=[0, 1],
                )
            """,
            line=3,
        ),
        Invalid(
            "from torch.nn.parallel import data_parallel\nout = data_parallel(model, batch)\n",
            line=2,
        ),
        Invalid("from torch.nn import DataParallel as DP\nnet = DP(net, device_ids=[0, 1, 2, 3])\n", line=2),
        # A trainer that falls back to DataParallel by itself on a multi-GPU
        # machine: nobody asked for it.
        Invalid(
            """\
            import torch
            from torch import nn
            class Trainer:
                def wrap_model(self, model):
                    if torch.cuda.device_count() > 1:
                        model = nn.DataParallel(model)
                    return model
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.context.call_name(node) not in _DATA_PARALLEL:
            return
        if self._implements_a_data_parallel_strategy(node):
            return
        # data_parallel(module, inputs, device_ids), DataParallel(module, device_ids)
        position = 2 if self.context.call_name(node) == "torch.nn.parallel.data_parallel" else 1
        devices = get_arg(node, "device_ids", position)
        if devices is UNKNOWN:
            return
        if isinstance(devices, cst.Arg) and isinstance(devices.value, (cst.List, cst.Tuple)):
            if len(devices.value.elements) == 1:
                return
        self.report(
            node,
            "DataParallel gathers outputs and gradients on the first GPU, which runs out first",
            # On a known dataset of small samples the gathered outputs are a few MB, and a
            # model of a few million parameters has gradients of a few MB.
            proven=not trains_on_small_inputs(self.context) and not self._wraps_a_small_model(node),
        )

    def _wraps_a_small_model(self, node: cst.Call) -> bool:
        module = node.args[0].value if node.args and not node.args[0].star else None
        if module is None:
            return False
        size = model_size(self.context, module, self.context.tracker.current_function)
        return size is not None and size.exact and size.parameters < SMALL_MODEL_PARAMETERS

    def _implements_a_data_parallel_strategy(self, node: cst.Call) -> bool:
        """`class DataParallelStrategy: def setup_module(self, module): return
        DataParallel(module, ...)`: a method of a class named for DataParallel
        wrapping the module it is handed. Whoever picks that class (a
        `strategy="dp"` flag) chose DataParallel; this code only carries the
        choice out, and the choice is reported, if anywhere, where it is made."""
        statements = self.context.tracker.statements
        function = self.context.tracker.current_function
        index = next((i for i in range(len(statements) - 1, -1, -1) if statements[i] is function), None)
        owner = statements[index - 1] if index else None
        if not isinstance(owner, cst.ClassDef) or not _names_data_parallel(owner.name.value):
            return False
        module = get_arg(node, "module", 0)
        if not isinstance(module, cst.Arg) or not isinstance(module.value, cst.Name):
            return False
        parameters = function.params
        return any(
            parameter.name.value == module.value.value
            for parameter in (*parameters.posonly_params, *parameters.params, *parameters.kwonly_params)
        )


def _names_data_parallel(class_name: str) -> bool:
    """`DataParallelStrategy`, `DPPlugin`, `data_parallel_engine`; not
    `DistributedDataParallel...`."""
    words = {word.lower() for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", class_name)}
    if "distributed" in words:
        return False
    return {"data", "parallel"} <= words or "dp" in words
