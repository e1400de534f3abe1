"""Running the analysis over files: discovery, decoding, the results cache,
the process pool and fixing. The CLI's engine room; no output formatting.

- Discovery walks folders for the files `include` / `extend-include` match
  (`*.py`, `*.pyi` and `*.ipynb` by default), skipping the configured
  `exclude` / `extend-exclude` globs and what `.gitignore` files ignore.
  Files named explicitly are checked unless `force_exclude`.
- Reading follows Python's own rules (PEP 263 coding cookie, BOM); a file
  Python could not compile (NUL bytes, undecodable bytes) is reported as
  OOM000 like any syntax error, and the run goes on. A notebook is UTF-8
  JSON (`oom_lsp.notebooks`); one that is not nbformat 4 is an error for that
  file, which is left untouched.
- The cache (`.oom_lsp_cache/<version>/<settings fingerprint>.json` under
  each project root) maps a file to its findings, keyed by a hash of its
  content, the settings' fingerprint and the tool version.
- Enough pending work goes to a spawn-safe process pool; a few small files
  are analysed in-process, since each worker pays the libcst import (~1 s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import tokenize
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oom_lsp
from oom_lsp import python_ast, safe_files
from oom_lsp.analysis import registry
from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.config import ConfigResolver, GlobPattern, ProjectConfig
from oom_lsp.edits import Position, Range
from oom_lsp.gc_tuning import tune_for_analysis
from oom_lsp.notebooks import is_notebook_path
from oom_lsp.notebooks.document import NotebookError, decode_notebook_bytes
from oom_lsp.units import short_bytes

CACHE_DIR_NAME = ".oom_lsp_cache"
# Pending source bytes below which a process pool costs more than it saves.
# Measured on 2 shared cores: 34 training scripts (110 KB, 3,100 lines) take
# 1.2-1.8 s in-process and 1.5-6.5 s with 2 spawned workers (each pays ~0.3 s
# CPU of imports plus spawn and IPC); below ~300 KB (~8,000 lines) one
# process wins.
POOL_MIN_BYTES = 300_000
POOL_MIN_FILES = 4


# --- Results ---------------------------------------------------------------------------


@dataclass
class FileResult:
    path: Path  # the file on disk (for stdin: the --stdin-filename or "-")
    display: str  # how output names it
    findings: list[Finding] = field(default_factory=list)
    # The text the findings refer to (after fixing, the fixed text); kept
    # only for files with findings or changes (code frames, diffs).
    source: str | None = None
    original: str | None = None  # the text before fixing, when fixes changed it
    fixes_applied: int = 0  # findings the fixes removed: sum(fixed_codes.values())
    fixed_codes: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # the file could not be read at all
    # The analysis itself failed on this file: a bug in oom-lsp, exit code 2.
    internal_error: str | None = None
    from_cache: bool = False
    # Not checked, and no error: a symbolic link that leads out of the project.
    notice: str | None = None

    @property
    def changed(self) -> bool:
        return self.original is not None and self.source is not None and self.original != self.source


@dataclass
class CheckRun:
    results: list[FileResult]
    analyzed: int = 0  # files analysed in this run
    cached: int = 0  # files answered from the cache


# --- Discovery -----------------------------------------------------------------------------


def display_path(path: Path) -> str:
    """Relative to the current folder when below it, else as given."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith("..") else relative


@dataclass(frozen=True)
class _IgnoreRule:
    pattern: GlobPattern
    negated: bool
    directory_only: bool


