"""Every message every rule produces, on its own INVALID examples and on fixtures/, is one short
plain-text sentence: under 120 characters (editors cut them near 100), no Markdown (the Problems
panel and Neovim's virtual text show backticks as they are), no advice after it (the fix is the
code action's title, the why is in the hover). The hover's why and remedy of every rule are short
too."""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.registry import META_RULES, all_codes, all_rules, rule_for
from oom_lsp.analysis.rule import MESSAGE_LIMIT, Rule, short_code
from oom_lsp.estimate.gpus import CATALOGUE
from oom_lsp.estimate.results import GpuTarget
from oom_lsp.estimate.wording import predicted_oom_message
from oom_lsp.notebooks.percent import split_cells
from oom_lsp.notebooks.program import analyze_cells
from oom_lsp.usecases.budget import growth_message, over_budget_message
from tests.estimate.factories import cuda_prediction

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "fixtures").rglob("*.py"))
EVERY_RULE = LintSettings(enabled=frozenset(all_codes()), strict=True)
# A second sentence ("... alive. Accumulate .detach() instead"): the advice the message must not carry.
_SECOND_SENTENCE_RE = re.compile(r"[.!?] +[A-Z]")
BROKEN_FILES = [
    "import torch\nfor x in loader\n    pass\n",
    "import torch\nx = (1,\n",
    "import torch\ndef f(:\n",
    "import torch\n  x = 1\n",
    "import torch\ntry:\n    x = 1\n",
    "import torch\nx = 'abc\n",
    "import torch\nprint(f'{x!}')\n",
    "import torch\nclass A:\npass\n",
    "import torch\nx = [1, 2\ny = 3\n",
    "import torch\n\x00\n",
    "x = (\n",
]
STALE_SUPPRESSIONS = (
    "import torch\n"
    "total = 0.0  # oom: ignore[OOM301]\n"
    "x = 1  # noqa: OOM101, OOM102, OOM201, OOM202, OOM301, OOM302, OOM303, OOM999, OOM998\n"
    "# oom: file-ignore[OOM401, OOM402, OOM501, OOM502]\n"
)


def _findings(rule: type[Rule], source: str, settings: LintSettings) -> list:
    """A notebook rule's examples are notebooks in the percent format (`# %%` starts a cell)."""
    if not rule.notebook_only:
        return analyze(source, settings)
    analysis = analyze_cells([cell for cell, _ in split_cells(source)], settings)
    return [finding for findings in analysis.findings.values() for finding in findings]


def _messages() -> dict[str, set[str]]:
    by_code: dict[str, set[str]] = defaultdict(set)
    for code, rule in all_rules().items():
        for example in rule.INVALID:
            settings = LintSettings(
                enabled=frozenset({code}),
                max_batch_size=int(example.settings.get("max_batch_size", 32)),  # type: ignore[arg-type]
            )
            for finding in _findings(rule, textwrap.dedent(example.code), settings):
                by_code[finding.code].add(finding.message)
    for path in FIXTURES:
        for finding in analyze(path.read_text(encoding="utf-8"), EVERY_RULE, str(path)):
            by_code[finding.code].add(finding.message)
    for text in [*BROKEN_FILES, STALE_SUPPRESSIONS]:
        for finding in analyze(text, EVERY_RULE):
            by_code[finding.code].add(finding.message)
    # OOM100 comes from the server's estimate: its message at the sizes, batch and GPU names
    # that make it longest (the longest name in the GPU catalogue, a GPU given by memory alone).
    longest = max(CATALOGUE, key=lambda gpu: len(gpu.name))
    for name, fitting in ((longest.name, 4095), ("GPU with 24.00 GiB", 0), ("GeForce RTX 3090", None)):
        prediction = cuda_prediction(
            peak_bytes=int(123.4 * 2**30), reserved_bytes=int(123.9 * 2**30), batch_size=4096,
            gpu=GpuTarget(name, 128 * 2**30),
        )
        by_code["OOM100"].add(predicted_oom_message(prediction, fitting))
    # OOM100 and OOM103 of the budget gate (`oom-lsp check --budget`), with a long script entry.
    entry = "train.py --config configs/very/long/path/to/the/experiment.yaml --epochs 1"
    by_code["OOM100"].add(over_budget_message(int(123.4 * 2**30), 40960, 24 * 2**30, entry))
    by_code["OOM103"].add(growth_message(int(123.4 * 2**30), int(99.9 * 2**30), 1234.5, 2.5, entry))
    by_code["OOM103"].add(growth_message(int(123.4 * 2**30), int(99.9 * 2**30), 1234.5, 2.5, entry, True))
    return by_code


MESSAGES = _messages()


def test_every_rule_is_seen_reporting() -> None:
    """Each code of the registry, meta codes included, produced messages for the checks below."""
    assert sorted(MESSAGES) == sorted(all_codes())


@pytest.mark.parametrize("code", sorted(all_codes()))
def test_messages_are_one_short_plain_sentence(code: str) -> None:
    assert MESSAGES[code], f"{code} reported nothing"
    for message in MESSAGES[code]:
        assert len(message) < MESSAGE_LIMIT, f"{len(message)} characters: {message}"
        assert "`" not in message and "**" not in message, message
        assert "\n" not in message, message
        assert not _SECOND_SENTENCE_RE.search(message), f"more than one sentence: {message}"


@pytest.mark.parametrize("code", sorted(all_codes()))
def test_hover_why_and_remedy_are_short_plain_text(code: str) -> None:
    rule = rule_for(code)
    assert rule is not None
    for text in (rule.why, rule.remedy):
        assert 10 < len(text) < 160, text
        assert "`" not in text and "\n" not in text, text
    assert code in META_RULES or code in all_rules()


def test_quoted_code_is_cut_to_its_first_line() -> None:
    assert short_code("loss") == "loss"
    assert short_code("torch.tensor(\n    all_x\n)") == "torch.tensor(..."
    assert short_code("x" * 40, 20) == "x" * 17 + "..."
