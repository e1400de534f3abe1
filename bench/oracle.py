"""The dynamic oracle: does a finding of `oom-lsp check` matter? Its fix, measured by the estimate.

The estimate is exact on the CPU (bench/real_zoo.py), so on a script that runs, a finding can be
judged by measuring what its fix saves instead of by anyone's opinion. For each case of
bench/corpora/runnable.toml (real public training scripts and notebooks, adapted only to random
data, small configs, no downloads and a bounded number of steps; the files live outside the
repository, under --corpus), in a fresh copy of its folder that carries an empty `[tool.oom-lsp]`
table (the default rules, no project configuration):

1. `oom-lsp check --format json` on the case's Python files: the default findings;
2. the script run for real until its second optimizer step (bench/real_steps.py, under the
   profiler) and `oom-lsp estimate --device cpu --format json`: a case whose estimate is more than
   2 % off the real peak is an estimate bug, listed apart and kept out of the figures;
3. `oom-lsp estimate --what-if --device cpu --format json`: each finding of the script joined to
   the row of its quick fix (`fix:CODE:LINE:COLUMN`);
4. a finding without a quick fix (or in another file of the case) that has a hand-written fix,
   `<corpus>/<case>/fixes/<CODE>_<LINE>.patch` (a unified diff against the case's folder, `patch
   -p1`): the patch applied to another copy and that copy's what-if baseline compared.

5. a finding none of whose lines ran before the second optimizer step (an evaluation after the
   epoch: the real run lists the lines that ran, `real_steps.py --lines`), whose fix the trace
   therefore cannot show: the script run for real to its end (at most 100,000 steps, four times
   the time limit), and again with the fix applied (its quick fix's edits, or the hand-written
   patch); the two real peaks compared. A script that fails late (a missing plotting package)
   counts up to where it failed, when the fixed run fails at the same place.

6. a hand-written fix of OOM402 (`F.scaled_dot_product_attention`) is also measured by the
   estimate's CUDA prediction (`estimate --device cuda` on the copy and on the patched copy):
   on the CPU a training step's SDPA (dropout on) takes the math path, which keeps the score
   matrix the fix is meant to drop, while CUDA's flash and memory-efficient kernels keep only
   the output and a logsumexp. That saving is shown beside the CPU verdict and counted in the
   "confirmed with the GPU proxy" column, never in the CPU one (like OOM201's bf16 row).

A finding is CONFIRMED when its fix saves at least 1 % of the peak (the baseline's needed bytes,
or the whole run's real peak in 5.) or stops a per-step growth (what a third step keeps on top of
the second, halved at least); NOT CONFIRMED when the fix saves less; UNMEASURABLE when there is
no fix to measure or its row failed, or when its lines never ran even in the whole run (a resume
path) or the whole runs could not be compared.

    .venv/bin/python bench/oracle.py [--split dev|heldout|all] [--oom-lsp PATH] [--cases a,b]
        [--format text|json] [--timeout S] [--list-heldout] [--no-cache] [--split-check]

Results (and failures) are cached per (case text, arguments, oom-lsp fingerprint) in bench/.work/oracle/cache/:
a rerun of an unchanged case with the same oom-lsp code costs nothing. The fingerprint is the
hash of the installed `oom_lsp` package's files, so `--oom-lsp` of another branch gets its own.
The expensive stages are cached apart (cache/stages/) by the code they depend on, every file but
the analyzer's: after a change of the rules only `check` runs again, and the what-if only for a
case whose findings (with their fixes) changed; a hand-written fix's what-if is kept too. A case
without findings skips the what-if.
The held-out split's findings are not listed unless --list-heldout is given: the rules are tuned
on dev, and the held-out figures mean something only while nobody reads its findings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bench" / "corpora" / "runnable.toml"
REAL_STEPS = ROOT / "bench" / "real_steps.py"
CACHE = ROOT / "bench" / ".work" / "oracle" / "cache"
DEFAULT_CORPUS = Path("/work/corpus/runnable")
MIB = 2**20
CONFIRM_SHARE = 0.01  # a fix that saves at least 1 % of the peak
ESTIMATE_TOLERANCE = 0.02  # the estimate within 2 % of the real CPU peak, else an estimate bug
# Fixes that change nothing on a CPU-only torch (`autocast("cuda")` is disabled there).
GPU_ONLY_FIXES = {"OOM201"}
# Fixes whose saving comes from a GPU kernel: scaled_dot_product_attention's flash and
# memory-efficient kernels keep no score matrix, while on the CPU a training step (dropout)
# takes the math path, which keeps it. Measured on the CPU and, as a proxy, by the estimate's
# CUDA prediction (`--device cuda`, SDPA routed as CUDA runs it), both copies side by side.
GPU_KERNEL_FIXES = {"OOM402"}
CONFIRMED, NOT_CONFIRMED, UNMEASURABLE = "confirmed", "not confirmed", "unmeasurable"
# Changes to the case folder's copy that say nothing about the case.
# The same environment for the real run and the estimate: no tokenizer threads, no hub look-ups,
# matplotlib without a display.
CASE_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}
IGNORED_NAMES = {"__pycache__", ".oom_lsp_cache", ".oom_lsp", "fixes", ".ipynb_checkpoints"}


@dataclass
class Case:
    name: str
    repo: str
    commit: str
    path: str
    kind: str
    script: str
    split: str
    adaptation: str
    args: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    prepare: list[list[str]] = field(default_factory=list)
    notebook: str | None = None


class CaseError(RuntimeError):
    """A step of a case failed; the message says which and why."""


# --- the split ------------------------------------------------------------------------------------


def split_of(names: list[str]) -> dict[str, str]:
    """The split rule (bench/corpora/runnable.toml says it in words): a case is dev when the
    SHA-256 of its name, read as a number, is even, held-out when it is odd. Tiebreak: while one
    half has more than one case more than the other, the case of the larger half whose
    SHA-256 of `name + ":tiebreak"` is smallest moves to the smaller half."""

    def digest(text: str) -> int:
        return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)

    split = {name: "dev" if digest(name) % 2 == 0 else "heldout" for name in names}
    while True:
        dev = [n for n in names if split[n] == "dev"]
        held = [n for n in names if split[n] == "heldout"]
        if abs(len(dev) - len(held)) <= 1:
            return split
        larger, other = (dev, "heldout") if len(dev) > len(held) else (held, "dev")
        split[min(larger, key=lambda n: digest(n + ":tiebreak"))] = other


def load_cases(manifest: Path = MANIFEST) -> dict[str, Case]:
    with manifest.open("rb") as handle:
        data = tomllib.load(handle)
    return {entry["name"]: Case(**entry) for entry in data["case"]}


# --- processes ------------------------------------------------------------------------------------


def run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`command` in its own process group; at the timeout SIGTERM (oom-lsp then kills its
    harness's group), then SIGKILL to the whole group: nothing is left behind."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise CaseError(f"{Path(command[0]).name} {' '.join(command[1:3])} ran past {timeout:.0f} s") from None
    except BaseException:
        _stop(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _stop(process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the group may outlive its leader
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


# --- oom-lsp --------------------------------------------------------------------------------------


@dataclass
class OomLsp:
    """The console script under test, its interpreter and the fingerprint of its code."""

    script: Path
    python: str
    version: str
    fingerprint: str
    # The code the measurements depend on: everything but the analyzer (oom_lsp/analysis). A change
    # of the rules alone keeps a case's real run, estimate and (for the same findings) what-if.
    measure_fingerprint: str = ""

    @classmethod
    def at(cls, script: Path) -> OomLsp:
        script = Path(os.path.abspath(script))
        if not script.is_file():
            raise SystemExit(f"oracle: no console script at {script}")
        first = script.read_text(encoding="utf-8", errors="replace").splitlines()[0]
        python = first[2:].strip() if first.startswith("#!") else sys.executable
        where = subprocess.run(
            [python, "-c", "import oom_lsp, os; print(os.path.dirname(oom_lsp.__file__))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        version = subprocess.run([str(script), "--version"], capture_output=True, text=True).stdout.strip()
        digest = hashlib.sha256(version.encode())
        measured = hashlib.sha256(version.encode())
        for path in sorted(Path(where).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".json", ".toml", ".md"} and "__pycache__" not in path.parts:
                relative = path.relative_to(where)
                for hashed in (digest, measured) if relative.parts[0] != "analysis" else (digest,):
                    hashed.update(str(relative).encode())
                    hashed.update(path.read_bytes())
        return cls(script, python, version, digest.hexdigest()[:16], measured.hexdigest()[:16])

    def __call__(self, arguments: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        return run([str(self.script), *arguments], cwd, timeout, env=CASE_ENV)


def _json(done: subprocess.CompletedProcess, what: str):
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise CaseError(f"{what} exited with {done.returncode}: {_tail(done.stderr)}") from None
    if isinstance(result, dict) and "error" in result:
        raise CaseError(f"{what} failed: {result['error'].splitlines()[0]}")
    return result


# --- one case -------------------------------------------------------------------------------------


def case_files(folder: Path) -> list[Path]:
    """The case's files (what its text hash covers), hidden files and the fixes aside."""
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part in IGNORED_NAMES or part.startswith(".") for part in path.relative_to(folder).parts)
    )


