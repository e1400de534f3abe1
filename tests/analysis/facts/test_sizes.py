"""The size facts on small snippets: what the code states is known, with its
evidence; anything else stays None."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.results import Device
from oom_lsp.analysis.facts.sizes import int_value, model_size, sizes_for, tensor_size
from oom_lsp.analysis.settings import default_settings


def _probe(source: str, name: str = "probe") -> tuple[FileContext, cst.BaseExpression, cst.FunctionDef | None]:
    """The file, the value of the last `probe = ...` in it, and its enclosing function."""
    source = textwrap.dedent(source)
    context = FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="train.py")
    facts = sizes_for(context)
    found = None
    for statement, scope in facts.index.scope_of.items():
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                target = small.targets[0].target if type(small) is cst.Assign else None
                if type(target) is cst.Name and target.value == name:
                    found = (small.value, scope)
    assert found is not None, f"no `{name} = ...` in the snippet"
    return context, found[0], found[1]


def _int(source: str):
    context, expr, scope = _probe(source)
    return int_value(context, expr, scope)


def _tensor(source: str):
    context, expr, scope = _probe(source)
    return tensor_size(context, expr, scope)


def _model(source: str):
    context, expr, scope = _probe(source)
    return model_size(context, expr, scope)


# --- integers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [("4 * 1024", 4096), ("2**20", 1 << 20), ("1000 // 3", 333), ("-(8 - 3)", -5), ("1 << 10", 1024), ("int(2.5 * 4)", 10),
     ("len([1, 2, 3])", 3), ("max(3, 7)", 7), ("0x10", 16), ("1_024", 1024)],
)
def test_literals_and_arithmetic(expression: str, value: int) -> None:
    found = _int(f"probe = {expression}\n")
    assert found is not None and found.value == value and not found.from_default


def test_module_constants_and_locals_carry_their_names() -> None:
    found = _int(
        """
        SEQ = 512
        def step():
            batch = 8
            probe = batch * SEQ
        """
    )
    assert (found.value, found.evidence, found.from_default) == (4096, "batch=8, SEQ=512", False)


def test_parameter_default_is_labelled_as_a_default() -> None:
    found = _int(
        """
        def train(batch_size=256):
            probe = batch_size
        """
    )
    assert (found.value, found.evidence, found.from_default) == (256, "batch_size=256 (parameter default)", True)


def test_argparse_default_read_through_args() -> None:
    found = _int(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--lr", type=float, default=1e-3)
        args = parser.parse_args()

        def main():
            probe = args.batch_size * 2
        """
    )
    assert (found.value, found.evidence, found.from_default) == (128, "batch_size=64 (argparse default)", True)


def test_argparse_string_default_converted_and_set_defaults_wins() -> None:
    source = """
        import argparse
        def get_args():
            p = argparse.ArgumentParser()
            p.add_argument("--hidden", type=int, default="512")
            p.add_argument("--layers", default=4)
            p.set_defaults(layers=12)
            return p.parse_args()
        args = get_args()
        probe = args.hidden
        """
    assert _int(source).value == 512
    assert _int(source.replace("probe = args.hidden", "probe = args.layers")).value == 12


def test_config_literals() -> None:
    assert _int('CONFIG = {"hidden": 768}\nprobe = CONFIG["hidden"]\n').value == 768
    found = _int(
        """
        from types import SimpleNamespace
        cfg = SimpleNamespace(model=SimpleNamespace(dim=512), train={"batch": 32})
        def f():
            probe = cfg.model.dim * cfg.train["batch"]
        """
    )
    assert (found.value, found.evidence) == (16384, "cfg.model.dim=512, cfg.train['batch']=32")
    assert _int("from easydict import EasyDict\ncfg = EasyDict({'model': {'dim': 64}})\nprobe = cfg.model.dim\n").value == 64


def test_dataclass_fields_and_keyword_overrides() -> None:
    source = """
        from dataclasses import dataclass, field
        @dataclass
        class Config:
            hidden_size: int = 768
            layers: int = field(default=12)
        cfg = Config(hidden_size=1024)
        probe = cfg.hidden_size + cfg.layers
        """
    assert _int(source).value == 1036
    assert _int(source.replace("Config(hidden_size=1024)", "Config()")).value == 780


