"""OOM202 float64, beyond its examples."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.context import FileContext

OOM201 = LintSettings(enabled=frozenset({"OOM201"}), strict=True)
OOM202 = LintSettings(enabled=frozenset({"OOM202"}), strict=True)


def _lines(source: str, settings: LintSettings) -> list[int]:
    return [finding.line for finding in analyze(textwrap.dedent(source), settings)]


def _fixed(source: str, settings: LintSettings) -> str:
    return fix_source(textwrap.dedent(source), settings, unsafe=True).source


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=OOM201, path="t.py")




def test_float64_reports_each_spelling_once() -> None:
    source = """\
    import torch as T
    from torch import float64
    device = T.device("cuda")
    a = T.ones(4096, 256, device=device, dtype=T.double)
    b = x.to(float64)
    c = x.type(T.float64)
    T.set_default_tensor_type(T.cuda.DoubleTensor)
    d = T.cuda.DoubleTensor(3)
    """
    assert _lines(source, OOM202) == [4, 5, 6, 7, 8]


def test_default_tensor_type_as_a_string() -> None:
    source = "import torch\ntorch.set_default_tensor_type('torch.cuda.DoubleTensor')\n"
    fixed = fix_source(source, OOM202, unsafe=False).source
    assert fixed == "import torch\ntorch.set_default_tensor_type('torch.cuda.FloatTensor')\n"


def test_bare_imported_name_is_reported_without_fix() -> None:
    source = "import torch\nfrom torch import float64\nx = y.cuda().to(float64)\n"
    (finding,) = analyze(source, OOM202)
    assert finding.fix is None


def test_float64_fix_is_safe_and_keeps_the_alias() -> None:
    source = "import torch as th\nm = net.cuda().double()\nx = m(y.to(dtype=th.float64))\n"
    result = fix_source(source, OOM202, unsafe=False)
    assert result.source == "import torch as th\nm = net.cuda().float()\nx = m(y.to(dtype=th.float32))\n"


@pytest.mark.parametrize(
    "line",
    [
        "acc = (pred == y).double().mean()",
        "total = correct.double().sum().item()",
        "host = x.cpu().double()",
        "on_cpu = x.to('cpu', torch.float64)",
        "eps = torch.finfo(torch.float64).eps",
        "is_double = x.dtype == torch.double",
        "with torch.no_grad():\n    metric = scores.double()",
        "a = np.zeros(3, dtype=np.float64)",
        "assert torch.autograd.gradcheck(layer, (x.cuda().double(),))",
        "class Packed:\n    def double(self):\n        return type(self)(self.data.double())",
        "class Seq:\n    def double(self):\n        return self.to(dtype=torch.double)",
    ],
)
def test_float64_that_costs_no_gpu_memory_is_silent(line: str) -> None:
    assert _lines(f"import torch\nimport numpy as np\nmodel.cuda()\n{line}\n", OOM202) == []


def test_float64_in_a_cpu_helper_of_a_cuda_file_is_silent() -> None:
    source = """\
    import torch
    def reference_solution(a, b):
        return torch.linalg.solve(a.double(), b.to(torch.float64))
    def train():
        model = Net().cuda()
        model = model.double()
    """
    assert _lines(source, OOM202) == [6]


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        # A metric's count and total, summed exactly across ranks.
        ("t = torch.tensor([count, total], dtype=torch.float64, device='cuda')", False),
        ("t = torch.tensor([[1, 2], [3, 4]], dtype=torch.float64, device=device)", False),
        ("cov = torch.zeros(3, 3, dtype=torch.double, device=device)", False),
        ("cov = torch.zeros((64, 64), dtype=torch.double, device=device)", False),
        ("f = torch.full((8,), 0.5, dtype=torch.float64, device='cuda')", False),
        # Large, or a size the call does not show.
        ("x = torch.randn(256, 256, dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros((1024, 1024), dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros(n, 3, dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros(*shape, dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor(values, dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor([v for v in values], dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor([*values], dtype=torch.float64, device='cuda')", True),
    ],
)
def test_a_tensor_of_a_few_elements_costs_nothing(line: str, reported: bool) -> None:
    assert bool(_lines(f"import torch\n{line}\n", OOM202)) is reported


def test_float64_noqa() -> None:
    source = "import torch\nx = torch.zeros(4096, 4096, device='cuda', dtype=torch.float64)  # noqa: OOM202\n"
    assert _lines(source, OOM202) == []