class GitIgnore:
    """The patterns of one `.gitignore` (or `.git/info/exclude`), relative to
    its folder: git's semantics for `!`, trailing `/`, leading or inner `/`
    (anchored), `*`, `?`, `[...]` and `**`; the last matching line wins."""

    def __init__(self, folder: Path, lines: Iterable[str]) -> None:
        self.folder = folder
        self.rules: list[_IgnoreRule] = []
        for raw in lines:
            line = raw.rstrip("\n").rstrip("\r")
            if not line or line.startswith("#"):
                continue
            line = re.sub(r"(?<!\\)\s+$", "", line)
            negated = line.startswith("!")
            if negated:
                line = line[1:]
            if line.startswith(("\\#", "\\!")):
                line = line[1:]
            directory_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            # Anchored when a slash appears before the end; otherwise the name
            # matches at any depth, which GlobPattern does for slash-free globs.
            anchored = "/" in line
            glob = line.lstrip("/") if anchored else line
            if anchored and "/" not in glob:
                glob = "./" + glob  # keep `/build` anchored to this folder
            self.rules.append(_IgnoreRule(GlobPattern(glob), negated, directory_only))

    @classmethod
    def load(cls, file: Path, folder: Path | None = None) -> GitIgnore | None:
        """The rules of `file`, relative to `folder` (default: the file's own)."""
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        ignore = cls(folder or file.parent, text.splitlines())
        return ignore if ignore.rules else None

    def verdict(self, path: Path, is_dir: bool) -> bool | None:
        """True: ignored, False: re-included, None: no line matches."""
        relative = os.path.relpath(path, self.folder).replace(os.sep, "/")
        if relative.startswith(".."):
            return None
        for rule in reversed(self.rules):
            if rule.directory_only and not is_dir:
                continue
            if rule.pattern.matches(relative):
                return not rule.negated
        return None


def _is_ignored(ignores: list[GitIgnore], path: Path, is_dir: bool) -> bool:
    # A deeper .gitignore takes precedence over its parents'.
    for ignore in reversed(ignores):
        verdict = ignore.verdict(path, is_dir)
        if verdict is not None:
            return verdict
    return False


def _git_root(folder: Path) -> Path | None:
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def _ancestor_ignores(folder: Path) -> list[GitIgnore]:
    """The ignore files that apply above `folder`, outermost first, up to the
    git work tree's root (none when `folder` is not inside a work tree)."""
    git_root = _git_root(folder)
    if git_root is None:
        return []
    ignores: list[GitIgnore] = []
    info_exclude = GitIgnore.load(git_root / ".git" / "info" / "exclude", git_root)
    if info_exclude is not None:
        ignores.append(info_exclude)
    chain = [folder, *folder.parents]
    for ancestor in reversed(chain[1 : chain.index(git_root) + 1]):
        loaded = GitIgnore.load(ancestor / ".gitignore")
        if loaded is not None:
            ignores.append(loaded)
    return ignores


def _force_excluded(path: Path, config: ProjectConfig) -> bool:
    """`exclude` applied to an explicitly named file: the file or any folder
    between it and the project root."""
    absolute = Path(os.path.abspath(path))
    candidates = [absolute]
    for parent in absolute.parents:
        if parent == config.root or config.root not in parent.parents:
            break
        candidates.append(parent)
    return any(config.is_excluded(candidate) for candidate in candidates)


def _link_out_of_project(path: Path, config: ProjectConfig, walked: Path | None) -> FileResult | None:
    """A notice for a file that is a symbolic link leading out of its project (its
    configuration's folder, or the folder being checked): a cloned repository's link to
    `~/.bashrc` or `/dev/zero` is neither read nor, with --fix, written."""
    if not os.path.islink(path):
        return None
    boundaries = [config.root] + ([walked] if walked is not None else [])
    if any(safe_files.resolves_inside(path, boundary) for boundary in boundaries):
        return None
    target = os.path.realpath(path)
    return FileResult(
        path, display_path(path), notice=f"not checked: a symbolic link to {target}, outside the project"
    )


def discover_files(
    paths: Iterable[Path],
    resolver: ConfigResolver,
    *,
    force_exclude: bool = False,
) -> tuple[list[Path], list[FileResult]]:
    """Python files to check under `paths`, sorted, and a FileResult with an
    error for each path that does not exist (or a notice for each link out of the
    project, which is not checked)."""
    found: dict[str, Path] = {}
    missing: list[FileResult] = []
    for path in paths:
        absolute = Path(os.path.abspath(path))
        if absolute.is_dir():
            config = resolver.resolve_folder(absolute)
            if force_exclude and _force_excluded(absolute, config):
                continue
            ignores = _ancestor_ignores(absolute) if config.respect_gitignore else []
            for file in _walk(absolute, resolver, ignores, missing, absolute):
                found.setdefault(str(file), file)
        elif absolute.is_file():
            config = resolver.resolve(absolute)
            if force_exclude and _force_excluded(absolute, config):
                continue
            outside = _link_out_of_project(absolute, config, None)
            if outside is not None:
                outside.display = display_path(path)
                missing.append(outside)
                continue
            found.setdefault(str(absolute), absolute)
        else:
            missing.append(FileResult(absolute, display_path(path), error="No such file or directory"))
    return sorted(found.values()), missing


