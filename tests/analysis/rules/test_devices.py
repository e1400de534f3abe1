"""Whether a file runs on the GPU: the question OOM102, OOM201, OOM202 and OOM501 ask first."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.rules._devices import file_uses_cuda

OOM201 = LintSettings(enabled=frozenset({"OOM201"}), strict=True)
OOM202 = LintSettings(enabled=frozenset({"OOM202"}), strict=True)


def _lines(source: str, settings: LintSettings) -> list[int]:
    return [finding.line for finding in analyze(textwrap.dedent(source), settings)]


def _fixed(source: str, settings: LintSettings) -> str:
    return fix_source(textwrap.dedent(source), settings, unsafe=True).source


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=OOM201, path="t.py")


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nmodel.cuda()\n",
        "import torch\nx = torch.zeros(3, device='cuda:1')\n",
        "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "import torch\nx = x.to(f'cuda:{local_rank}')\n",
        "import torch as T\nT.cuda.set_device(rank)\n",
        "from torch import cuda\nprint(cuda.max_memory_allocated())\n",
        "import torch\nmodel.cuda().eval()\n",
    ],
)
def test_cuda_is_detected(source: str) -> None:
    assert file_uses_cuda(_context(source))


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch.zeros(3)\n",
        '"""Trains on cuda when available."""\nimport torch\n',
        "import torch\n# model.cuda()\n",
        "import torch\ndevice = 'cpu'\nname = 'cudaless'\n",
        "import torch\ndef cuda():\n    pass\nx = cuda\n",
    ],
)
def test_cuda_is_not_imagined(source: str) -> None:
    assert not file_uses_cuda(_context(source))