def test_hf_argument_parser_dataclass_defaults_are_defaults() -> None:
    found = _int(
        """
        from dataclasses import dataclass
        from transformers import HfArgumentParser
        @dataclass
        class TrainArgs:
            batch_size: int = 16
        parser = HfArgumentParser((TrainArgs,))
        (train_args,) = parser.parse_args_into_dataclasses()
        probe = train_args.batch_size
        """
    )
    assert found is not None and found.value == 16 and found.from_default


def test_the_binding_that_reaches_the_use() -> None:
    source = """
        def f():
            n = 4
            n = n * 2
            probe = n
        """
    assert _int(source).value == 8
    assert _int(source.replace("n = n * 2", "n += 4")).value == 8


def test_unknowns_stay_none() -> None:
    assert _int("import os\nprobe = len(os.listdir('.'))\n") is None
    assert _int("def f(batch):\n    probe = batch\n") is None  # no default, no caller
    assert _int("def f(flag):\n    n = 4\n    if flag:\n        n = 8\n    probe = n\n") is None
    assert _int("def f(xs):\n    n = 0\n    for x in xs:\n        n = n + 1\n        probe = n\n") is None
    assert _int("import argparse\np = argparse.ArgumentParser()\nargs = p.parse_args()\nprobe = args.missing\n") is None
    assert _int("probe = 2 ** 10 ** 10\n") is None  # too large to compute


def test_environment_default() -> None:
    found = _int('import os\nprobe = int(os.environ.get("BATCH", 32))\n')
    assert (found.value, found.from_default) == (32, True)


# --- tensors -------------------------------------------------------------------------------


def test_torch_factories() -> None:
    found = _tensor("import torch\nprobe = torch.zeros(64, 1024, device='cuda')\n")
    assert (found.shape, found.elements, found.dtype, found.device, found.bytes) == ((64, 1024), 65536, "float32", Device.CUDA, 262144)
    assert _tensor("import torch\nprobe = torch.randn((8, 3, 224, 224), dtype=torch.float16)\n").bytes == 8 * 3 * 224 * 224 * 2
    assert _tensor("import torch\nprobe = torch.arange(10)\n").dtype == "int64"
    assert _tensor("import torch\nprobe = torch.arange(0, 1, 0.25)\n").elements == 4
    assert _tensor("import torch\nprobe = torch.linspace(0, 1, 50)\n").elements == 50
    assert _tensor("import torch\nprobe = torch.eye(3, 5)\n").elements == 15
    assert _tensor("import torch\nprobe = torch.full((2, 2), 7)\n").dtype == "int64"
    assert _tensor("import torch\nprobe = torch.randint(0, 10, (4, 5))\n").shape == (4, 5)
    assert _tensor("import torch\nprobe = torch.tensor([[1.0, 2.0], [3.0, 4.0]])\n").dtype == "float32"
    assert _tensor("import torch\nprobe = torch.tensor([1, 2, 3])\n").dtype == "int64"


def test_numpy_defaults_to_float64_and_keeps_it_through_torch() -> None:
    source = """
        import numpy as np
        import torch
        N = 2048
        cov = np.zeros((N, N))
        probe = torch.from_numpy(cov).cuda()
        """
    found = _tensor(source)
    assert (found.elements, found.dtype, found.device, found.bytes) == (N := 2048 * 2048, "float64", Device.CUDA, N * 8)
    assert _tensor("import numpy as np\nprobe = np.random.randn(3, 4)\n").dtype == "float64"
    assert _tensor("import numpy as np\nprobe = np.arange(10)\n").dtype == "int64"
    assert _tensor("import numpy as np\nimport torch\nprobe = torch.tensor(np.ones((2, 3), dtype=np.float32))\n").dtype == "float32"