def _walk(
    folder: Path,
    resolver: ConfigResolver,
    ignores: list[GitIgnore],
    unreadable: list[FileResult],
    walked: Path,
) -> Iterator[Path]:
    """The Python files below `folder` (the walk of `walked`); a folder that cannot be
    listed is added to `unreadable` (reported like an unreadable file), and so is a link
    out of the project, and the walk goes on."""
    config = resolver.resolve_folder(folder)
    if config.respect_gitignore:
        own = GitIgnore.load(folder / ".gitignore")
        if own is not None:
            ignores = [*ignores, own]
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as error:
        reason = error.strerror or str(error)
        unreadable.append(FileResult(folder, display_path(folder), error=f"cannot list the folder: {reason}"))
        return
    for entry in entries:
        path = Path(entry.path)
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file()
        except OSError:
            continue
        if not (is_dir or (is_file and config.is_included(path))):
            continue
        if config.is_excluded(path):
            continue
        if config.respect_gitignore and ignores and _is_ignored(ignores, path, is_dir):
            continue
        if is_dir:
            yield from _walk(path, resolver, ignores, unreadable, walked)
            continue
        outside = _link_out_of_project(path, config, walked)
        if outside is not None:
            unreadable.append(outside)
        else:
            yield path


# --- Reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    text: str | None
    encoding: str = "utf-8"
    # When Python could not compile the bytes: (line, column, message).
    problem: tuple[int, int, str] | None = None


def _position_of(raw: bytes, offset: int) -> tuple[int, int]:
    line = raw.count(b"\n", 0, offset) + 1
    line_start = raw.rfind(b"\n", 0, offset) + 1
    return line, len(raw[line_start:offset].decode("utf-8", errors="replace"))


def decode_source(raw: bytes) -> Decoded:
    """Source text as Python reads it: BOM and coding cookie honoured, NUL
    bytes and undecodable bytes reported with their position."""
    nul = raw.find(b"\x00")
    if nul != -1:
        line, column = _position_of(raw, nul)
        return Decoded(None, problem=(line, column, "source code cannot contain null bytes"))
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as error:
        if "unknown encoding" in str(error):
            # A codec a package registers when it is imported (`# -*- coding: future_fstrings -*-`):
            # such codecs rewrite UTF-8 source, and Python reads the file once the package is there.
            try:
                return Decoded(raw.decode("utf-8"), "utf-8")
            except UnicodeDecodeError:
                return Decoded(None, problem=(1, 0, str(error)))
        if "encoding problem" in str(error):
            return Decoded(None, problem=(1, 0, str(error)))
        # No cookie and the first lines are not UTF-8: decoding below locates
        # the bad byte, as Python's own message does.
        encoding = "utf-8"
    try:
        return Decoded(raw.decode(encoding), encoding)
    except UnicodeDecodeError as error:
        line, column = _position_of(raw, error.start)
        reason = f"(unicode error) '{error.encoding}' codec can't decode byte 0x{raw[error.start]:02x}: {error.reason}"
        return Decoded(None, encoding, problem=(line, column, reason))


def undecodable_finding(problem: tuple[int, int, str], settings: LintSettings) -> list[Finding]:
    """OOM000, as for a syntax error: Python rejects such a file the same way."""
    meta = registry.INVALID_SYNTAX
    if meta.code not in settings.enabled:
        return []
    line, column, message = problem
    start = Position(line, column)
    return [
        Finding(
            code=meta.code,
            name=meta.name,
            message=f"SyntaxError: {message}",
            range=Range(start, Position(line, column + 1)),
            severity=settings.severity_of(meta.code, meta.default_severity),
            statement_line=line,
        )
    ]


