"""Golden tests of the seven-section prompt on realistic inputs, and its budget.

Regenerate the golden files after an intended change with
`OOM_LSP_UPDATE_GOLDEN=1 pytest tests/llm/test_prompt.py` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from oom_lsp.config import ConfigResolver
from oom_lsp.estimate.results import Prediction
from oom_lsp.llm.context import EnvironmentFacts
from oom_lsp.llm.prompt import TOKEN_BUDGET, FixRequest, PromptError, build_prompt, estimate_tokens
from oom_lsp.profiling.oom_messages import find_ooms
from oom_lsp.profiling.report import read_report

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
ENVIRONMENT = EnvironmentFacts(
    python="3.11.9",
    torch="2.5.1+cu124",
    cuda="12.4",
    gpu_name="NVIDIA GeForce RTX 3070 Laptop GPU",
    gpu_memory=8_190_427_136,
)
SECTIONS = ["Context", "Error", "Profiling", "Diagnosis", "Solutions", "Validation", "Documentation"]


def fixture_request(name: str, **fields: object) -> FixRequest:
    path = ROOT / "fixtures" / name
    settings = ConfigResolver(fallback_root=ROOT).resolve(path).settings_for(path)
    return FixRequest(path=f"fixtures/{name}", text=path.read_text(), lint_settings=settings, **fields)


def headings(text: str) -> list[str]:
    return re.findall(r"^## (\w+)$", text, re.M)


def check_golden(name: str, text: str) -> None:
    golden = GOLDEN / f"{name}.md"
    if os.environ.get("OOM_LSP_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; rerun with OOM_LSP_UPDATE_GOLDEN=1 if intended"


def test_script_with_oom_log_and_profile_report() -> None:
    (oom,) = find_ooms((DATA / "cnn_oom.log").read_text())
    request = fixture_request(
        "cnn_cifar_risky.py", oom=oom, report=read_report(DATA / "cnn_report.json"), environment=ENVIRONMENT
    )
    prompt = build_prompt(request)
    check_golden("cnn_log_and_profile", prompt.markdown(include_system=True))
    assert headings(prompt.user) == SECTIONS
    assert prompt.tokens < TOKEN_BUDGET
    # The failing allocation is inside Net.forward; the fix belongs to the loop that called it.
    assert prompt.target_line == 102 and prompt.region_name == "module-level code"
    assert prompt.user.index("| 4.03 GiB | cnn_cifar_risky.py:107 |") < prompt.user.index("```python")
    assert "def evaluate" not in prompt.user and "class Net" not in prompt.user  # other code is left out
    assert "import torch.nn.functional as F" in prompt.user  # the imports stay
    assert "- cnn_cifar_risky.py:102 in <module>: `outputs = net(inputs)`" in prompt.user
    assert "PyTorch 2.5.1+cu124, CUDA 12.4; Python 3.11.9" in prompt.user
    assert "7.63 GiB" in prompt.user and "Batch size seen by the model: 512" in prompt.user


def test_method_with_an_estimate() -> None:
    request = fixture_request(
        "gpt_naive_attention_risky.py",
        line=46,
        estimate=Prediction.from_json(json.loads((DATA / "gpt_estimate.json").read_text())),
    )
    prompt = build_prompt(request)
    check_golden("gpt_estimate", prompt.markdown(include_system=True))
    assert headings(prompt.user) == [
        "Context",
        "Profiling",
        "Diagnosis",
        "Solutions",
        "Validation",
        "Documentation",
    ]
    assert prompt.tokens < TOKEN_BUDGET
    assert prompt.region_name == "method `CausalSelfAttention.forward`"
    assert "def generate" not in prompt.user and "class Block" not in prompt.user
    assert "(estimated)" in prompt.user and "Before the change: 30.66 GiB." in prompt.user
    assert "OOM402 naive-attention" in prompt.user
    assert "torch.autocast (bfloat16) (line 125)" in prompt.user


def test_finding_only_leaves_out_error_and_profiling() -> None:
    path = ROOT / "fixtures" / "lstm_language_model_risky.py"
    request = fixture_request("lstm_language_model_risky.py")
    from oom_lsp.analysis.engine import analyze

    finding = next(f for f in analyze(request.text, request.lint_settings, str(path)) if f.code == "OOM305")
    prompt = build_prompt(FixRequest(**{**request.__dict__, "finding": finding}))
    check_golden("lstm_finding", prompt.user)
    assert headings(prompt.user) == ["Context", "Diagnosis", "Solutions", "Validation", "Documentation"]
    assert "Start from the finding OOM305" in prompt.user
    assert "Framework" not in prompt.user and "GPU:" not in prompt.user  # nothing known, nothing said


def test_the_static_findings_are_those_of_the_project_level() -> None:
    """The prompt lists the findings the user sees: strict mode adds those whose
    memory at stake the facts do not show (the LSTM's float32 loop)."""
    from dataclasses import replace

    request = fixture_request("lstm_language_model_risky.py", line=112)
    default = build_prompt(request).user
    strict = build_prompt(
        FixRequest(**{**request.__dict__, "lint_settings": replace(request.lint_settings, strict=True)})
    ).user
    assert "OOM305 hidden-state-carried-across-batches" in default and "OOM201" not in default
    assert "- line 109 `for batch, i in enumerate(" in strict and "OOM201 no-mixed-precision" in strict


def test_json_schema_contract_in_the_system_message() -> None:
    prompt = build_prompt(fixture_request("cnn_cifar_risky.py", line=107), response_format="json_schema")
    assert '"causes"' in prompt.system and "<<<<<<< SEARCH" not in prompt.system


def test_a_huge_function_is_cut_to_a_window_around_the_line() -> None:
    body = "".join(
        f"    x{i} = torch.zeros({i}, device='cuda')  # step {i} of the long setup\n" for i in range(600)
    )
    text = f"import torch\n\n\ndef train():\n{body}    return x0\n"
    prompt = build_prompt(FixRequest(path="long.py", text=text, line=300))
    assert prompt.tokens <= TOKEN_BUDGET
    assert prompt.region.start_line <= 300 <= prompt.region.end_line
    assert prompt.region.end_line - prompt.region.start_line < 130
    assert prompt.region_name == "part of the function `train`"
    assert "x0 = torch.zeros(0" not in prompt.user


def test_profile_tables_shrink_before_the_code() -> None:
    report = read_report(DATA / "cnn_report.json")
    report.top_lines = report.top_lines * 30  # a long table
    request = fixture_request("cnn_cifar_risky.py", report=report, environment=ENVIRONMENT)
    full = build_prompt(request, budget=100_000)
    tight = build_prompt(request, budget=full.tokens - 100)
    assert tight.region == full.region  # the code is intact
    assert tight.user.count("cnn_cifar_risky.py:107 |") < full.user.count("cnn_cifar_risky.py:107 |")


def test_secrets_are_redacted_in_the_prompt() -> None:
    text = 'import torch\nimport wandb\n\n\ndef train():\n    wandb.login(key="0123456789abcdef0123")\n    x = torch.zeros(3).cuda()\n'
    prompt = build_prompt(FixRequest(path="t.py", text=text, line=7))
    assert "0123456789abcdef0123" not in prompt.user
    assert 'wandb.login(key="__REDACTED_1__")' in prompt.user
    assert prompt.secrets == {"__REDACTED_1__": "0123456789abcdef0123"}


def test_errors() -> None:
    with pytest.raises(PromptError, match="does not parse"):
        build_prompt(FixRequest(path="t.py", text="def (:\n", line=1))
    with pytest.raises(PromptError, match="no line to fix"):
        build_prompt(FixRequest(path="t.py", text="import torch\n"))
    with pytest.raises(PromptError, match=r"outside t\.py"):
        build_prompt(FixRequest(path="t.py", text="import torch\n", line=9))


def test_token_estimate_is_characters_over_four() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("abcd") == 1 and estimate_tokens("abcde") == 2
