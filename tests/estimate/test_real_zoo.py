"""The real-script zoo in CI's budget: the cases of fixtures/estimate/real/ that need nothing beyond
the test extra (torch, NumPy), each run for real until its second optimizer step (the truth:
bench/real_steps.py, no oom-lsp code in that process) and estimated by `oom-lsp estimate --device
cpu`; the estimate must be within 2 % of the real CPU peak. bench/real_zoo.py runs all twelve cases
and prints the table."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("real_zoo", ROOT / "bench" / "real_zoo.py")
assert _spec is not None and _spec.loader is not None
real_zoo = importlib.util.module_from_spec(_spec)
sys.modules["real_zoo"] = real_zoo  # its dataclasses look their module up there
_spec.loader.exec_module(real_zoo)

CASES = real_zoo.load_cases()
# The zoo's cases that need only what the test extra installs.
CI_CASES = ["word_lm_lstm", "word_lm_transformer", "nanogpt"]
# The zoo's own helpers, not scripts modelled on a public one.
ZOO_HELPERS = {"make_checkpoints.py", "prepare.py", "prepare_images.py", "zoo_cpu.py"}


def test_every_ci_case_needs_only_the_test_extra() -> None:
    for name in CI_CASES:
        assert set(CASES[name].needs) <= {"numpy"}, name


def test_every_case_runs_a_script_of_the_zoo_with_modules_of_the_bench_extra() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        bench = tomllib.load(handle)["project"]["optional-dependencies"]["bench"]
    installed = {re.split(r"[=<>!~\[ ]", requirement)[0] for requirement in bench}
    for case in CASES.values():
        assert (real_zoo.ZOO / case.folder / case.script).is_file(), case.name
        assert set(case.needs) <= installed, case.name


def test_every_zoo_script_names_the_public_source_it_follows() -> None:
    """The zoo's scripts are ours, written after public ones: each header says so and names the
    source's path and the commit read (fixtures/estimate/real/README.md)."""
    scripts = [path for path in real_zoo.ZOO.rglob("*.py") if path.name not in ZOO_HELPERS]
    assert len(scripts) >= 12
    for path in scripts:
        header = path.read_text(encoding="utf-8").split("\nimport", 1)[0]
        assert "written for oom-lsp" in header, path
        assert re.search(r"\b[0-9a-f]{40}\b", header), path
    assert not list(real_zoo.ZOO.rglob("LICENSE*")), "the zoo holds no third-party code or licence"


@pytest.mark.slow
@pytest.mark.parametrize("name", CI_CASES)
def test_estimate_within_two_percent_of_two_real_steps(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    folder = real_zoo.prepare(case, tmp_path, sys.executable)
    truth = real_zoo.real_run(case, folder, sys.executable, profile=True, timeout=300)
    assert truth["steps"] == 2
    predicted = real_zoo.estimate(case, folder, sys.executable, timeout=300)
    error = (predicted["peak_bytes"] - truth["peak_bytes"]) / truth["peak_bytes"]
    assert abs(error) <= 0.02, (
        f"{name}: estimate {predicted['peak_bytes']:,} B vs real {truth['peak_bytes']:,} B ({100 * error:+.2f} %), "
        f"peak at {predicted['peak_at']}"
    )


def test_a_case_that_fails_for_real_is_reported_with_its_reason(tmp_path: Path) -> None:
    """The truth runner says why a script did not reach its steps (here: a bad argument)."""
    case = real_zoo.Case(
        name="bad_args",
        folder="pytorch_examples",
        script="word_language_model/main.py",
        args=["--no-such-flag"],
    )
    folder = real_zoo.prepare(case, tmp_path, sys.executable)
    with pytest.raises(real_zoo.CaseError, match="sys.exit\\(2\\)"):
        real_zoo.real_run(case, folder, sys.executable, profile=False, timeout=120)