def case_digest(case: Case, folder: Path) -> str:
    digest = hashlib.sha256(json.dumps([case.script, case.args, case.prepare]).encode())
    for path in case_files(folder) + sorted((folder / "fixes").glob("*.patch")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def fresh_copy(source: Path, target: Path, python: str, case: Case) -> Path:
    """A copy of the case's folder (without its hand-written fixes) with the default rules."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*IGNORED_NAMES))
    # An empty table: discovery stops here, so no configuration above applies, and the rules are
    # the defaults (`check` is given it with --config too).
    (target / "pyproject.toml").write_text("[tool.oom-lsp]\n", encoding="utf-8")
    for step in case.prepare:
        done = run([python, *step], target, 600)
        if done.returncode != 0:
            raise CaseError(f"prepare step {' '.join(step)} failed: {_tail(done.stderr)}")
    return target


def python_files(folder: Path) -> list[str]:
    """The case's Python files `check` reads: the published code, not the top-level prepare.py
    (written for the set: it makes the random data)."""
    return [
        str(path.relative_to(folder))
        for path in case_files(folder)
        if path.suffix == ".py" and path.relative_to(folder) != Path("prepare.py")
    ]


def check(oom: OomLsp, folder: Path, timeout: float) -> list[dict]:
    done = oom(
        ["check", *python_files(folder), "--format", "json", "--no-cache", "--exit-zero", "--no-budget",
         "--config", "pyproject.toml"],
        folder,
        timeout,
    )
    return _json(done, "check")


def _real_steps(case: Case, folder: Path, python: str, timeout: float, what: str, steps: list[str]) -> dict:
    """bench/real_steps.py on the case (under the profiler, with the lines that ran): its JSON result."""
    with tempfile.TemporaryDirectory(prefix="oom-lsp-oracle-") as tmp:
        out = Path(tmp) / "real.json"
        done = run(
            [python, str(REAL_STEPS), "--profile", "--lines", *steps, "--out", str(out), "--", case.script, *case.args],
            folder,
            timeout,
            env=CASE_ENV,
        )
        if not out.exists():
            raise CaseError(f"{what} exited with {done.returncode}: {_tail(done.stderr)}")
        return json.loads(out.read_text(encoding="utf-8"))


def real_run(case: Case, folder: Path, python: str, timeout: float) -> dict:
    """The real run's peak and the lines of the case's files that ran before it stopped."""
    result = _real_steps(case, folder, python, timeout, "the real run", [])
    if result["status"] != "stopped":
        raise CaseError(
            f"the real run {result['status']} after {result['steps']} step(s): {_tail(result['error'] or '')}"
        )
    return {"peak_bytes": result["peak_bytes"], "lines": result["lines"]}


# A case's whole run, for a finding whose code runs after the second step: at most this many
# optimizer steps (the cases are adapted to a bounded number; a script that loops for ever stops).
FULL_RUN_STEPS = 100_000


def full_run(case: Case, folder: Path, python: str, timeout: float) -> dict:
    """The real run to the script's end: its peak and the lines that ran."""
    result = _real_steps(case, folder, python, timeout, "the whole run", ["--steps", str(FULL_RUN_STEPS)])
    # A script that fails late (an import for its plotting at the end) still measured everything
    # before: kept, with where it stopped, and the fixed run must stop at the same place.
    failed = _tail(result["error"] or "", 1) if result["status"] == "failed" else None
    return {"peak_bytes": result["peak_bytes"], "lines": result["lines"], "steps": result["steps"], "failed": failed}


def apply_edits(text: str, edits: list[dict]) -> str:
    """A quick fix's edits (1-based rows and columns, as `check --format json` gives them) applied,
    the last first so that the earlier positions stay right."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(position: dict) -> int:
        return starts[position["row"] - 1] + position["column"] - 1

    for edit in sorted(edits, key=lambda e: offset(e["location"]), reverse=True):
        text = text[: offset(edit["location"])] + edit["content"] + text[offset(edit["end_location"]) :]
    return text


def whole_run_saving(
    oom: OomLsp, case: Case, source: Path, work: Path, finding: dict, checked: dict, timeout: float, cache
) -> dict | None:
    """What a finding's fix saves over the script's whole run, both runs real: for a finding whose
    code runs only after the second step (an evaluation after the epoch). None when its code does
    not run even then. The fix is its quick fix (`checked`, the finding as `check` gave it) or the
    hand-written patch."""
    whole = cache.get("full-lines", lambda: full_run(case, work / case.name, oom.python, timeout * 4))
    if not reached(finding, set(whole["lines"])):
        return None
    patch = source / "fixes" / f"{finding['code']}_{finding['line']}.patch"

    def measure() -> dict:
        folder = fresh_copy(source, work / f"{case.name}.whole-fix", oom.python, case)
        try:
            fix = checked.get("fix")
            if fix and fix.get("edits"):
                target = folder / finding["file"]
                target.write_text(apply_edits(target.read_text(encoding="utf-8"), fix["edits"]), encoding="utf-8")
            elif patch.is_file():
                done = run(["patch", "-p1", "--batch", "--forward", "-i", str(patch)], folder, 60)
                if done.returncode != 0:
                    raise CaseError(f"{patch.name} does not apply: {_tail(done.stdout + done.stderr)}")
            else:
                raise CaseError("no fix to apply")
            return full_run(case, folder, oom.python, timeout * 4)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    fixed = cache.get(f"full-fix-{finding['code']}-{finding['line']}", measure, json.dumps(checked.get("fix"), sort_keys=True))
    if (fixed["steps"], fixed["failed"]) != (whole["steps"], whole["failed"]):
        raise CaseError(
            f"the fixed whole run took another path ({fixed['steps']} steps, {fixed['failed'] or 'ended'}) "
            f"than the script's ({whole['steps']} steps, {whole['failed'] or 'ended'})"
        )
    return {"whole_run_bytes": whole["peak_bytes"], "whole_run_fixed_bytes": fixed["peak_bytes"],
            "saving_bytes": whole["peak_bytes"] - fixed["peak_bytes"], "steps": whole["steps"]}


def reached(finding: dict, lines: set[str]) -> bool:
    """Whether any line of the finding's code ran in the real run (up to its second step)."""
    file = os.path.normpath(finding["file"])
    return any(f"{file}:{line}" in lines for line in range(finding["line"], finding.get("end_line", finding["line"]) + 1))


def estimate(oom: OomLsp, case: Case, folder: Path, timeout: float, what_if: bool = False, device: str = "cpu") -> dict:
    command = ["estimate", case.script, "--device", device, "--format", "json", "--python", oom.python]
    command += ["--what-if"] if what_if else []
    command += ["--timeout", str(int(timeout)), "--", *case.args]
    # The what-if runs every change in one child, each trace with the time limit.
    return _json(oom(command, folder, timeout * (25 if what_if else 1) + 60), "what-if" if what_if else "estimate")


def _row_key(finding: dict) -> str:
    return f"fix:{finding['code']}:{finding['line']}:{finding['column']}"


def verdict_of(saving: int | None, stops_growth: bool, baseline: int) -> str:
    if saving is None:
        return UNMEASURABLE
    if stops_growth or saving >= CONFIRM_SHARE * baseline:
        return CONFIRMED
    return NOT_CONFIRMED


def hand_fix(
    oom: OomLsp, case: Case, source: Path, patch: Path, work: Path, base: dict, timeout: float
) -> dict:
    """A hand-written fix: the patch applied to another copy, and that copy's what-if baseline."""
    folder = fresh_copy(source, work / f"{case.name}.{patch.stem}", oom.python, case)
    try:
        done = run(["patch", "-p1", "--batch", "--forward", "-i", str(patch)], folder, 60)
        if done.returncode != 0:
            raise CaseError(f"{patch.name} does not apply: {_tail(done.stdout + done.stderr)}")
        table = estimate(oom, case, folder, timeout, what_if=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    after = table["baseline"]
    growth = base.get("growth_per_step")
    return {
        "needed_bytes": after["needed_bytes"],
        "saving_bytes": base["needed_bytes"] - after["needed_bytes"],
        "growth_per_step": after.get("growth_per_step"),
        "stops_growth": bool(growth and after.get("growth_per_step") is not None
                             and after["growth_per_step"] <= growth // 2),
    }


def cuda_proxy(oom: OomLsp, case: Case, source: Path, patch: Path, work: Path, timeout: float) -> dict:
    """A hand-written fix measured by the estimate's CUDA prediction: the case's copy and the
    patched copy, each `estimate --device cuda`."""
    peaks = []
    for fixed in (False, True):
        folder = fresh_copy(source, work / f"{case.name}.cuda{int(fixed)}", oom.python, case)
        try:
            if fixed:
                done = run(["patch", "-p1", "--batch", "--forward", "-i", str(patch)], folder, 60)
                if done.returncode != 0:
                    raise CaseError(f"{patch.name} does not apply: {_tail(done.stdout + done.stderr)}")
            peaks.append(estimate(oom, case, folder, timeout, device="cuda")["peak_bytes"])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return {"cuda_peak_bytes": peaks[0], "cuda_saving_bytes": peaks[0] - peaks[1]}


def missing_modules(case: Case, python: str) -> list[str]:
    """The modules of the case's `needs` that `python` cannot import."""
    if not case.needs:
        return []
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    done = subprocess.run([python, "-c", probe, *case.needs], capture_output=True, text=True, check=True)
    return done.stdout.split()


class StageCache:
    """The expensive stages of a case kept apart from the analyzer's version: the real run and the
    plain estimate by (case text, measuring code), the what-if also by the findings it fixes. A
    failure is kept too: the same text and code fail the same way."""

    def __init__(self, folder: Path | None, key: str) -> None:
        self.folder, self.key = folder, key

    def get(self, stage: str, compute, *extra: str):
        if self.folder is None:
            return compute()
        path = self.folder / f"{self.key}-{stage}-{hashlib.sha256(''.join(extra).encode()).hexdigest()[:12]}.json"
        if path.exists():
            saved = json.loads(path.read_text(encoding="utf-8"))
            if "failure" in saved:
                raise CaseError(saved["failure"])
            return saved["value"]
        try:
            value = compute()
        except CaseError as error:
            path.write_text(json.dumps({"failure": str(error)}), encoding="utf-8")
            raise
        path.write_text(json.dumps({"value": value}), encoding="utf-8")
        return value


def run_case(oom: OomLsp, case: Case, corpus: Path, work: Path, timeout: float,
             stages: Path | None = None) -> dict:
    source = corpus / case.name
    if not source.is_dir():
        raise CaseError(f"no folder {source}")
    folder = fresh_copy(source, work / case.name, oom.python, case)
    cache = StageCache(stages, f"{case.name}-{case_digest(case, source)}-{oom.measure_fingerprint}")
    started = time.perf_counter()
    result: dict = {"case": case.name, "split": case.split, "kind": case.kind, "repo": case.repo}
    # The truth first: a case that does not run, or whose estimate fails, is never checked.
    truth = cache.get("real-lines", lambda: real_run(case, folder, oom.python, timeout))
    real, ran = truth["peak_bytes"], set(truth["lines"])
    plain = cache.get("estimate", lambda: estimate(oom, case, folder, timeout))
    findings = check(oom, folder, timeout)
    error = (plain["peak_bytes"] - real) / real
    result.update(real_bytes=real, estimate_bytes=plain["peak_bytes"], estimate_error=error)
    if abs(error) > ESTIMATE_TOLERANCE:
        result["estimate_bug"] = (
            f"estimate {plain['peak_bytes'] / MIB:.2f} MiB against {real / MIB:.2f} MiB for real ({100 * error:+.2f} %)"
        )
        result["findings"] = [_bare(f, folder) for f in findings]
        result["seconds"] = time.perf_counter() - started
        return result
    if not findings:  # nothing to judge: the what-if's rows would join no finding
        result.update(findings=[], seconds=time.perf_counter() - started)
        return result
    fixed = json.dumps([[_bare(f, folder), f.get("fix")] for f in findings], sort_keys=True)
    table = cache.get("whatif", lambda: estimate(oom, case, folder, timeout, what_if=True), fixed)
    base = table["baseline"]
    rows = {row["key"]: row for row in table["changes"]}
    result.update(
        baseline_bytes=base["needed_bytes"],
        growth_per_step=base.get("growth_per_step"),
        rows_failed=[{"title": r["title"], "error": r["error"]} for r in table["changes"] if r.get("error")],
        knobs={r["key"]: r.get("saving_bytes") for r in table["changes"] if r["key"].startswith("knob:")},
        together={r["key"]: {"saving_bytes": r.get("saving_bytes"), "stops_growth": r.get("stops_growth")}
                  for r in table["changes"] if r["key"].startswith("fixes:")},
    )
    joined = []
    script = os.path.normpath(case.script)
    for finding in findings:
        entry = _bare(finding, folder)
        in_script = os.path.normpath(entry["file"]) == script
        row = rows.get(_row_key(finding)) if in_script else None
        patch = source / "fixes" / f"{finding['code']}_{finding['line']}.patch"
        if row is not None and not row.get("error"):
            entry.update(how="quick fix", saving_bytes=row["saving_bytes"], stops_growth=bool(row.get("stops_growth")))
        elif patch.is_file():
            try:
                # Like the other stages, by the case's files (the patch among them) and the
                # measuring code: a change of the rules does not measure it again.
                measured = cache.get(
                    f"hand-{patch.stem}", lambda: hand_fix(oom, case, source, patch, work, base, timeout)
                )
                entry.update(how=f"hand-written fix {patch.name}", **measured)
                if finding["code"] in GPU_KERNEL_FIXES:
                    entry.update(cache.get(
                        f"cuda-{patch.stem}", lambda: cuda_proxy(oom, case, source, patch, work, timeout)
                    ))
            except CaseError as problem:
                entry.update(how=f"hand-written fix {patch.name}", why=f"not measured: {problem}")
        elif row is not None:
            entry.update(how="quick fix", why=f"its row failed: {row['error']}")
        elif finding.get("fix") and in_script:
            entry.update(how="quick fix", why="the what-if has no row for its fix")
        elif finding.get("fix"):
            entry.update(how="quick fix", why="in a module of the case, not the script the what-if fixes")
        else:
            entry.update(how=None, why="no quick fix and no hand-written fix")
        saving = entry.get("saving_bytes")
        entry["verdict"] = verdict_of(saving, entry.get("stops_growth", False), base["needed_bytes"])
        entry["reached"] = reached(entry, ran)
        if entry["verdict"] == NOT_CONFIRMED and not entry["reached"]:
            # Its code runs later (an evaluation after the epoch, a resume path): the two steps
            # the real run and the trace take cannot show what its fix does. The script's whole
            # run can, measured for real with and without the fix.
            entry["verdict"] = UNMEASURABLE
            entry["why"] = "its code did not run before the second optimizer step, where the run and the trace stop"
            try:
                whole = whole_run_saving(oom, case, source, work, entry, finding, timeout, cache)
            except CaseError as problem:
                entry["why"] += f"; the whole run: {problem}"
                whole = None
            if whole is not None:
                entry.update(how=f"{entry['how']}, whole real runs", **whole)
                entry["verdict"] = verdict_of(whole["saving_bytes"], False, whole["whole_run_bytes"])
                entry.pop("why", None)
                entry["saving_share"] = whole["saving_bytes"] / whole["whole_run_bytes"]
                joined.append(entry)
                continue
        if saving is not None:
            entry["saving_share"] = saving / base["needed_bytes"]
        joined.append(entry)
    result["findings"] = joined
    result["seconds"] = time.perf_counter() - started
    return result


def _bare(finding: dict, folder: Path) -> dict:
    path = Path(finding["path"])
    file = os.path.relpath(path if path.is_absolute() else folder / path, folder)
    return {
        "file": file,
        "line": finding["line"],
        "end_line": finding.get("end_line", finding["line"]),
        "column": finding["column"],
        "code": finding["code"],
        "message": finding["message"],
        "fixable": finding.get("fix") is not None,
    }


# --- the report -----------------------------------------------------------------------------------


def tally(results: list[dict]) -> dict[str, dict[str, int]]:
    """Per code (and "total"): findings, confirmed, not confirmed, unmeasurable."""
    counts: dict[str, dict[str, int]] = {}
    for result in results:
        if "estimate_bug" in result:
            continue
        for finding in result["findings"]:
            for key in (finding["code"], "total"):
                entry = counts.setdefault(key, {"findings": 0, CONFIRMED: 0, NOT_CONFIRMED: 0, UNMEASURABLE: 0})
                entry["findings"] += 1
                entry[finding["verdict"]] += 1
                proxy = gpu_proxy(result, finding)
                entry.setdefault("confirmed with the GPU proxy", 0)
                entry["confirmed with the GPU proxy"] += finding["verdict"] == CONFIRMED or (
                    proxy is not None and proxy[0] >= CONFIRM_SHARE * proxy[1]
                )
    return dict(sorted(counts.items(), key=lambda item: (item[0] == "total", item[0])))


def gpu_proxy(result: dict, finding: dict) -> tuple[int, int] | None:
    """(saving, the peak it is a share of) on a GPU, for the fixes a CPU cannot show. OOM201's
    codemod writes autocast("cuda"), which a CPU-only torch disables: on the CPU its saving is 0
    by construction; the what-if's bf16 row (the same autocast around the forward, traced on the
    CPU) is what it would save on a GPU. OOM402's fix: the estimate's CUDA prediction with and
    without it (GPU_KERNEL_FIXES). Shown beside the verdict, counted apart."""
    if finding["code"] in GPU_ONLY_FIXES:
        saving = result.get("knobs", {}).get("knob:bf16")
        return None if saving is None else (saving, result["baseline_bytes"])
    if finding["code"] in GPU_KERNEL_FIXES and finding.get("cuda_saving_bytes") is not None:
        return finding["cuda_saving_bytes"], finding["cuda_peak_bytes"]
    return None


def share(entry: dict[str, int]) -> float | None:
    return entry[CONFIRMED] / entry["findings"] if entry["findings"] else None


def _size(value: int | None) -> str:
    if value is None:
        return "—"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("GiB", 2**30), ("MiB", MIB), ("KiB", 1024)):
        if value >= scale:
            return f"{sign}{value / scale:.2f} {unit}"
    return f"{sign}{value} B"


def print_report(report: dict, list_heldout: bool) -> None:
    for split, part in report["splits"].items():
        results = part["results"]
        measured = [r for r in results if "estimate_bug" not in r]
        print(f"\n== {split}: {len(results) + len(part['failures'])} cases: {len(measured)} measured, "
              f"{sum(1 for r in results if 'estimate_bug' in r)} estimate bugs (more than 2 % off the real run), "
              f"{len(part['failures'])} failed")
        print(f"{'code':<8} {'findings':>8} {'confirmed':>9} {'not conf.':>9} {'unmeas.':>8} {'confirmed share':>16}")
        for code, entry in part["tally"].items():
            value = share(entry)
            print(
                f"{code:<8} {entry['findings']:>8} {entry[CONFIRMED]:>9} {entry[NOT_CONFIRMED]:>9} "
                f"{entry[UNMEASURABLE]:>8} {'—' if value is None else f'{100 * value:.0f} %':>16}"
            )
        if split == "heldout" and not list_heldout:
            print("(held-out findings not listed: --list-heldout)")
        else:
            print("\nevery finding (saving of its fix, share of the peak):")
            for result in measured:
                for f in result["findings"]:
                    saving = f.get("saving_bytes")
                    measure = (
                        f"{_size(saving)} ({100 * f['saving_share']:.1f} %)"
                        + (", stops the growth" if f.get("stops_growth") else "")
                        if saving is not None
                        else f.get("why", "")
                    )
                    proxy = gpu_proxy(result, f)
                    if proxy is not None:
                        how = "the bf16 row" if f["code"] in GPU_ONLY_FIXES else "the CUDA prediction"
                        measure += f"; on a GPU ({how}): {_size(proxy[0])} ({100 * proxy[0] / proxy[1]:.1f} %)"
                    print(f"  {f['verdict']:<13} {result['case']}/{f['file']}:{f['line']} {f['code']}  {measure}"
                          + (f"  [{f['how']}]" if f.get("how") and f["how"] != "quick fix" else ""))
            for result in measured:
                for key, row in sorted(result.get("together", {}).items()):
                    if row.get("saving_bytes") is not None:
                        print(f"  together      {result['case']}: {key} saves {_size(row['saving_bytes'])} "
                              f"({100 * row['saving_bytes'] / result['baseline_bytes']:.1f} %)"
                              + (", stops the growth" if row.get("stops_growth") else ""))
        for result in results:
            if "estimate_bug" in result:
                print(f"  ESTIMATE BUG {result['case']}: {result['estimate_bug']}")
            for row in result.get("rows_failed", []):
                print(f"  what-if row failed in {result['case']}: {row['title']}: {row['error'][:200]}")
        for name, why in part["failures"].items():
            print(f"  FAILED {name}: {why}")
    print()
    for split, part in report["splits"].items():
        total = part["tally"].get("total", {"findings": 0, CONFIRMED: 0, NOT_CONFIRMED: 0, UNMEASURABLE: 0})
        value = share(total)
        proxied = total.get("confirmed with the GPU proxy", total[CONFIRMED])
        if proxied != total[CONFIRMED]:
            print(f"oracle {split}: counting OOM201 by the bf16 row and OOM402 by the CUDA prediction "
                  f"(what their fixes save on a GPU): {proxied} of {total['findings']} confirmed")
        print(
            f"oracle {split}: {total[CONFIRMED]} of {total['findings']} default findings confirmed "
            f"({'—' if value is None else f'{100 * value:.0f} %'}), {total[NOT_CONFIRMED]} not confirmed, "
            f"{total[UNMEASURABLE]} unmeasurable; {len(part['results']) + len(part['failures'])} cases, "
            f"{sum(1 for r in part['results'] if 'estimate_bug' not in r)} measured "
            f"({report['oom_lsp']['version']}, {report['oom_lsp']['fingerprint']})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["dev", "heldout", "all"], default="all")
    parser.add_argument("--oom-lsp", type=Path, default=ROOT / ".venv" / "bin" / "oom-lsp",
                        help="the console script to judge (default: this checkout's .venv)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the cases' folders")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--cases", help="comma-separated case names (default: every case of the split)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per trace (and per step of a case)")
    parser.add_argument("--work", type=Path, default=None, help="where the copies go (default: a temporary folder)")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--list-heldout", action="store_true", help="also list the held-out findings")
    parser.add_argument("--no-cache", action="store_true", help="measure again, ignoring the cache")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"the cache folder (default: {CACHE.relative_to(ROOT)})")
    parser.add_argument("--split-check", action="store_true",
                        help="check that the manifest's splits follow the rule, and stop")
    options = parser.parse_args()
    # SIGTERM and SIGHUP unwind like Ctrl-C, so the case running stops its process group first.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, frame: sys.exit(128 + number))
    cases = load_cases(options.manifest)
    expected = split_of(sorted(cases))
    wrong = [name for name, case in cases.items() if case.split != expected[name]]
    if wrong:
        print(f"oracle: the manifest's split does not follow its rule for: {', '.join(wrong)}", file=sys.stderr)
        return 2
    if options.split_check:
        halves = {s: sum(1 for c in cases.values() if c.split == s) for s in ("dev", "heldout")}
        print(f"split follows the rule: {halves['dev']} dev, {halves['heldout']} held-out")
        return 0
    oom = OomLsp.at(options.oom_lsp)
    names = options.cases.split(",") if options.cases else sorted(cases)
    unknown = [name for name in names if name not in cases]
    if unknown:
        print(f"oracle: no such case: {', '.join(unknown)}", file=sys.stderr)
        return 2
    splits = ["dev", "heldout"] if options.split == "all" else [options.split]
    report = {"oom_lsp": {"script": str(oom.script), "version": oom.version, "fingerprint": oom.fingerprint},
              "splits": {}}
    (options.cache / "stages").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oom-lsp-oracle-") as tmp:
        work = options.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for split in splits:
            results, failures = [], {}
            for name in names:
                case = cases[name]
                if case.split != split:
                    continue
                source = options.corpus / name
                missing = missing_modules(case, oom.python)
                if missing:  # not cached: installing them changes the answer
                    failures[name] = f"{oom.python} lacks {', '.join(missing)} (the case's `needs`)"
                    continue
                key = f"{name}-{case_digest(case, source) if source.is_dir() else 'missing'}-{oom.fingerprint}"
                cached = options.cache / f"{key}.json"
                if cached.exists() and not options.no_cache:
                    saved = json.loads(cached.read_text(encoding="utf-8"))
                    if "failure" in saved:
                        failures[name] = saved["failure"]
                    else:
                        results.append(saved)
                    continue
                print(f"{name}...", file=sys.stderr, flush=True)
                try:
                    result = run_case(oom, case, options.corpus, work, options.timeout,
                                      None if options.no_cache else options.cache / "stages")
                except CaseError as error:
                    # A failure is a result too (the same text and oom-lsp fail the same way).
                    failures[name] = str(error)
                    cached.write_text(json.dumps({"case": name, "failure": str(error)}), encoding="utf-8")
                    continue
                finally:
                    if options.work is None:
                        shutil.rmtree(work / name, ignore_errors=True)
                cached.write_text(json.dumps(result, indent=1), encoding="utf-8")
                results.append(result)
            report["splits"][split] = {"results": results, "failures": failures, "tally": tally(results)}
    if options.format == "json":
        if not options.list_heldout and "heldout" in report["splits"]:
            for result in report["splits"]["heldout"]["results"]:
                result.pop("findings", None)
        print(json.dumps(report, indent=1))
    else:
        print_report(report, options.list_heldout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