def too_large(size: int, limit: int) -> str | None:
    """Why a file of `size` bytes is not analysed, or None when it is not over `limit`."""
    if size <= limit:
        return None
    return (
        f"not checked: {short_bytes(size)} is over max-file-size ({short_bytes(limit)}); "
        "raise max-file-size in [tool.oom-lsp] to check it"
    )


def analyze_text(
    source: str, settings: LintSettings, path: str, parse: Callable[[str], Any] | None = None
) -> list[Finding]:
    """The analysis (oom_lsp.analysis.engine.analyze) as the CLI and the editor both run
    it, with what Python itself says about text it cannot compile: a NUL byte is OOM000
    at its position (libcst parses it; Python refuses the file), and a tokenizer error,
    which libcst places at 1:1, is moved to where Python finds it, with Python's words."""
    from oom_lsp.analysis.engine import analyze

    nul = source.find("\x00")
    if nul != -1:
        line = source.count("\n", 0, nul) + 1
        column = nul - (source.rfind("\n", 0, nul) + 1)
        return undecodable_finding((line, column, "source code cannot contain null bytes"), settings)
    findings = analyze(source, settings, path, parse) if parse is not None else analyze(source, settings, path)
    return [_located(finding, source, path) for finding in findings]


def _located(finding: Finding, source: str, path: str) -> Finding:
    if finding.code != registry.INVALID_SYNTAX.code or "tokenizer error" not in finding.message:
        return finding
    try:
        python_ast.parse_only(source, path)
    except SyntaxError as error:
        if not error.lineno:
            return finding
        start = Position(error.lineno, max((error.offset or 1) - 1, 0))
        return dataclasses.replace(
            finding,
            message=f"SyntaxError: {error.msg}",
            range=Range(start, Position(start.line, start.column + 1)),
            statement_line=start.line,
        )
    except ValueError:  # nothing Python itself would say more precisely
        return finding
    return finding


# --- Cache --------------------------------------------------------------------------------------


def cache_key(raw: bytes, settings: LintSettings, relative: str) -> str:
    digest = hashlib.blake2b(raw, digest_size=16)
    digest.update(b"\0" + settings.fingerprint().encode() + b"\0" + oom_lsp.__version__.encode())
    digest.update(b"\0" + relative.encode())
    return digest.hexdigest()


