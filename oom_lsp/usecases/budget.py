"""The CI memory budget gate of `oom-lsp check`: `--budget 24GiB` (or `budget` in
`[tool.oom-lsp]`) estimates each script of `estimate-scripts` as `oom-lsp estimate` does
(device cuda, the budget as the target memory, in the user's interpreter) and reports, on
the line where the script sets its batch size:

- OOM100 when the predicted peak exceeds the budget;
- OOM103 when it grew more than `--max-growth` percent against the baseline file.

The predicted peak is what the estimate keeps under its margin: on CUDA the modelled
reserved memory plus the CUDA context, as nvidia-smi counts the process
(Prediction.needed_bytes); each script goes through the estimate use case
(oom_lsp.usecases.estimate), and the CLI passes the display of its progress. The baseline is
JSON, each script's peak keyed by its entry as written (`"train.py --epochs 1"`);
`--update-baseline` writes it.

What stops the gate from answering (no script to estimate, a missing script, a crash, a
timeout, an unreadable baseline) is a `problem`: one line, exit 2, and the lint findings of
the same run are still reported. No torch import here: the scripts run under `python` in
child processes, killed with their process group on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oom_lsp import safe_files
from oom_lsp.analysis.findings import Finding, Severity
from oom_lsp.analysis.registry import PREDICTED_MEMORY_GROWTH, PREDICTED_OUT_OF_MEMORY
from oom_lsp.analysis.rule import MESSAGE_LIMIT
from oom_lsp.config import ProjectConfig, split_command
from oom_lsp.edits import Position, Range
from oom_lsp.estimate.results import Prediction
from oom_lsp.units import short_bytes

if TYPE_CHECKING:
    from oom_lsp.usecases.estimate import Listener

DEFAULT_MAX_GROWTH = 5.0  # percent
DEFAULT_TIMEOUT = 300.0  # seconds per script, as `oom-lsp estimate --timeout`
BASELINE_VERSION = 1
_ENTRY_IN_MESSAGE = 32  # characters of a script's entry quoted in a finding's message


class BudgetError(Exception):
    """A value of the gate's flags or keys that cannot be used: exit 2 before anything runs."""


@dataclass(frozen=True)
class ScriptEntry:
    entry: str  # as written in estimate-scripts: the script's key in the baseline
    script: Path  # absolute
    args: tuple[str, ...]
    cwd: Path  # where the script runs: the folder its path is relative to


@dataclass(frozen=True)
class GateSettings:
    budget: int | None  # bytes; None: only the growth against the baseline is checked
    scripts: tuple[ScriptEntry, ...]
    baseline: Path | None
    max_growth: float  # percent
    update_baseline: bool
    timeout: float
    python: str
    scripts_origin: str  # where the scripts were named, for messages
    # The project no symbolic link may lead the baseline out of, when it is written.
    baseline_root: Path | None = None
    # Why the scripts are not run: the configuration of a project the user does not trust
    # names them (docs/configuration.md#trust). One line, a problem of the gate.
    refused: str | None = None


@dataclass
class ScriptOutcome:
    entry: ScriptEntry
    prediction: Prediction | None = None
    peak: int | None = None  # bytes: Prediction.needed_bytes
    baseline_peak: int | None = None
    growth: float | None = None  # percent against the baseline
    finding_file: Path | None = None
    findings: list[Finding] = field(default_factory=list)
    problem: str | None = None


@dataclass
class GateOutcome:
    settings: GateSettings
    scripts: list[ScriptOutcome]
    problems: list[str]  # one line each: exit 2
    baseline_written: int | None = None  # scripts written with --update-baseline

    @property
    def located(self) -> list[tuple[Path, Finding]]:
        return [
            (outcome.finding_file, finding)
            for outcome in self.scripts
            if outcome.finding_file is not None
            for finding in outcome.findings
        ]


# --- Settings ---------------------------------------------------------------------------


