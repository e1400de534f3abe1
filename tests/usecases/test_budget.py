"""The memory budget gate of `oom-lsp check` (oom_lsp/usecases/budget.py), through the
installed console script as CI runs it: over the budget or grown against the baseline is
exit 1 with a finding on the batch-size line in every format; a budget the gate cannot
answer (no script, a missing one, a crash, a timeout, a missing baseline) is one line and
exit 2, with the lint findings still reported; Ctrl-C leaves no process behind."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from oom_lsp.estimate.results import BatchKnob, Prediction
from oom_lsp.units import format_bytes
from oom_lsp.usecases.budget import knob_location, read_baseline
from tests import console
from tests.estimate.factories import prediction

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCRIPT = FIXTURES / "budget" / "train_mlp.py"
PACKAGE = Path(__file__).resolve().parents[2] / "oom_lsp"

RUNNING = "oom-lsp check: budget gate: running "  # the line before each script runs
# The console script's interpreter (its shebang): the default --python of the gate.
_PYTHON = Path(console.OOM_LSP).read_text().splitlines()[0].removeprefix("#!").strip()
# A file with one lint finding (OOM501, shown by default: Llama 2 7B's weights), to see
# that the lint part of the run still reports.
RISKY = (
    "import torch, transformers\n"
    'model = transformers.AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf").cuda()\n'
    'model.load_state_dict(torch.load("m.pt"))\n'
)


def _batch_size_position(path: Path) -> tuple[int, int]:
    """1-based line and column of the `32` of `add_argument("--batch-size", ..., default=32)`."""
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if '"--batch-size"' in text:
            return number, text.index("default=32") + len("default=") + 1
    raise AssertionError("no --batch-size line")


@pytest.fixture
def project(tmp_path: Path, user_config) -> Path:
    """A project the user trusts (its estimate-scripts run: test_trust below for one not)."""
    shutil.copy(SCRIPT, tmp_path / "train.py")
    user_config(trusted=[tmp_path])
    return tmp_path


def _config(project: Path, text: str) -> None:
    (project / "pyproject.toml").write_text("[tool.oom-lsp]\n" + text)


def _run(project: Path, *args: str, timeout: float = 300):
    return console.run(["check", *args], project, timeout=timeout)


def _needs_torch() -> None:
    pytest.importorskip("torch")


# --- Over and under the budget ---------------------------------------------------------------


@pytest.mark.parametrize("output", ["sarif", "github"])
def test_over_the_budget_fails_with_an_annotation_on_the_batch_size_line(project, output):
    _needs_torch()
    # A model 32x wider: parameters, gradients and AdamW's two moments pass 1 GiB.
    result = _run(
        project,
        "train.py",
        "--budget",
        "1GiB",
        "--estimate-script",
        "train.py --width 8192",
        "--format",
        output,
    )
    assert result.returncode == 1, result.stderr
    line, column = _batch_size_position(project / "train.py")
    if output == "github":
        (annotation,) = result.stdout.splitlines()
        assert annotation.startswith(
            f"::error file=train.py,line={line},col={column},endLine={line},endColumn={column + 2},title=OOM100::"
            "Predicted peak "
        ), annotation
        assert "at batch 32 exceeds the budget 1 GiB (train.py --width 8192)" in annotation
    else:
        run = json.loads(result.stdout)["runs"][0]
        (finding,) = run["results"]
        assert finding["ruleId"] == "OOM100" and finding["level"] == "error"
        assert run["tool"]["driver"]["rules"][finding["ruleIndex"]]["name"] == "predicted-out-of-memory"
        place = finding["locations"][0]["physicalLocation"]
        assert place["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
        assert (place["region"]["startLine"], place["region"]["startColumn"]) == (line, column)
        assert "exceeds the budget 1 GiB" in finding["message"]["text"]


def test_over_the_budget_in_text_json_and_full(project):
    _needs_torch()
    common = ["train.py", "--budget", "1GiB", "--estimate-script", "train.py --width 8192"]
    line, column = _batch_size_position(project / "train.py")
    text = _run(project, *common)
    assert text.returncode == 1, text.stderr
    first = text.stdout.splitlines()[0]
    assert first.startswith(f"train.py:{line}:{column}: OOM100 Predicted peak "), first
    assert "Found 1 error." in text.stdout
    assert "Memory budget: train.py --width 8192: predicted peak" in text.stdout
    assert ", over the budget 1 GiB (" in text.stdout
    records = json.loads(_run(project, *common, "--format", "json").stdout)
    assert [(r["code"], r["name"], r["path"], r["line"], r["column"]) for r in records] == [
        ("OOM100", "predicted-out-of-memory", "train.py", line, column)
    ]
    full = _run(project, *common, "--format", "full")
    assert full.returncode == 1
    assert 'parser.add_argument("--batch-size", type=int, default=32)' in full.stdout  # the code frame


def test_under_the_budget_passes_and_says_so(project):
    _needs_torch()
    result = _run(project, "--budget", "1GiB", "--estimate-script", "train.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "All checks passed!"
    assert lines[1].startswith("Memory budget: train.py: predicted peak ")
    assert "at batch 32, within the budget 1 GiB (" in lines[1]
    quiet = _run(project, "--budget", "1GiB", "--estimate-script", "train.py", "-q")
    assert (quiet.returncode, quiet.stdout) == (0, "")
    github = _run(project, "--budget", "1GiB", "--estimate-script", "train.py", "--format", "github")
    assert (github.returncode, github.stdout) == (0, "")
    # Off a terminal no progress line: the script about to run, and nothing with -q.
    running = f"oom-lsp check: budget gate: running train.py with {_PYTHON}\n"
    assert (result.stderr, github.stderr, quiet.stderr) == (running, running, "")


def test_a_terminal_shows_the_estimate_s_progress_line(project):
    _needs_torch()
    code, out, screen = console.run_on_a_terminal(
        ["check", "--budget", "1GiB", "--estimate-script", "train.py --epochs 2"], project
    )
    assert code == 0, screen
    assert "\rbudget gate: train.py --epochs 2: starting Python and importing torch" in screen
    assert "2/2 optimizer steps" in screen
    assert "Memory budget: train.py --epochs 2: predicted peak" in out


def test_a_budget_from_the_configuration_alone(project):
    _needs_torch()
    _config(project, 'budget = "1GiB"\nestimate-scripts = ["train.py --width 8192 --epochs 2"]\n')
    (project / "risky.py").write_text(RISKY)
    result = _run(project, "--format", "json")
    assert result.returncode == 1, result.stderr
    codes = sorted((record["code"], record["path"]) for record in json.loads(result.stdout))
    assert codes == [("OOM100", "train.py"), ("OOM501", "risky.py")]
    # The script's arguments are the entry's; the budget of the command line wins over the key.
    roomy = _run(project, "--budget", "8GiB")
    assert roomy.returncode == 1  # OOM501 alone
    assert "OOM100" not in roomy.stdout
    assert "Memory budget: train.py --width 8192 --epochs 2: predicted peak" in roomy.stdout
    assert "within the budget 8 GiB" in roomy.stdout
    skipped = _run(project, "--no-budget")
    assert skipped.returncode == 1 and "Memory budget" not in skipped.stdout


# --- The baseline --------------------------------------------------------------------------------


def test_growth_against_the_baseline_fails_and_the_baseline_is_written_and_read(project):
    _needs_torch()
    _config(project, 'estimate-scripts = ["train.py"]\nbudget-baseline = "memory/baseline.json"\n')
    written = _run(project, "--update-baseline")
    assert written.returncode == 0, written.stderr
    assert "Wrote the baseline memory/baseline.json (1 script)." in written.stdout
    records = read_baseline(project / "memory" / "baseline.json")
    assert list(records) == ["train.py"]
    peak = records["train.py"]["peak_bytes"]
    assert records["train.py"]["batch_size"] == 32

    same = _run(project)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "+0.0% against the baseline" in same.stdout and "(allowed 5%)" in same.stdout

    # A pull request widens the model: the same entry now predicts a larger peak.
    script = project / "train.py"
    script.write_text(
        script.read_text().replace('"--width", type=int, default=256', '"--width", type=int, default=2048')
    )
    grown = _run(project, "--format", "concise")
    assert grown.returncode == 1, grown.stderr
    line, column = _batch_size_position(script)
    finding = grown.stdout.splitlines()[0]
    assert finding.startswith(f"train.py:{line}:{column}: OOM103 Predicted peak "), finding
    assert f"over the baseline {format_bytes(peak, short=True)}, limit 5% (train.py)" in finding
    assert "tensors unchanged" not in finding  # the tensors grew: the pull request did it
    # A larger allowance lets it through; the baseline itself is unchanged by a check.
    assert _run(project, "--max-growth", "1000%").returncode == 0
    assert read_baseline(project / "memory" / "baseline.json")["train.py"]["peak_bytes"] == peak

    refreshed = _run(project, "--update-baseline")
    assert refreshed.returncode == 0
    assert read_baseline(project / "memory" / "baseline.json")["train.py"]["peak_bytes"] > peak
    assert _run(project).returncode == 0


def test_growth_outside_the_tensors_is_named(project):
    """A baseline written before an upgrade that changed a term outside the tensors (here its
    peak lowered by a tenth, its allocated peak as now): the finding says the tensors did not grow."""
    _needs_torch()
    _config(project, 'estimate-scripts = ["train.py"]\nbudget-baseline = "baseline.json"\n')
    assert _run(project, "--update-baseline").returncode == 0
    baseline = json.loads((project / "baseline.json").read_text())
    baseline["scripts"]["train.py"]["peak_bytes"] = baseline["scripts"]["train.py"]["peak_bytes"] * 9 // 10
    (project / "baseline.json").write_text(json.dumps(baseline))
    grown = _run(project, "--format", "concise")
    assert grown.returncode == 1, grown.stderr
    finding = grown.stdout.splitlines()[0]
    assert "OOM103" in finding and "limit 5%, tensors unchanged (train.py)" in finding, finding


def test_a_script_not_in_the_baseline_is_only_checked_against_the_budget(project):
    _needs_torch()
    (project / "baseline.json").write_text(json.dumps({"scripts": {"other.py": {"peak_bytes": 1}}}))
    result = _run(project, "--budget", "1GiB", "--baseline", "baseline.json", "--estimate-script", "train.py")
    assert result.returncode == 0, result.stderr
    assert "; not in the baseline yet." in result.stdout


# --- What the gate cannot answer: one line, exit 2 ------------------------------------------------


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(RUNNING)]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_a_budget_without_scripts_is_one_line_and_the_lint_still_reports(project):
    _config(project, 'budget = "24GiB"\n')
    (project / "risky.py").write_text(RISKY)
    result = _run(project, "risky.py")
    assert result.returncode == 2
    assert _one_error_line(result.stderr) == (
        "error: budget gate: no script to estimate: name them in estimate-scripts in pyproject.toml "
        '(estimate-scripts = ["train.py --epochs 1"]) or with --estimate-script'
    )
    assert result.stdout.startswith("risky.py:3:23: OOM501 ")


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (
            ["--budget", "lots"],
            "",
            'error: --budget: expected a size such as "24GiB", "24 GB" or "24000MiB", got \'lots\'',
        ),
        (
            [],
            'budget = "24 furlongs"\n',
            (
                'error: pyproject.toml: [tool.oom-lsp] budget: expected a size such as "24GiB", "24 GB" or '
                "\"24000MiB\", got '24 furlongs'"
            ),
        ),
        (
            [],
            'budget = "24GiB"\nestimate-scripts = ["train.py \'--epochs 1"]\n',
            (
                "error: pyproject.toml: [tool.oom-lsp] estimate-scripts[0]: No closing quotation "
                '("train.py \'--epochs 1")'
            ),
        ),
        (
            ["--budget", "1GiB", "--max-growth", "some"],
            "",
            "error: --max-growth: expected a percentage such as 5 or \"5%\", got 'some'",
        ),
        (
            ["--update-baseline", "--estimate-script", "train.py"],
            "",
            "error: --update-baseline: give the file with --baseline FILE or budget-baseline in [tool.oom-lsp]",
        ),
        (["--no-budget", "--budget", "1GiB"], "", "error: --no-budget cannot be combined with --budget"),
    ],
    ids=["cli-size", "config-size", "config-quotes", "growth", "update-without-file", "no-budget-and-budget"],
)
def test_a_value_the_gate_cannot_use_stops_before_anything_runs(project, args, config, message):
    if config:
        _config(project, config)
    (project / "risky.py").write_text(RISKY)
    result = _run(project, "risky.py", *args)
    assert result.returncode == 2
    assert _one_error_line(result.stderr) == message
    assert result.stdout == ""


def test_a_missing_script_is_one_line_and_the_other_scripts_are_still_estimated(project):
    _needs_torch()
    _config(
        project, 'budget = "1GiB"\nestimate-scripts = ["nosuch.py --epochs 1", "train.py --width 8192"]\n'
    )
    result = _run(project, "train.py")
    assert result.returncode == 2
    assert (
        _one_error_line(result.stderr) == "error: budget gate: nosuch.py --epochs 1: nosuch.py: no such file"
    )
    assert result.stdout.startswith("train.py:")  # the other script's OOM100 is reported
    assert "OOM100" in result.stdout.splitlines()[0]


def test_a_script_that_crashes_is_one_line_not_a_pass(project):
    _needs_torch()
    shutil.copy(FIXTURES / "estimate" / "crashes.py", project)
    result = _run(project, "train.py", "--budget", "24GiB", "--estimate-script", "crashes.py")
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert line.startswith(
        "error: budget gate: crashes.py: the script crashed at crashes.py:8: RuntimeError: "
    ), line
    assert result.stdout == "No findings, but the memory budget gate met 1 problem.\n"


def test_a_script_that_times_out_is_one_line_not_a_pass(project):
    _needs_torch()
    shutil.copy(FIXTURES / "estimate" / "hangs.py", project)
    result = _run(
        project, "train.py", "--budget", "24GiB", "--estimate-script", "hangs.py", "--estimate-timeout", "10"
    )
    assert result.returncode == 2
    assert _one_error_line(result.stderr) == (
        "error: budget gate: hangs.py: the script did not reach its second optimizer step within 10 s "
        "(killed with its whole process group); raise --timeout, or check that it trains"
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no such file; write it with --update-baseline"),
        (
            "{not json",
            "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        (
            '{"scripts": {"train.py": {"peak_bytes": "big"}}}',
            'expected {"scripts": {"<entry>": {"peak_bytes": ',
        ),
    ],
    ids=["missing", "not-json", "bad-shape"],
)
def test_a_baseline_that_cannot_be_read_is_one_line(project, content, reason):
    if content is not None:
        (project / "baseline.json").write_text(content)
    (project / "risky.py").write_text(RISKY)
    result = _run(project, "risky.py", "--baseline", "baseline.json", "--estimate-script", "train.py")
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert line.startswith(f"error: budget gate: baseline baseline.json: {reason}"), line
    assert result.stdout.startswith("risky.py:3:23: OOM501 ")


def test_the_gate_does_not_run_on_stdin_or_with_diff(project):
    _config(project, 'budget = "1GiB"\nestimate-scripts = ["train.py"]\n')
    piped = subprocess.run(
        [console.OOM_LSP, "check", "-", "--stdin-filename", "risky.py"],
        cwd=project,
        input=RISKY,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 1 and "Memory budget" not in piped.stdout
    explicit = _run(project, "--diff", "--budget", "1GiB")
    assert explicit.returncode == 2
    assert _one_error_line(explicit.stderr) == (
        "error: --budget: the budget gate does not run with stdin or --diff"
    )


def test_the_pre_commit_hooks_skip_the_gate(project):
    from pre_commit.clientlib import load_manifest

    _config(project, 'budget = "1GiB"\nestimate-scripts = ["nosuch.py"]\n')
    for hook in load_manifest(str(PACKAGE.parent / ".pre-commit-hooks.yaml")):
        command, *args = hook["entry"].split()
        assert command == "oom-lsp"
        result = console.run([*args, "train.py"], project)
        assert (result.returncode, result.stderr) == (0, ""), hook["id"]


# --- Ctrl-C ---------------------------------------------------------------------------------------------


@pytest.mark.serial  # a signal mid-run: the serial pass
def test_ctrl_c_during_the_gate_kills_the_script_and_all_it_started(tmp_path):
    _needs_torch()
    _, record = console.write_hanging_script(tmp_path)
    args = ["--check", "--budget", "24GiB", "--estimate-script", "train.py"]
    with console.started(args, tmp_path, record) as (process, script_pids):
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("oom-lsp check: interrupted by SIGINT; killed process group "), err
        console.assert_all_gone(script_pids, console.killed_groups(err))


# --- The parts ------------------------------------------------------------------------------------------


def _knobs(knobs: list[dict]) -> Prediction:
    return prediction(batch_knobs=[BatchKnob.from_json(knob) for knob in knobs], batch_size=64)


def test_the_finding_sits_on_the_knob_in_the_script_first(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nBATCH = 64\nloader = make(batch_size=BATCH)\n")
    helper = tmp_path / "config.py"
    helper.write_text("batch_size = 64\n")
    knobs = [
        {"kind": "module global", "file": str(helper), "line": 1},
        {"kind": "DataLoader(batch_size=...)", "file": str(script), "line": 3},
        {"kind": "gone", "file": str(tmp_path / "deleted.py"), "line": 9},
    ]
    file, where = knob_location(_knobs(knobs), script)
    assert (file, where.start.line, where.start.column, where.end.column) == (script, 3, 0, 31)
    file, where = knob_location(_knobs(knobs[:1]), script)
    assert (file, where.start.line, where.start.column, where.end.column) == (helper, 1, 13, 15)
    file, where = knob_location(_knobs([]), script)
    assert (file, where.start.line, where.start.column) == (script, 1, 0)


def test_the_language_server_never_imports_the_gate():
    offenders = []
    for path in sorted((PACKAGE / "server").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{alias.name}" for alias in node.names]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            offenders += [f"{path.name}: {name}" for name in names if "budget" in name]
    assert offenders == []


# --- Trust: a project's configuration runs nothing unless the user says so ---------------------------


def test_an_untrusted_projects_scripts_do_not_run_and_the_line_says_how_to_allow_them(
    tmp_path: Path, user_config
) -> None:
    """A cloned repository's pyproject.toml names a script that leaves a marker: `--check`
    (what its README and every CI run do) must not run it; one line says what was asked and
    how to allow it, exit 2 (the gate did not answer), the lint findings still reported."""
    user_config(trusted=[tmp_path / "elsewhere"])
    project = tmp_path / "clone"
    project.mkdir()
    marker = tmp_path / "ran"
    (project / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (project / "risky.py").write_text(RISKY)
    _config(project, 'budget = "24GiB"\nestimate-scripts = ["evil.py --epochs 1"]\n')
    result = _run(project)
    assert result.returncode == 2
    assert not marker.exists()
    assert _one_error_line(result.stderr) == (
        "error: budget gate: pyproject.toml asks to run its estimate-scripts (evil.py --epochs 1), the "
        f"project's own code: not run, since {project} is not in your trusted-projects. Name the script "
        "yourself (--estimate-script 'evil.py --epochs 1'), trust the project (trusted-projects = "
        f'["{project}"] in {Path(os.environ["XDG_CONFIG_HOME"]) / "oom-lsp" / "config.toml"}), or skip the '
        "gate (--no-budget)"
    )
    assert result.stdout.startswith("risky.py:3:23: OOM501 ")
    # A budget on the command line is a number, not consent to run the configuration's scripts.
    assert _run(project, "--budget", "48GiB").returncode == 2 and not marker.exists()
    assert _run(project, "--no-budget").returncode == 1 and not marker.exists()


def test_trusted_projects_and_named_scripts_run(tmp_path: Path, user_config) -> None:
    _needs_torch()
    project = tmp_path / "mine"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    _config(project, 'budget = "8GiB"\nestimate-scripts = ["train.py --epochs 1"]\n')
    user_config()
    named = _run(project, "--estimate-script", "train.py --epochs 1")
    assert named.returncode == 0, named.stderr
    assert named.stderr == f"{RUNNING}train.py --epochs 1 with {_PYTHON}\n"
    user_config(trusted=[project])
    trusted = _run(project)
    assert trusted.returncode == 0, trusted.stderr
    assert "Memory budget: train.py --epochs 1: predicted peak" in trusted.stdout


def test_a_baseline_outside_the_project_is_refused(project) -> None:
    _config(project, 'budget = "1GiB"\nestimate-scripts = ["train.py"]\nbudget-baseline = "../baseline.json"\n')
    result = _run(project, "--update-baseline")
    assert result.returncode == 2
    assert _one_error_line(result.stderr) == (
        f"error: pyproject.toml: budget-baseline ../baseline.json is outside the project {project}; "
        "set it to a path inside it (or pass --baseline FILE)"
    )
    assert not (project.parent / "baseline.json").exists()