class ResultsCache:
    """Findings per file of one project root: one JSON file per settings
    fingerprint (as Ruff keys its cache by settings), in a folder per version,
    so alternating `--select` values do not evict each other."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / CACHE_DIR_NAME / oom_lsp.__version__
        self._tables: dict[str, dict[str, dict]] = {}
        self._dirty: set[str] = set()

    def _table(self, fingerprint: str) -> dict[str, dict]:
        table = self._tables.get(fingerprint)
        if table is None:
            try:
                data = json.loads((self.folder / f"{fingerprint}.json").read_text(encoding="utf-8"))
                entries = data.get("entries") if isinstance(data, dict) else None
                table = entries if isinstance(entries, dict) else {}
            except (OSError, ValueError):
                table = {}  # no cache yet, or a corrupt one: start afresh
            self._tables[fingerprint] = table
        return table

    def get(self, settings: LintSettings, relative: str, key: str) -> list[Finding] | None:
        entry = self._table(settings.fingerprint()).get(relative)
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        try:
            return [Finding.from_dict(item) for item in entry["findings"]]
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, settings: LintSettings, relative: str, key: str, findings: list[Finding]) -> None:
        fingerprint = settings.fingerprint()
        self._table(fingerprint)[relative] = {
            "key": key,
            "findings": [finding.to_dict() for finding in findings],
        }
        self._dirty.add(fingerprint)

    def save(self) -> None:
        if not self._dirty:
            return
        # A cloned repository may hold symbolic links here (the folder itself, its marker
        # files, a temporary file's name): nothing is created or written through them
        # (oom_lsp.safe_files).
        try:
            top = self.root / CACHE_DIR_NAME
            safe_files.make_folder(self.folder, self.root)
            if safe_files.create_new(top / ".gitignore", "# Created by oom-lsp automatically.\n*\n", root=self.root):
                safe_files.create_new(
                    top / "CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n", root=self.root
                )
            for fingerprint in sorted(self._dirty):
                table = self._tables[fingerprint]
                # Files deleted or renamed since they were cached.
                for relative in [relative for relative in table if not (self.root / relative).exists()]:
                    del table[relative]
                payload = json.dumps({"entries": table}, separators=(",", ":"))
                safe_files.write_file(self.folder / f"{fingerprint}.json", payload, root=self.root)
        except OSError:
            return  # a read-only checkout (or a link out of it) still gets its results, just not cached
        self._dirty.clear()


# --- Analysis jobs (run in-process or in a worker) ---------------------------------------------


@dataclass(frozen=True)
class Job:
    index: int
    path: str
    source: str
    settings: LintSettings
    fix: bool
    unsafe_fixes: bool


@dataclass
class JobResult:
    index: int
    findings: list[Finding]
    fixed_source: str | None = None
    fixes_applied: int = 0
    fixed_codes: dict[str, int] = field(default_factory=dict)
    internal_error: str | None = None
    error: str | None = None  # the file cannot be checked (a notebook that is not nbformat 4)


def run_job(job: Job) -> JobResult:
    """Analyse (and fix) one file. A crash of the analysis is a bug in
    oom-lsp: it is reported for this file, with its traceback, and the other
    files are still checked (as Ruff reports a panic)."""
    try:
        return _run_job(job)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # also a panic of libcst's native parser (pyo3's PanicException)
        return JobResult(job.index, [], internal_error=traceback.format_exc())


def _run_job(job: Job) -> JobResult:
    # Imported here: a run answered from the cache never needs libcst.
    from oom_lsp.analysis.autofix import fix_source

    if is_notebook_path(job.path):
        return _run_notebook_job(job)
    findings = analyze_text(job.source, job.settings, job.path)
    if not job.fix or not has_applicable_fix(findings, job.unsafe_fixes):
        return JobResult(job.index, findings)
    fixed = fix_source(job.source, job.settings, unsafe=job.unsafe_fixes, path=job.path)
    if fixed.source == job.source:
        return JobResult(job.index, findings)
    # The one count every output uses: the findings the fixes made go, per code (one fix can
    # settle two findings, a later pass can fix what an earlier one revealed).
    removed = _removed_codes(findings, fixed.remaining)
    return JobResult(job.index, fixed.remaining, fixed.source, sum(removed.values()), removed)


def _run_notebook_job(job: Job) -> JobResult:
    from oom_lsp.notebooks.check import check_notebook

    try:
        checked = check_notebook(
            job.source, job.settings, job.path, fix=job.fix, unsafe_fixes=job.unsafe_fixes
        )
    except NotebookError as error:
        return JobResult(job.index, [], error=str(error))
    if checked.fixed_text is None:
        return JobResult(job.index, checked.findings)
    removed = _removed_codes(checked.before_fix, checked.findings)
    return JobResult(job.index, checked.findings, checked.fixed_text, sum(removed.values()), removed)


def read_source(raw: bytes, path: Path) -> Decoded | str:
    """The text of a file to check, or why it cannot be checked at all (a
    notebook that is not UTF-8)."""
    if not is_notebook_path(str(path)):
        return decode_source(raw)
    try:
        text, bom = decode_notebook_bytes(raw)
    except NotebookError as error:
        return str(error)
    return Decoded(text, "utf-8-sig" if bom else "utf-8")


def _removed_codes(before: list[Finding], after: list[Finding]) -> dict[str, int]:
    """How many findings of each code the fixes removed."""
    counts: dict[str, int] = {}
    for finding in before:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    for finding in after:
        if finding.code in counts:
            counts[finding.code] -= 1
    return {code: count for code, count in sorted(counts.items()) if count > 0}


def _warm_worker() -> None:
    registry.all_rules()  # import every rule once per worker, not per file
    tune_for_analysis()


def _worker_count(jobs: list[Job]) -> int:
    if len(jobs) < POOL_MIN_FILES or sum(len(job.source) for job in jobs) < POOL_MIN_BYTES:
        return 1
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(available, len(jobs)))


def run_jobs(
    jobs: list[Job], workers: int | None = None, runner: Callable[[Job], JobResult] = run_job
) -> list[JobResult]:
    """Results in the order of `jobs`; largest sources first across workers. A worker that
    dies (a crash in native code: the process is gone, not an exception) costs only the
    file it was checking: the files it had not finished are checked again, one worker at a
    time, and the one that kills a worker alone is reported as an internal error."""
    count = _worker_count(jobs) if workers is None else workers
    if count <= 1:
        if jobs:
            tune_for_analysis()
        return [runner(job) for job in jobs]
    ordered = sorted(jobs, key=lambda job: len(job.source), reverse=True)
    results, unfinished, _ = _run_in_pool(ordered, count, runner)
    while unfinished:  # one worker at a time: the first job left unfinished is the one that killed it
        done, left, exit_code = _run_in_pool(unfinished, 1, runner)
        results += done
        if left:
            results.append(JobResult(left[0].index, [], internal_error=_died_message(exit_code)))
            left = left[1:]
        unfinished = left
    return sorted(results, key=lambda result: result.index)


def _run_in_pool(
    jobs: list[Job], count: int, runner: Callable[[Job], JobResult]
) -> tuple[list[JobResult], list[Job], int | None]:
    """The results of the jobs a pool of `count` workers finished, the jobs it did not (in
    their order) when a worker died, and a dead worker's exit status."""
    # Here, not at the top: the language server imports this module for one file at a time and
    # must not pay for the process pool (multiprocessing, tempfile, random) at its start.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("spawn")
    results: list[JobResult] = []
    unfinished: list[Job] = []
    exit_code: int | None = None
    with ProcessPoolExecutor(max_workers=count, mp_context=context, initializer=_warm_worker) as pool:
        futures = [pool.submit(runner, job) for job in jobs]
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for job, future in zip(jobs, futures):
            try:
                results.append(future.result())
            except BrokenProcessPool:
                unfinished.append(job)
    if unfinished:  # the pool has joined its workers: their exit statuses are known
        codes = [process.exitcode for process in processes if process.exitcode]
        # The others were stopped by the pool with SIGTERM.
        exit_code = next((code for code in codes if code != -15), codes[0] if codes else None)
    return results, unfinished, exit_code