def gate_settings(
    config: ProjectConfig,
    *,
    budget: str | None = None,
    scripts: list[str] | None = None,
    baseline: str | None = None,
    max_growth: str | None = None,
    update_baseline: bool = False,
    timeout: float | None = None,
    python: str,
    trusted: bool = False,
) -> GateSettings | None:
    """The gate's settings from the command line over `config`; None when neither a budget
    nor a baseline asks for it. Raises BudgetError for a value that cannot be used.

    The trust rule: the scripts of `estimate-scripts` run only when the user trusts the
    project (`trusted`: its folder is in the user's own `trusted-projects`); otherwise the
    settings say why they are not run (`refused`). Scripts named on the command line
    (`scripts`, from --estimate-script) are the user's own choice and always run."""
    from oom_lsp.config import parse_memory_size, parse_percent

    cwd = Path.cwd()
    budget_bytes = config.budget
    if budget is not None:
        try:
            budget_bytes = parse_memory_size(budget)
        except (TypeError, ValueError) as error:
            raise BudgetError(f"--budget: {error}") from None
    baseline_path = None
    baseline_root: Path | None = cwd
    if baseline is not None:
        baseline_path = cwd / baseline
    elif config.budget_baseline is not None:
        baseline_path, baseline_root = config.root / config.budget_baseline, config.root
        if not safe_files.is_inside(baseline_path, config.root):
            where = os.path.relpath(config.path) if config.path is not None else "[tool.oom-lsp]"
            raise BudgetError(
                f"{where}: budget-baseline {config.budget_baseline} is outside the project {config.root}; "
                "set it to a path inside it (or pass --baseline FILE)"
            )
    if budget_bytes is None and baseline_path is None and not update_baseline:
        return None
    if update_baseline and baseline_path is None:
        raise BudgetError(
            "--update-baseline: give the file with --baseline FILE or budget-baseline in [tool.oom-lsp]"
        )
    growth = config.budget_max_growth if config.budget_max_growth is not None else DEFAULT_MAX_GROWTH
    if max_growth is not None:
        try:
            growth = parse_percent(max_growth)
        except (TypeError, ValueError) as error:
            raise BudgetError(f"--max-growth: {error}") from None
    if timeout is not None and not timeout > 0:
        raise BudgetError(f"--estimate-timeout: expected a positive number of seconds, got {timeout:g}")
    refused = None
    if scripts:
        entries, folder, origin = scripts, cwd, "--estimate-script"
    else:
        where = os.path.relpath(config.path) if config.path is not None else "[tool.oom-lsp]"
        entries, folder, origin = list(config.estimate_scripts), config.root, f"estimate-scripts in {where}"
        if entries and config.path is not None and not trusted:
            refused = untrusted_scripts_message(where, entries, config.root)
    parsed = []
    for entry in entries:
        try:
            words = split_command(entry)
        except ValueError as error:
            raise BudgetError(f"{origin}: {error} ({entry!r})") from None
        script = Path(os.path.abspath(folder / words[0]))
        parsed.append(ScriptEntry(entry.strip(), script, tuple(words[1:]), folder))
    return GateSettings(
        budget=budget_bytes,
        scripts=tuple(parsed),
        baseline=baseline_path,
        max_growth=growth,
        update_baseline=update_baseline,
        timeout=timeout if timeout is not None else (config.estimate_timeout or DEFAULT_TIMEOUT),
        python=python,
        scripts_origin=origin,
        baseline_root=baseline_root,
        refused=refused,
    )


def untrusted_scripts_message(where: str, entries: list[str], root: Path) -> str:
    """One line: what the configuration asks to run, that it did not, and how to allow it."""
    from oom_lsp.config import user_config_path

    listed = ", ".join(entries[:2]) + (f" and {len(entries) - 2} more" if len(entries) > 2 else "")
    return (
        f"budget gate: {where} asks to run its estimate-scripts ({listed}), the project's own code: "
        f"not run, since {root} is not in your trusted-projects. Name the script yourself "
        f"(--estimate-script {shlex.quote(entries[0])}), trust the project (trusted-projects = "
        f'["{root}"] in {user_config_path()}), or skip the gate (--no-budget)'
    )


# --- Baseline ---------------------------------------------------------------------------


def _shown(path: Path) -> str:
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def read_baseline(path: Path) -> dict[str, dict[str, Any]]:
    """Each entry's record ({"peak_bytes": ...}); raises ValueError with the reason."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError("no such file; write it with --update-baseline") from None
    except OSError as error:
        raise ValueError(f"cannot read it: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    scripts = data.get("scripts") if isinstance(data, dict) else None
    if not isinstance(scripts, dict) or not all(
        isinstance(record, dict) and _byte_count(record.get("peak_bytes")) is not None
        for record in scripts.values()
    ):
        raise ValueError('expected {"scripts": {"<entry>": {"peak_bytes": <bytes>, ...}, ...}}')
    return scripts


def write_baseline(path: Path, records: dict[str, dict[str, Any]], root: Path | None = None) -> None:
    """`root`: the project no symbolic link may lead the file out of (oom_lsp.safe_files)."""
    document = {
        "version": BASELINE_VERSION,
        "comment": "Predicted peak GPU memory per script (reserved + CUDA context), written by "
        "`oom-lsp check --update-baseline`; --max-growth is checked against it.",
        "scripts": dict(sorted(records.items())),
    }
    safe_files.write_file(path, json.dumps(document, indent=2) + "\n", root=root)


# --- Locating the finding -------------------------------------------------------------------


def knob_location(prediction: Prediction, script: Path) -> tuple[Path, Range]:
    """Where the script sets its batch size (the estimate's batch knob, in the script itself
    first): the batch-size literal on that line when it is written there, else the line's
    code; the script's first line when the estimate found no knob."""
    knobs = [
        knob.place
        for knob in prediction.batch_knobs
        if knob.place.file and isinstance(knob.place.line, int) and Path(knob.place.file).is_file()
    ]
    knobs.sort(key=lambda place: Path(place.file or "").resolve() != script.resolve())
    if not knobs:
        return script, Range(Position(1, 0), Position(1, 0))
    file, line = Path(knobs[0].file or ""), int(knobs[0].line or 1)
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    batch = prediction.batch_size
    literal = re.search(rf"(?<![\w.]){batch}(?![\w.])", text) if isinstance(batch, int) else None
    if literal:
        return file, Range(Position(line, literal.start()), Position(line, literal.end()))
    code = text.rstrip()
    start = len(code) - len(code.lstrip())
    return file, Range(Position(line, start), Position(line, len(code)))


