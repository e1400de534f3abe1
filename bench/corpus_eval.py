#!/usr/bin/env python3
"""Score `oom-lsp --check` on issue 27's judged corpora: code nobody on this project tuned on.

    python bench/corpus_eval.py [--split dev|heldout|all|fresh|fresh2] [--oom-lsp PATH] [--corpus-root DIR]
                                [--verdicts FILE ...] [--corpora static,notebooks,bugs] [--repos A,B]
                                [--template OUT] [--format text|json]

The corpora are described by the manifests beside this script (`bench/corpora/static.toml`,
`notebooks.toml`, `bugs.json`); their files live outside the repository, under the corpus root
(default /work/corpus: `static/<owner>+<name>/`, `notebooks/<owner>+<name>/`, and the bugs'
`before`/`after` paths; a fresh split's repositories under `<split>/static/<owner>+<name>/` and
`<split>/notebooks/<owner>+<name>/`, e.g. `fresh2/static/...`). Each repository is checked as a folder with the rules at their defaults:
`--config` points at an empty configuration, which replaces discovery, so a repository's own
`[tool.oom-lsp]` (or a parent folder's) cannot change the measurement.

A finding is keyed by (corpus, repo, path, code, sha1 of its stripped source line, occurrence), the
occurrence counting the findings with the same first five parts in line order, so that a verdict
survives the analyzer moving its report by a few lines or the file changing elsewhere. A verdict is
`worth` (right and worth acting on at the sizes the code runs), `harmless` (true, but the memory at
stake is negligible) or `wrong` (the claim is false). Verdict files (JSON: {"verdicts": [...],
"missed": [...]}) default to bench/corpora/verdicts-dev.json for the dev half and
<corpus root>/heldout/verdicts-heldout.json for the held-out half. `--split fresh` scores the fresh
held-out split (repositories chosen after the analyzer's rework and judged blind, never tuned on), verdicts in
bench/corpora/verdicts-fresh.json; `--split fresh2` the second one (chosen once the first had been read),
verdicts in bench/corpora/verdicts-fresh2.json; `--split all` stays dev + heldout.

Printed: per corpus and code, worth / harmless / wrong / unjudged; precision =
(worth + harmless) / judged; worth share = worth / judged; wrong findings per 10k lines (code lines
for notebooks); the bugs caught (an expected code reported on the file before its fix within 3
lines of a listed line) and the fixed versions silent on that code (near the listed lines mapped
into the fixed file); the check's throughput in lines per CPU-second; every unjudged finding
(path:line CODE message) for a judge to read; one summary line last.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPORA_DIR = HERE / "corpora"
DEFAULT_ROOT = Path("/work/corpus")
VERDICTS = ("worth", "harmless", "wrong")
BUG_TOLERANCE = 3
# An empty configuration: every rule at its default. `respect-gitignore` only decides which files a
# folder walk visits; off, so that a .gitignore above the corpus root cannot drop corpus files.
PINNED_CONFIG = "respect-gitignore = false\n"


@dataclass
class Finding:
    corpus: str  # static | notebooks
    repo: str
    path: str  # relative to the repository's folder
    line: int
    column: int
    cell: int | None
    code: str
    message: str
    source: str  # the stripped source line
    occurrence: int = 0
    verdict: str = "unjudged"
    reason: str = ""

    @property
    def line_sha1(self) -> str:
        return hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def key(self) -> tuple:
        return (self.corpus, self.repo, self.path, self.code, self.line_sha1, self.occurrence)

    def where(self) -> str:
        cell = f"[cell {self.cell}]" if self.cell is not None else ""
        return f"{self.repo}/{self.path}{cell}:{self.line}"


@dataclass
class Run:
    findings: list[Finding] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    lines: int = 0
    files_checked: int = 0


def repo_folder(repo: str) -> str:
    return repo.replace("/", "+")


# Real reported bugs, each file before and after its fix: `bugs` (bugs.json), and `bugs3`
# (bugs3.json: 32 more, gathered on 2026-12-06 from GitHub issues and fix commits by a helper that
# ran no analyzer, split by sha256("owner/name") (even first hex digit: dev) before any was checked).
BUG_CORPORA = ("bugs", "bugs3")


def load_manifests(corpora_dir: Path) -> dict:
    static = tomllib.loads((corpora_dir / "static.toml").read_text())["repo"]
    notebooks = tomllib.loads((corpora_dir / "notebooks.toml").read_text())["repo"]
    found = {"static": static, "notebooks": notebooks}
    for corpus in BUG_CORPORA:
        bugs_path = corpora_dir / f"{corpus}.json"
        found[corpus] = json.loads(bugs_path.read_text()) if bugs_path.is_file() else []
    return found


# Splits that `--split all` covers; the fresh splits are scored on their own so that the earlier figures keep
# their meaning. Each fresh split keeps its files in a folder of its own name under the corpus root.
TUNED_SPLITS = ("dev", "heldout")
FRESH_SPLITS = ("fresh", "fresh2")


def in_split(entry_split: str, wanted: str) -> bool:
    return entry_split == wanted or (wanted == "all" and entry_split in TUNED_SPLITS)


def corpus_folder(root: Path, corpus: str, entry: dict) -> Path:
    """Where a manifest entry's files are: a fresh split keeps its own folder under the corpus root."""
    base = root / entry["split"] if entry["split"] in FRESH_SPLITS else root
    return base / corpus / repo_folder(entry["name"])