def _died_message(exit_code: int | None) -> str:
    """An internal error's text (its last line is what the CLI prints) for a worker that died."""
    import signal

    how = ""
    if exit_code is not None and exit_code < 0:
        try:
            how = f" ({signal.Signals(-exit_code).name})"
        except ValueError:
            how = f" (signal {-exit_code})"
    elif exit_code:
        how = f" (exit code {exit_code})"
    return f"WorkerDied: the analysis process died{how} while checking this file\n"


def has_applicable_fix(findings: list[Finding], unsafe_fixes: bool) -> bool:
    return any(finding.fix is not None and (finding.fix.is_safe or unsafe_fixes) for finding in findings)


# --- The whole check ------------------------------------------------------------------------------


@dataclass
class _Pending:
    root: Path  # the project's folder: --fix writes nothing through a link out of it
    result: FileResult
    raw: bytes
    decoded: Decoded
    settings: LintSettings
    cache: ResultsCache | None
    relative: str
    key: str


def check_files(
    files: list[Path],
    resolver: ConfigResolver,
    *,
    use_cache: bool = True,
    fix: bool = False,
    unsafe_fixes: bool = False,
    write: bool = True,
    workers: int | None = None,
) -> CheckRun:
    """Check (and with `fix`, fix) `files`. With `write=False` fixed text is
    computed but not written back (`--diff`)."""
    caches: dict[Path, ResultsCache] = {}
    results: list[FileResult] = []
    pending: list[_Pending] = []
    run = CheckRun(results)
    for file in files:
        result = FileResult(file, display_path(file))
        results.append(result)
        config = resolver.resolve(file)
        try:
            # Measured before reading: a 100 MB file is not read at all. A notebook's size is
            # mostly its outputs (images), which are skipped by the C JSON scanner, not analysed.
            size = file.stat().st_size
            oversize = None if is_notebook_path(str(file)) else too_large(size, config.max_file_size)
            raw = b"" if oversize else file.read_bytes()
        except OSError as error:
            result.error = error.strerror or str(error)
            continue
        if oversize is not None:
            result.error = oversize
            continue
        settings = config.settings_for(file)
        decoded = read_source(raw, file)
        if isinstance(decoded, str):
            result.error = decoded
            continue
        if decoded.problem is not None:
            result.findings = undecodable_finding(decoded.problem, settings)
            continue
        cache = None
        relative = ""
        key = ""
        if use_cache:
            cache = caches.get(config.root)
            if cache is None:
                cache = caches[config.root] = ResultsCache(config.root)
            relative = os.path.relpath(file, config.root).replace(os.sep, "/")
            key = cache_key(raw, settings, relative)
            cached = cache.get(settings, relative, key)
            if cached is not None and not (fix and has_applicable_fix(cached, unsafe_fixes)):
                result.findings = cached
                result.from_cache = True
                result.source = decoded.text if cached else None
                run.cached += 1
                continue
        pending.append(_Pending(config.root, result, raw, decoded, settings, cache, relative, key))

    jobs = [
        Job(index, str(item.result.path), item.decoded.text or "", item.settings, fix, unsafe_fixes)
        for index, item in enumerate(pending)
    ]
    for item, outcome in zip(pending, run_jobs(jobs, workers)):
        run.analyzed += 1
        _record(item, outcome, write)
    for cache in caches.values():
        cache.save()
    return run