def _quoted(entry: str, room: int = _ENTRY_IN_MESSAGE) -> str:
    return entry if len(entry) <= room else entry[: room - 3] + "..."


def over_budget_message(peak: int, batch: int | None, budget: int, entry: str) -> str:
    at_batch = f" at batch {batch}" if batch else ""
    return (
        f"Predicted peak {short_bytes(peak)}{at_batch} exceeds the budget {short_bytes(budget)} "
        f"({_quoted(entry)})"
    )


def growth_message(
    peak: int, baseline: int, growth: float, allowed: float, entry: str, tensors_unchanged: bool = False
) -> str:
    # When the script's own tensors peak where they did, what grew is a term the estimate adds
    # around them (the CUDA context, the allocator's segments): an upgrade of oom-lsp, torch or
    # CUDA, not the pull request. The message says so; the rule's docs say what to do.
    unchanged = ", tensors unchanged" if tensors_unchanged else ""
    said = (
        f"Predicted peak {short_bytes(peak)} grew {growth:.1f}% over the baseline {short_bytes(baseline)}, "
        f"limit {allowed:g}%{unchanged}"
    )
    # The entry gets what the one-line limit leaves, at most the usual share, and never less
    # than that share minus the clause.
    left = MESSAGE_LIMIT - 1 - len(said) - len(" ()")
    room = min(_ENTRY_IN_MESSAGE, max(left, _ENTRY_IN_MESSAGE - len(unchanged)))
    return f"{said} ({_quoted(entry, room)})"


def tensors_unchanged(record: dict[str, Any], allocated: int) -> bool:
    """Whether the baseline's allocated peak (the tensors alone) is the one predicted now, within
    a tenth of a percent; False when the baseline does not record it."""
    before = _byte_count(record.get("allocated_bytes"))
    return before is not None and abs(allocated - before) <= before / 1000