def test_conversions_and_views_propagate() -> None:
    source = """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        def f(batch=32):
            x = torch.rand(batch, 128)
            x = x.to(device)
            y = x.view(-1, 64).double()
            probe = y
        """
    found = _tensor(source)
    assert (found.shape, found.dtype, found.device, found.from_default) == ((64, 64), "float64", Device.CUDA, True)
    assert found.evidence == "batch=32 (parameter default)"
    assert _tensor("import torch\nx = torch.ones(4, 4)\nprobe = torch.zeros_like(x, dtype=torch.bfloat16)\n").bytes == 32
    assert _tensor("import torch\nx = torch.ones(4)\nprobe = x.half().to('cpu')\n").dtype == "float16"
    assert _tensor("import torch\nx = torch.ones(4)\nprobe = x.to(torch.float64)\n").dtype == "float64"


def test_unknown_tensors_stay_none() -> None:
    assert _tensor("import torch\ndef f(x):\n    probe = x.cuda()\n") is None
    assert _tensor("import torch\nprobe = torch.load('x.pt')\n") is None
    assert _tensor("import torch\ndef f(n):\n    probe = torch.zeros(n, 4)\n").elements is None  # shape half known
    found = _tensor("import torch\ndef f(n):\n    probe = torch.zeros(n, 4)\n")
    assert found.shape == (None, 4) and found.bytes is None


def test_a_file_that_changes_the_default_dtype() -> None:
    found = _tensor("import torch\ntorch.set_default_dtype(torch.float64)\nprobe = torch.zeros(3)\n")
    assert found.dtype is None and found.elements == 3


# --- models --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("constructor", "parameters"),
    [
        ("nn.Linear(512, 10)", 5130),
        ("nn.Linear(512, 10, bias=False)", 5120),
        ("nn.Conv2d(3, 64, 3)", 3 * 64 * 9 + 64),
        ("nn.Conv2d(64, 64, kernel_size=(3, 1), groups=2, bias=False)", 64 * 32 * 3),
        ("nn.ConvTranspose2d(64, 32, 4)", 64 * 32 * 16 + 32),
        ("nn.Embedding(50257, 768)", 50257 * 768),
        ("nn.LayerNorm(768)", 1536),
        ("nn.BatchNorm2d(64)", 128),
        ("nn.GRU(10, 20)", 3 * 20 * (10 + 20) + 2 * 3 * 20),
        ("nn.LSTM(10, 20, num_layers=2, bidirectional=True)", None),
        ("nn.MultiheadAttention(512, 8)", 4 * 512 * 512 + 4 * 512),
        ("nn.TransformerEncoderLayer(512, 8)", None),
        ("nn.Transformer()", 44_140_544),
        ("nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))", 40 + 18),
        ("nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])", 60),
        ("nn.Dropout(0.1)", 0),
    ],
)
def test_torch_layers(constructor: str, parameters: int | None) -> None:
    found = _model(f"import torch.nn as nn\nprobe = {constructor}\n")
    assert found is not None and found.exact
    if parameters is not None:
        assert found.parameters == parameters


def test_torch_layers_match_torch() -> None:
    torch = pytest.importorskip("torch")
    nn = torch.nn
    for constructor in (
        "nn.LSTM(10, 20, num_layers=2, bidirectional=True)",
        "nn.LSTM(10, 20, num_layers=3, proj_size=5, bias=False)",
        "nn.RNN(8, 16, 2)",
        "nn.TransformerEncoderLayer(512, 8)",
        "nn.TransformerDecoderLayer(256, 4, dim_feedforward=1024, bias=False)",
        "nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128), 3, norm=nn.LayerNorm(64))",
        "nn.Transformer(d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=3)",
        "nn.MultiheadAttention(64, 4, kdim=32, vdim=16, add_bias_kv=True)",
        "nn.GroupNorm(4, 32)",
        "nn.LSTMCell(10, 20)",
        "nn.Conv3d(4, 8, (3, 3, 1), bias=False)",
    ):
        expected = sum(p.numel() for p in eval(constructor).parameters())  # noqa: S307 - our own literals
        found = _model(f"import torch.nn as nn\nprobe = {constructor}\n")
        assert found is not None and found.parameters == expected, constructor