def _record(item: _Pending, outcome: JobResult, write: bool) -> None:
    result = item.result
    if outcome.internal_error is not None:
        result.internal_error = outcome.internal_error
        return  # nothing is cached, so the next run tries again
    if outcome.error is not None:
        result.error = outcome.error
        return
    result.findings = outcome.findings
    original = item.decoded.text or ""
    result.source = outcome.fixed_source if outcome.fixed_source is not None else original
    if outcome.fixed_source is not None:
        result.original = original
        result.fixes_applied = outcome.fixes_applied
        result.fixed_codes = outcome.fixed_codes
        if write:
            new_raw = outcome.fixed_source.encode(item.decoded.encoding)
            try:
                safe_files.write_through(result.path, new_raw, root=item.root)
            except safe_files.LinkOutOfProject as error:
                result.error = f"the fixes were not written: {error}"
                return
            except OSError as error:
                result.error = f"cannot write the fixes: {error.strerror or error}"
                return
            if item.cache is not None:
                item.cache.put(
                    item.settings,
                    item.relative,
                    cache_key(new_raw, item.settings, item.relative),
                    result.findings,
                )
        return
    if not result.findings:
        result.source = None
    if item.cache is not None:
        item.cache.put(item.settings, item.relative, item.key, result.findings)


def check_source(
    raw: bytes,
    path: Path,
    display: str,
    resolver: ConfigResolver,
    *,
    fix: bool = False,
    unsafe_fixes: bool = False,
) -> FileResult:
    """Check text that is not on disk (stdin); nothing is cached or written."""
    result = FileResult(path, display)
    config = resolver.resolve(path)
    settings = config.settings_for(path)
    oversize = too_large(len(raw), config.max_file_size)
    if oversize is not None:
        result.error = oversize
        return result
    decoded = read_source(raw, path)
    if isinstance(decoded, str):
        result.error = decoded
        return result
    if decoded.problem is not None:
        result.findings = undecodable_finding(decoded.problem, settings)
        return result
    item = _Pending(config.root, result, raw, decoded, settings, None, "", "")
    outcome = run_job(Job(0, str(path), decoded.text or "", settings, fix, unsafe_fixes))
    _record(item, outcome, write=False)
    if result.source is None:
        result.source = decoded.text
    return result