def _byte_count(value: object) -> int | None:
    """A baseline's byte count: a positive int (JSON's true/false are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _finding(rule: Any, message: str, where: Range) -> Finding:
    return Finding(
        code=rule.code,
        name=rule.name,
        message=message,
        range=where,
        severity=Severity.ERROR,
        statement_line=where.start.line,
    )


# --- Running ------------------------------------------------------------------------------------


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "the estimate failed"


# The face's progress while one script is estimated: a context manager giving the use case's Listener.
Display = Callable[["ScriptEntry"], AbstractContextManager["Listener"]]


def _estimate(settings: GateSettings, entry: ScriptEntry, display: Display) -> Prediction:
    """The prediction for one script (the estimate use case, as `oom-lsp estimate` runs it);
    raises EstimateError or EstimateInputError."""
    from oom_lsp.estimate.gpus import custom_gpu
    from oom_lsp.estimate.results import EstimateResult
    from oom_lsp.usecases.estimate import EstimateRequest, run_estimate

    request = EstimateRequest(
        script=entry.script,
        script_args=list(entry.args),
        device="cuda",
        gpu=custom_gpu(settings.budget) if settings.budget is not None else None,
        python=settings.python,
        timeout=settings.timeout,
        cwd=entry.cwd,
        compare_with_what_if=False,
    )
    with display(entry) as listener:
        result = run_estimate(request, listener)
    assert isinstance(result, EstimateResult)  # one world size
    return result.prediction


def run_gate(settings: GateSettings, display: Display) -> GateOutcome:
    """Estimate every script; each one's findings, problems and the baseline's update.
    `display(entry)`: the face's progress while a script is estimated."""
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.notebooks import is_notebook_path
    from oom_lsp.usecases.estimate import EstimateInputError

    outcome = GateOutcome(settings, [], [])
    if settings.refused is not None:
        outcome.problems.append(settings.refused)
        return outcome
    baseline: dict[str, dict[str, Any]] = {}
    if settings.baseline is not None:
        try:
            baseline = read_baseline(settings.baseline)
        except ValueError as error:
            if not settings.update_baseline:  # else it is written afresh
                outcome.problems.append(f"budget gate: baseline {_shown(settings.baseline)}: {error}")
                return outcome
    if not settings.scripts:
        outcome.problems.append(
            f"budget gate: no script to estimate: name them in {settings.scripts_origin} "
            '(estimate-scripts = ["train.py --epochs 1"]) or with --estimate-script'
        )
        return outcome
    for entry in settings.scripts:
        result = ScriptOutcome(entry)
        outcome.scripts.append(result)
        if not entry.script.is_file():
            what = "a folder, not a script" if entry.script.is_dir() else "no such file"
            result.problem = f"budget gate: {entry.entry}: {_shown(entry.script)}: {what}"
        elif is_notebook_path(str(entry.script)):
            result.problem = (
                f"budget gate: {entry.entry}: notebooks are not estimated by the gate; export it to a script"
            )
        else:
            try:
                result.prediction = _estimate(settings, entry, display)
            except (EstimateError, EstimateInputError) as error:
                result.problem = f"budget gate: {entry.entry}: {_first_line(str(error))}"
        if result.problem is not None:
            outcome.problems.append(result.problem)
            continue
        prediction = result.prediction
        assert prediction is not None
        result.peak = prediction.needed_bytes
        result.finding_file, where = knob_location(prediction, entry.script)
        if settings.budget is not None and result.peak > settings.budget:
            message = over_budget_message(result.peak, prediction.batch_size, settings.budget, entry.entry)
            result.findings.append(_finding(PREDICTED_OUT_OF_MEMORY, message, where))
        record = baseline.get(entry.entry)
        if record is not None:
            result.baseline_peak = record["peak_bytes"]
            result.growth = 100 * (result.peak - result.baseline_peak) / result.baseline_peak
            if not settings.update_baseline and result.growth > settings.max_growth:
                message = growth_message(
                    result.peak,
                    result.baseline_peak,
                    result.growth,
                    settings.max_growth,
                    entry.entry,
                    tensors_unchanged(record, prediction.peak_bytes),
                )
                result.findings.append(_finding(PREDICTED_MEMORY_GROWTH, message, where))
    if settings.update_baseline and settings.baseline is not None:
        _update_baseline(settings.baseline, baseline, outcome, settings.baseline_root)
    return outcome


def _update_baseline(
    path: Path, old: dict[str, dict[str, Any]], outcome: GateOutcome, root: Path | None
) -> None:
    """Every script estimated now, with its new peak; a script that failed keeps its old
    record; scripts no longer listed are dropped."""
    records: dict[str, dict[str, Any]] = {}
    for result in outcome.scripts:
        if result.prediction is not None and result.peak is not None:
            records[result.entry.entry] = {
                "peak_bytes": result.peak,
                "allocated_bytes": result.prediction.peak_bytes,
                "batch_size": result.prediction.batch_size,
                "torch": result.prediction.torch,
            }
        elif result.entry.entry in old:
            records[result.entry.entry] = old[result.entry.entry]
    try:
        write_baseline(path, records, root)
    except OSError as error:
        outcome.problems.append(
            f"budget gate: cannot write the baseline {_shown(path)}: {error.strerror or error}"
        )
        return
    outcome.baseline_written = len(records)


# --- Summary -----------------------------------------------------------------------------------


def summary(outcome: GateOutcome) -> str:
    """One line per script estimated, for the human formats' summary."""
    settings = outcome.settings
    lines = []
    for result in outcome.scripts:
        if result.peak is None or result.prediction is None:
            continue
        batch = result.prediction.batch_size
        words = f"predicted peak {short_bytes(result.peak)}" + (f" at batch {batch}" if batch else "")
        if settings.budget is not None:
            share = f"{100 * result.peak / settings.budget:.0f}%"
            state = "over" if result.peak > settings.budget else "within"
            words += f", {state} the budget {short_bytes(settings.budget)} ({share})"
        if result.growth is not None and result.baseline_peak is not None:
            words += f"; {result.growth:+.1f}% against the baseline {short_bytes(result.baseline_peak)}"
            if not settings.update_baseline:
                words += f" (allowed {settings.max_growth:g}%)"
        elif settings.baseline is not None and not settings.update_baseline:
            words += "; not in the baseline yet"
        lines.append(f"Memory budget: {result.entry.entry}: {words}.")
    if outcome.baseline_written is not None and settings.baseline is not None:
        count = outcome.baseline_written
        lines.append(
            f"Wrote the baseline {_shown(settings.baseline)} ({count} script{'' if count == 1 else 's'})."
        )
    return "".join(line + "\n" for line in lines)