def run_check(exe: str, folder: Path, targets: list[str], config: Path) -> tuple[list[dict], float, float]:
    """The checker's JSON findings for `targets` (files or folders inside `folder`), its CPU seconds
    (the process and the workers it waited for) and its wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [exe, "check", "--no-cache", "--exit-zero", "--format", "json", "--config", str(config), *targets],
        cwd=folder, capture_output=True, text=True, timeout=3600,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode not in (0, 1):
        sys.exit(f"oom-lsp failed in {folder} on {' '.join(targets)[:200]} (exit {out.returncode}): {out.stderr[-600:]}")
    return json.loads(out.stdout or "[]"), cpu, wall


def count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def notebook_cells(path: Path) -> list[str]:
    """Every cell's source (1-based cell numbers index it minus one), as oom-lsp numbers cells."""
    nb = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    cells = nb.get("cells") or [c for ws in nb.get("worksheets", []) for c in ws.get("cells", [])]
    out = []
    for c in cells:
        src = c.get("source", c.get("input", ""))
        out.append("".join(src) if isinstance(src, list) else str(src))
    return out


class SourceLines:
    """The stripped source line of a finding, files read once."""

    def __init__(self) -> None:
        self._files: dict[Path, list[str]] = {}
        self._cells: dict[Path, list[str]] = {}

    def line(self, path: Path, line: int, cell: int | None) -> str:
        if cell is not None:
            if path not in self._cells:
                self._cells[path] = notebook_cells(path)
            cells = self._cells[path]
            text = cells[cell - 1] if 0 < cell <= len(cells) else ""
        else:
            if path not in self._files:
                self._files[path] = path.read_text(encoding="utf-8", errors="replace").splitlines()
            text = "\n".join(self._files[path])
        rows = text.splitlines()
        return rows[line - 1].strip() if 0 < line <= len(rows) else ""


def number_occurrences(findings: list[Finding]) -> None:
    seen: collections.Counter = collections.Counter()
    for f in sorted(findings, key=lambda f: (f.corpus, f.repo, f.path, f.cell or 0, f.line, f.column, f.code)):
        base = (f.corpus, f.repo, f.path, f.code, f.line_sha1)
        f.occurrence = seen[base]
        seen[base] += 1


def check_corpus(corpus: str, entries: list[dict], root: Path, exe: str, config: Path,
                 sources: SourceLines, warnings: list[str]) -> Run:
    run = Run()
    for entry in entries:
        folder = corpus_folder(root, corpus, entry)
        if not folder.is_dir():
            sys.exit(f"missing corpus folder {folder}: extract the repository listed in bench/corpora/{corpus}.toml")
        if corpus == "static":
            files = sorted(p for p in folder.rglob("*.py") if p.is_file())
            lines = sum(count_lines(p.read_bytes()) for p in files)
            if lines != entry["lines"] or len(files) != entry["files"]:
                warnings.append(f"{entry['name']}: {len(files)} files, {lines} lines on disk; the manifest says "
                                f"{entry['files']} files, {entry['lines']} lines")
            targets = ["."]
        else:
            files = [folder / nb["path"] for nb in entry["notebooks"]]
            absent = [str(p) for p in files if not p.is_file()]
            if absent:
                sys.exit(f"missing notebooks: {', '.join(absent[:5])}")
            lines = sum(nb["code_lines"] for nb in entry["notebooks"])
            targets = [nb["path"] for nb in entry["notebooks"]]
        raw, cpu, wall = run_check(exe, folder, targets, config)
        run.cpu_s += cpu
        run.wall_s += wall
        run.lines += lines
        run.files_checked += len(files)
        for f in raw:
            path = f["path"]
            cell = f.get("cell")
            source = sources.line(folder / path, f["line"], cell)
            run.findings.append(Finding(corpus, entry["name"], path, f["line"], f.get("column", 0), cell,
                                        f["code"], f["message"], source))
    number_occurrences(run.findings)
    return run