def test_a_class_of_the_file_with_arguments_bound() -> None:
    source = """
        import torch
        import torch.nn as nn
        class Block(nn.Module):
            def __init__(self, d, mult=4):
                super().__init__()
                self.fc1 = nn.Linear(d, d * mult)
                self.fc2 = nn.Linear(d * mult, d)
                self.scale = d ** -0.5
        class Net(nn.Module):
            def __init__(self, d=256, n=6, vocab=1000):
                super().__init__()
                self.embed = nn.Embedding(vocab, d)
                self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
                self.head = nn.Linear(d, vocab, bias=False)
        probe = Net(d=128, n=2)
        """
    found = _model(source)
    block = 128 * 512 + 512 + 512 * 128 + 128
    assert found.exact and found.parameters == 1000 * 128 + 2 * block + 128 + 128 * 1000
    assert found.evidence == "Net(d=128, n=2)"


def test_loops_that_append_layers_and_factories() -> None:
    source = """
        import torch.nn as nn
        def make_mlp(width, depth):
            layers = []
            for i in range(depth):
                layers.append(nn.Linear(width, width))
                layers.append(nn.ReLU())
            return nn.Sequential(*layers)
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = make_mlp(64, 3)
                self.blocks = nn.ModuleList()
                for _ in range(2):
                    self.blocks.append(nn.Linear(64, 8))
        probe = Model()
        """
    assert _model(source).parameters == 3 * (64 * 64 + 64) + 2 * (64 * 8 + 8)


def test_an_unknown_submodule_makes_a_lower_bound() -> None:
    found = _model(
        """
        import torch.nn as nn
        from mylib import Backbone
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.backbone = Backbone()
                self.head = nn.Linear(10, 2)
        probe = Net()
        """
    )
    assert (found.parameters, found.exact) == (22, False)


def test_model_wrappers_pass_the_count_through() -> None:
    found = _model(
        """
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = nn.Linear(10, 10).cuda()
        probe = DDP(torch.compile(model))
        """
    )
    assert found.parameters == 110


def test_unknown_models_stay_none() -> None:
    assert _model("from mylib import Net\nprobe = Net()\n") is None
    assert _model("import torch\nprobe = torch.load('model.pt')\n") is None
    assert _model("def f(model):\n    probe = model\n") is None
    assert _model("import torch.nn as nn\nprobe = nn.LazyLinear(10)\n") is None


def test_queries_are_cached_per_file() -> None:
    context, expr, scope = _probe("import torch\nprobe = torch.zeros(3)\n")
    assert tensor_size(context, expr, scope) is tensor_size(context, expr, scope)


def test_dimensions_of_a_known_tensor() -> None:
    source = """
        import torch
        x = torch.zeros(16, 3, 32, 32)
        probe = x.shape[0] * x.size(1) * x.size(-1)
        """
    assert _int(source).value == 16 * 3 * 32
    assert _int(source.replace("x.shape[0] * x.size(1) * x.size(-1)", "x.numel()")).value == 16 * 3 * 32 * 32
    assert _int(source.replace("x.shape[0] * x.size(1) * x.size(-1)", "len(x.shape)")).value == 4


def test_self_attributes_read_in_another_method() -> None:
    source = """
        import torch
        import torch.nn as nn
        class Attention(nn.Module):
            def __init__(self, dim=512, heads=8):
                super().__init__()
                self.heads = heads
                self.dim = dim
            def forward(self, x):
                probe = torch.zeros(4, self.heads, 1024, 1024)
        """
    found = _tensor(source)
    assert (found.elements, found.from_default, found.evidence) == (4 * 8 * 1024 * 1024, True, "heads=8 (parameter default)")
    # An attribute another method rebinds is not a constant.
    assert _tensor(source.replace("def forward(self, x):", "def grow(self):\n                self.heads = 16\n            def forward(self, x):")).elements is None


def test_closures_and_top_level_rebinding() -> None:
    source = """
        BATCH = 32
        BATCH = 64
        def outer():
            width = 128
            def inner():
                probe = BATCH * width
        """
    assert _int(source).value == 64 * 128


def test_layers_that_read_the_loop_variable_are_unrolled() -> None:
    found = _model(
        """
        import torch.nn as nn
        dims = [8, 16, 32, 4]
        probe = nn.ModuleList([nn.Linear(dims[i], dims[i + 1]) for i in range(len(dims) - 1)])
        """
    )
    assert found.parameters == (8 * 16 + 16) + (16 * 32 + 32) + (32 * 4 + 4)