def load_verdicts(paths: list[Path]) -> tuple[dict[tuple, dict], list[dict]]:
    verdicts: dict[tuple, dict] = {}
    missed: list[dict] = []
    for path in paths:
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        for v in data.get("verdicts", []):
            if v.get("verdict") not in VERDICTS:
                continue  # a template row nobody has judged yet
            key = (v["corpus"], v["repo"], v["path"], v["code"], v["line_sha1"], v.get("occurrence", 0))
            verdicts[key] = v
        missed.extend(data.get("missed", []))
    return verdicts, missed


def apply_verdicts(findings: list[Finding], verdicts: dict[tuple, dict]) -> None:
    for f in findings:
        v = verdicts.get(f.key())
        if v is not None:
            f.verdict, f.reason = v["verdict"], v.get("reason", "")


def tally(findings: list[Finding], lines: int) -> dict:
    per_code: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in findings:
        per_code[f.code][f.verdict] += 1
    total = collections.Counter()
    for c in per_code.values():
        total.update(c)

    def figures(c: collections.Counter) -> dict:
        judged = sum(c[v] for v in VERDICTS)
        return {
            "worth": c["worth"], "harmless": c["harmless"], "wrong": c["wrong"], "unjudged": c["unjudged"],
            "findings": judged + c["unjudged"],
            "precision": round((c["worth"] + c["harmless"]) / judged, 3) if judged else None,
            "worth_share": round(c["worth"] / judged, 3) if judged else None,
            "wrong_per_10k_lines": round(10000 * c["wrong"] / lines, 3) if lines else None,
        }

    return {"lines": lines, "per_code": {code: figures(per_code[code]) for code in sorted(per_code)},
            "total": figures(total)}


def map_lines(before: list[str], after: list[str], lines: list[int]) -> list[int]:
    """Each 1-based line of `before` at its place in `after` (the nearest aligned line)."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    out = []
    for line in lines:
        i = line - 1
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if i1 <= i < i2 or (i1 == i2 == i):
                out.append(j1 + min(i - i1, max(j2 - j1 - 1, 0)) + 1)
                break
        else:
            out.append(min(line, len(after)))
    return out


def rule_codes_by_name(exe: str) -> dict[str, str]:
    """The code of each rule by its name (`backward-create-graph` -> OOM307), from `oom-lsp rule --all`."""
    try:
        listing = subprocess.run([exe, "rule", "--all"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {name: code for name, code in re.findall(r"^# ([a-z0-9-]+) \((OOM\d{3})\)$", listing, re.M)}


# Causes that bugs.json named before a rule covered them, where the rule that now covers the cause
# has another name: OOM306 was written for the detached GPU accumulation the bug reports describe;
# OOM501 covers a checkpoint loaded onto the GPU by a map_location that names it (same second copy
# beside the model as no map_location at all).
RULE_OF_CAUSE = {
    "detached-gpu-accumulation": "device-tensors-kept-across-iterations",
    "checkpoint-loaded-onto-gpu": "torch-load-without-map-location",
}


def expected_codes(bug: dict, codes_by_name: dict[str, str]) -> set[str]:
    """A bug's expected codes; `NEW:<cause>` (a cause named before any rule had it) is the code of the
    rule that now has that name (or was built for that cause), when one does."""
    def resolve(code: str) -> str:
        if not code.startswith("NEW:"):
            return code
        cause = code[4:]
        return codes_by_name.get(RULE_OF_CAUSE.get(cause, cause), code)

    return {resolve(code) for code in bug["expected_codes"]}


# A noted risk is found when a finding of its code is in its file within this many lines (the judge
# names the statement that starts the form; the rule reports the softmax or call a few lines on).
NOTED_RISK_TOLERANCE = 8


def noted_risk_found(risk: dict, findings: list) -> bool:
    line = risk.get("line")
    return line is not None and any(
        f.repo == risk.get("repo") and f.path == risk.get("path") and f.code == risk.get("rule")
        and abs(f.line - line) <= NOTED_RISK_TOLERANCE
        for f in findings
    )


def score_bugs(bugs: list[dict], root: Path, exe: str, config: Path) -> dict:
    rows = []
    codes_by_name = rule_codes_by_name(exe)
    for bug in bugs:
        before, after = root / bug["before"], root / bug["after"] if bug.get("after") else None
        want = expected_codes(bug, codes_by_name)
        found_before, _, _ = run_check(exe, before.parent, [before.name], config)
        near = [f for f in found_before if f["code"] in want
                and any(abs(f["line"] - line) <= BUG_TOLERANCE for line in bug["lines"])]
        row = {"id": bug["id"], "repo": bug["repo"], "split": bug["split"], "expected": sorted(want),
               "caught": bool(near), "got_before": sorted({f["code"] for f in found_before})}
        if after is not None and after.is_file():
            found_after, _, _ = run_check(exe, after.parent, [after.name], config)
            mapped = map_lines(before.read_text(errors="replace").splitlines(),
                               after.read_text(errors="replace").splitlines(), bug["lines"])
            still = [f for f in found_after if f["code"] in want
                     and any(abs(f["line"] - line) <= BUG_TOLERANCE for line in mapped)]
            row["fixed_silent"] = not still
        rows.append(row)
    with_fix = [r for r in rows if "fixed_silent" in r]
    return {"bugs": len(rows), "caught": sum(r["caught"] for r in rows),
            "fixed": len(with_fix), "fixed_silent": sum(r["fixed_silent"] for r in with_fix), "rows": rows}


def default_verdict_files(split: str, root: Path) -> list[Path]:
    files = []
    if split in ("dev", "all"):
        files.append(CORPORA_DIR / "verdicts-dev.json")
    if split in ("heldout", "all"):
        files.append(root / "heldout" / "verdicts-heldout.json")
        files.append(CORPORA_DIR / "verdicts-heldout.json")  # where the lead commits it at the end
    if split in FRESH_SPLITS:
        files.append(CORPORA_DIR / f"verdicts-{split}.json")
    return files


def write_template(findings: list[Finding], out: Path) -> None:
    """The unjudged findings as verdict rows to fill in (verdict and reason left empty)."""
    rows = [{"corpus": f.corpus, "repo": f.repo, "path": f.path, "code": f.code, "line_sha1": f.line_sha1,
             "occurrence": f.occurrence, "line": f.line, "cell": f.cell, "source": f.source,
             "message": f.message, "verdict": "", "reason": ""}
            for f in findings if f.verdict == "unjudged"]
    out.write_text(json.dumps({"verdicts": rows, "missed": []}, indent=1) + "\n")


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(title: str, t: dict, unit: str) -> None:
    print(f"\n{title} ({t['lines']:,} {unit})")
    print(f"{'code':8} {'findings':>8} {'worth':>6} {'harmless':>8} {'wrong':>6} {'unjudged':>8} "
          f"{'precision':>9} {'worth/judged':>12} {'wrong/10k':>9}")
    for code, c in [*t["per_code"].items(), ("total", t["total"])]:
        print(f"{code:8} {c['findings']:>8} {c['worth']:>6} {c['harmless']:>8} {c['wrong']:>6} {c['unjudged']:>8} "
              f"{fmt(c['precision']):>9} {fmt(c['worth_share']):>12} {fmt(c['wrong_per_10k_lines']):>9}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oom-lsp", default=shutil.which("oom-lsp") or "oom-lsp", help="the console script to measure")
    ap.add_argument("--corpus-root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--corpora-dir", type=Path, default=CORPORA_DIR, help="where the manifests are")
    ap.add_argument("--split", choices=("dev", "heldout", "all", *FRESH_SPLITS), default="dev")
    ap.add_argument("--corpora", default="static,notebooks,bugs,bugs3", help="comma-separated subset")
    ap.add_argument("--repos", help="comma-separated subset of repositories (owner/name), for a quick run")
    ap.add_argument("--verdicts", type=Path, action="append", help="verdict files (default: by split)")
    ap.add_argument("--template", type=Path, help="write the unjudged findings here as verdict rows to fill in")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args(argv)

    # The checker runs inside each repository's folder: a relative path to it must not move with it.
    if os.sep in a.oom_lsp:
        a.oom_lsp = os.path.abspath(a.oom_lsp)
    manifests = load_manifests(a.corpora_dir)
    chosen = set(a.corpora.split(","))
    repos = set(a.repos.split(",")) if a.repos else None
    verdicts, missed = load_verdicts(a.verdicts or default_verdict_files(a.split, a.corpus_root))
    sources = SourceLines()
    warnings: list[str] = []
    result: dict = {"split": a.split, "oom_lsp": a.oom_lsp, "corpora": {}}
    all_findings: list[Finding] = []
    cpu = lines = 0.0
    with tempfile.TemporaryDirectory(prefix="oom-lsp-corpus-") as tmp:
        config = Path(tmp) / "oom-lsp.toml"
        config.write_text(PINNED_CONFIG)
        for corpus in ("static", "notebooks"):
            if corpus not in chosen:
                continue
            entries = [e for e in manifests[corpus] if in_split(e["split"], a.split)
                       and (repos is None or e["name"] in repos)]
            run = check_corpus(corpus, entries, a.corpus_root, a.oom_lsp, config, sources, warnings)
            apply_verdicts(run.findings, verdicts)
            all_findings.extend(run.findings)
            cpu += run.cpu_s
            lines += run.lines
            result["corpora"][corpus] = {
                "repositories": len(entries), "files": run.files_checked, "cpu_s": round(run.cpu_s, 2),
                "wall_s": round(run.wall_s, 2),
                "lines_per_cpu_s": round(run.lines / run.cpu_s) if run.cpu_s else None,
                **tally(run.findings, run.lines),
            }
        for corpus in BUG_CORPORA:
            if corpus in chosen and manifests[corpus]:
                bugs = [b for b in manifests[corpus] if in_split(b["split"], a.split)
                        and (repos is None or b["repo"] in repos)]
                result[corpus] = score_bugs(bugs, a.corpus_root, a.oom_lsp, config)
    result["lines_per_cpu_s"] = round(lines / cpu) if cpu else None
    result["findings"] = [{**f.__dict__, "line_sha1": f.line_sha1} for f in all_findings]
    result["missed"] = [
        {**m, "found_now": noted_risk_found(m, all_findings)} for m in missed if repos is None or m.get("repo") in repos
    ]
    result["warnings"] = warnings
    if a.template:
        write_template(all_findings, a.template)

    if a.format == "json":
        print(json.dumps(result, indent=1))
        return 0
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for corpus, r in result["corpora"].items():
        unit = "lines" if corpus == "static" else "notebook code lines"
        print_table(f"{corpus}, {a.split}: {r['repositories']} repositories, {r['files']} files", r, unit)
        print(f"  check: {r['cpu_s']:.1f} CPU s, {r['wall_s']:.1f} wall s, "
              f"{r['lines_per_cpu_s'] or 0:,} lines per CPU-second")
    for corpus in BUG_CORPORA:
        if corpus not in result:
            continue
        b = result[corpus]
        print(f"\nreal bugs, {corpus} ({b['caught']}/{b['bugs']} caught, {b['fixed_silent']}/{b['fixed']} fixed versions silent):")
        for r in b["rows"]:
            silent = "" if "fixed_silent" not in r else (", fixed silent" if r["fixed_silent"] else ", FIXED STILL FLAGGED")
            print(f"  {'caught' if r['caught'] else 'MISSED'} {r['id']} ({r['repo']}): want {'/'.join(r['expected'])}, "
                  f"got {'/'.join(r['got_before']) or 'nothing'}{silent}")
    if result["missed"]:
        found = sum(m["found_now"] for m in result["missed"])
        print(f"\nrisks the judges noted as missed ({len(result['missed'])}, {found} found now):")
        for m in result["missed"]:
            state = "found now" if m["found_now"] else "MISSED"
            print(f"  {state} {m['repo']}/{m['path']}:{m.get('line', '?')} [{m.get('rule', '?')}] {m.get('reason', '')[:110]}")
    unjudged = [f for f in all_findings if f.verdict == "unjudged"]
    if unjudged:
        print(f"\nfindings nobody has judged yet ({len(unjudged)}): read each and decide")
        for f in unjudged:
            print(f"  {f.where()} {f.code} {f.message[:110]}")
    parts = [f"split={a.split}"]
    for corpus, r in result["corpora"].items():
        t = r["total"]
        parts.append(f"{corpus}: worth={t['worth']} harmless={t['harmless']} wrong={t['wrong']} "
                     f"unjudged={t['unjudged']} precision={fmt(t['precision'])} worth_share={fmt(t['worth_share'])} "
                     f"wrong_per_10k={fmt(t['wrong_per_10k_lines'])} lines={r['lines']}")
    for corpus in BUG_CORPORA:
        if corpus in result:
            b = result[corpus]
            parts.append(f"{corpus}={b['caught']}/{b['bugs']} fixed_silent={b['fixed_silent']}/{b['fixed']}")
    parts.append(f"lines_per_cpu_s={result['lines_per_cpu_s'] or 0}")
    print("\n" + " | ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
