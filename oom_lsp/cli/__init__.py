"""The `oom-lsp` command.

    oom-lsp                      start the language server (stdio)
    oom-lsp server [--tcp H:P]   the same, with options
    oom-lsp --check PATH...      check files (also `oom-lsp check PATH...`)
    oom-lsp rule OOM501          a rule's documentation (`--all`, `--format json`)

Exit codes follow `ruff check`: 0 clean (or everything fixed), 1 findings,
2 a usage or configuration error (a message on stderr, never a traceback),
or a crash of the analysis on some file (reported, the other files checked).
Other features add subcommands through FEATURE_COMMANDS: each module there
has `add_parsers(subparsers)`, and each parser it adds sets `handler=` (a
function of the parsed arguments returning the exit code).

This package is the CLI face: it parses arguments, calls the use-case layer
(oom_lsp.usecases) from estimate.py, calibrate.py, ai.py, profile.py and prints the typed
results as text or JSON; it never imports the language server (the other
face), which `oom-lsp server` starts by name. The check path imports neither
pygls, lsprotocol nor torch: the server and feature modules are imported only
when their subcommand runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import oom_lsp
from oom_lsp.script_args import positive_seconds

FEATURE_COMMANDS: tuple[str, ...] = (
    "oom_lsp.cli.profile",
    "oom_lsp.cli.estimate",
    "oom_lsp.cli.calibrate",
    "oom_lsp.cli.ai",
)
BUILTIN_COMMANDS = ("check", "rule", "server")
EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class UsageError(Exception):
    """A problem with the command line or the configuration: exit 2."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP during a command: a BaseException, so that no
    `except Exception` on the way up stops it; exit 128 + the signal number."""

    def __init__(self, signum: int, killed: list[int]) -> None:
        super().__init__(signum)
        self.signum = signum
        self.killed = killed


_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _on_stop_signal(signum: int, frame: Any) -> None:
    """Kill every process group the command started (the user's script and all
    it forked), then unwind. Ctrl-C in a terminal reaches only our own process
    group: the scripts run in sessions of their own, so this is what stops them."""
    from oom_lsp.profiling import runner

    if runner.spawning():
        runner.hold_signal(signum)  # the group is not registered yet: delivered again once it is
        return
    killed = runner.kill_live_groups()
    for name in _STOP_SIGNALS:  # one cancel is enough: a second signal must not cut the cleanup short
        number = getattr(signal, name)
        if signal.getsignal(number) is _on_stop_signal:
            signal.signal(number, signal.SIG_IGN)
    raise Interrupted(signum, killed)


def _install_stop_handlers() -> None:
    for name in _STOP_SIGNALS:
        number = getattr(signal, name)
        if signal.getsignal(number) is not signal.SIG_IGN:  # `nohup`, a background job: ignored it stays
            signal.signal(number, _on_stop_signal)


def _error(message: str) -> None:
    from oom_lsp.output import printable  # a path or a configuration value may hold controls

    print(printable(f"error: {message}"), file=sys.stderr)


def _last_words(message: str) -> None:
    """`message` on stderr, if the streams still lead anywhere. After a hang-up (the terminal
    closed: SIGHUP) every write fails with EIO; the streams are then pointed at /dev/null,
    so that neither this line nor the interpreter's final flush turns the exit status into
    an error's."""
    for stream, text in ((sys.stderr, message + "\n"), (sys.stdout, "")):
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            except (OSError, ValueError):
                pass  # not a real file descriptor (a test's capture): nothing is flushed to it


# --- Parser -----------------------------------------------------------------------------------


def _selectors(value: str) -> list[str]:
    selectors = [part.strip() for part in value.split(",") if part.strip()]
    if not selectors:  # `--select ''` (an unset shell variable) would silently check nothing
        raise argparse.ArgumentTypeError(f"expected rule codes, prefixes or names (OOM301,OOM3,ALL), got {value!r}")
    return selectors


def _tcp_address(value: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return value


def _add_check_parser(subparsers: Any) -> None:
    from oom_lsp.output import FORMATS

    check = subparsers.add_parser(
        "check",
        help="check files for GPU out-of-memory risks (also spelled `oom-lsp --check`)",
        description="Check Python files and folders (recursively) for GPU out-of-memory risks.",
    )
    check.add_argument(
        "paths", nargs="*", metavar="PATH", help="files or folders to check (default: .); `-` reads stdin"
    )
    check.add_argument(
        "--format",
        "--output-format",
        dest="format",
        choices=[*FORMATS, "concise"],
        default="text",
        help="output format (default: text, one line per finding)",
    )
    check.add_argument(
        "--statistics", action="store_true", help="print the number of findings per code instead"
    )
    check.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    check.add_argument(
        "--exit-non-zero-on-fix",
        action="store_true",
        help="exit 1 when a fix was applied, even if no finding remains",
    )
    for flag, help_text in (
        ("--select", "rules to enable, replacing the configured set (codes, prefixes, names, ALL)"),
        ("--extend-select", "rules to enable on top of the configured set"),
        ("--ignore", "rules to disable"),
    ):
        check.add_argument(
            flag, type=_selectors, action="append", metavar="CODES", help=help_text + "; comma-separated"
        )
    check.add_argument(
        "--config", type=Path, metavar="PATH", help="configuration file to use instead of discovery"
    )
    check.add_argument("--stdin-filename", metavar="PATH", help="the name of the file read from stdin")
    check.add_argument("--no-cache", action="store_true", help="neither read nor write .oom_lsp_cache/")
    check.add_argument(
        "--strict",
        action="store_true",
        help="also report findings whose memory at stake is not shown to matter (strict = true)",
    )
    check.add_argument("--fix", action="store_true", help="apply safe fixes")
    check.add_argument(
        "--unsafe-fixes", action="store_true", help="also apply (and show as fixable) unsafe fixes"
    )
    check.add_argument(
        "--diff", action="store_true", help="print the fixes as a unified diff instead of applying them"
    )
    check.add_argument(
        "--show-fixes", action="store_true", help="list the fixes applied (or each finding's fix title)"
    )
    check.add_argument(
        "--force-exclude",
        action="store_true",
        help="apply exclude / extend-exclude to files named on the command line too (for pre-commit)",
    )
    check.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")
    check.add_argument("-v", "--verbose", action="store_true", help="also print timing and cache statistics")
    _add_budget_options(check)
    check.set_defaults(handler=run_check)


def _add_budget_options(check: argparse.ArgumentParser) -> None:
    gate = check.add_argument_group(
        "memory budget gate",
        "estimate the scripts of estimate-scripts in [tool.oom-lsp] (device cuda, no GPU needed) and report "
        "OOM100 when one's predicted peak exceeds the budget, OOM103 when it grew more than --max-growth "
        "against the baseline; runs when a budget or a baseline is given here or in [tool.oom-lsp]",
    )
    gate.add_argument("--budget", metavar="SIZE", help='the GPU memory budget, e.g. "24GiB" (key: budget)')
    gate.add_argument(
        "--baseline", metavar="FILE", help="JSON of each script's predicted peak (key: budget-baseline)"
    )
    gate.add_argument(
        "--max-growth",
        metavar="PCT",
        help="largest growth against the baseline, in percent (default 5; key: budget-max-growth)",
    )
    gate.add_argument(
        "--update-baseline", action="store_true", help="write each script's predicted peak to the baseline"
    )
    gate.add_argument(
        "--estimate-script",
        action="append",
        metavar="'SCRIPT ARGS'",
        help="a script and its arguments to estimate, instead of estimate-scripts (repeatable)",
    )
    gate.add_argument(
        "--estimate-timeout",
        type=positive_seconds,
        metavar="S",
        help="seconds before a script's estimate is killed (default 300; key: estimate-timeout)",
    )
    gate.add_argument(
        "--python",
        default=sys.executable,
        metavar="PATH",
        help="the interpreter with your torch (default: this one)",
    )
    gate.add_argument("--no-budget", action="store_true", help="skip the budget gate (lint only)")


def _add_rule_parser(subparsers: Any) -> None:
    rule = subparsers.add_parser(
        "rule", help="print a rule's documentation", description="Print rule documentation."
    )
    rule.add_argument(
        "rule", nargs="?", metavar="RULE", help="a code (OOM501) or name (torch-load-without-map-location)"
    )
    rule.add_argument("--all", action="store_true", help="every rule")
    rule.add_argument("--format", "--output-format", dest="format", choices=["text", "json"], default="text")
    rule.set_defaults(handler=run_rule)


def _add_server_parser(subparsers: Any) -> None:
    server = subparsers.add_parser("server", help="start the language server (the default)")
    server.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (the default)")
    server.add_argument(
        "--tcp", type=_tcp_address, metavar="HOST:PORT", help="listen on a TCP address instead"
    )
    server.add_argument("--log-file", metavar="FILE", help="write the server's log to FILE")
    server.set_defaults(handler=run_server)


def _add_feature_parsers(subparsers: Any) -> None:
    for module_name in FEATURE_COMMANDS:
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:  # its parent package is not installed either
            spec = None
        if spec is not None:
            importlib.import_module(module_name).add_parsers(subparsers)


def build_parser(with_features: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oom-lsp",
        description="Find GPU out-of-memory risks in PyTorch training code: a language server and a checker.",
        epilog="With no command, starts the language server. Exit codes: 0 clean, 1 findings, 2 error.",
    )
    parser.add_argument("--version", action="version", version=f"oom-lsp {oom_lsp.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_check_parser(subparsers)
    _add_rule_parser(subparsers)
    _add_server_parser(subparsers)
    if with_features:
        _add_feature_parsers(subparsers)
    return parser


def _normalize_argv(argv: list[str]) -> list[str]:
    """`--check` among the leading options means the check command; no
    command means the server. (A subcommand's own arguments may contain
    `--check`, e.g. a profiled script's: only options before any command
    or `--` count.)"""
    if not argv:
        return ["server"]
    if argv[0].startswith("-"):
        options = argv[: argv.index("--")] if "--" in argv else argv
        if "--check" in options:
            rest = list(argv)
            rest.remove("--check")
            return ["check", *rest]
    if argv[0] in ("--stdio", "--tcp", "--log-file") or argv[0].startswith(("--tcp=", "--log-file=")):
        return ["server", *argv]
    return argv


def _cut_script_tail(
    parser: argparse.ArgumentParser, arguments: list[str]
) -> tuple[list[str], list[str] | None]:
    """A command that runs a script gets what follows the first `--` untouched (oom_lsp.script_args)."""
    if "--" not in arguments:
        return arguments, None
    subparsers = next(
        (action for action in parser._actions if isinstance(action, argparse._SubParsersAction)), None
    )
    command = subparsers.choices.get(arguments[0]) if subparsers is not None else None
    if command is None or not command.get_default("takes_script_args"):
        return arguments, None
    cut = arguments.index("--")
    return arguments[:cut], arguments[cut + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _normalize_argv(list(sys.argv[1:] if argv is None else argv))
    # Builtin commands need no feature module: keep `--check` lean.
    parser = build_parser(with_features=arguments[0] not in BUILTIN_COMMANDS)
    arguments, script_tail = _cut_script_tail(parser, arguments)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit_request:  # argparse: --help, --version, usage errors
        code = exit_request.code
        return code if isinstance(code, int) else EXIT_ERROR
    args.script_tail = script_tail
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    if arguments[0] not in BUILTIN_COMMANDS:
        _install_stop_handlers()  # feature commands run the user's code in subprocesses
    try:
        return int(args.handler(args))
    except Interrupted as interrupt:
        name = signal.Signals(interrupt.signum).name
        stopped = (
            f"; killed process group {', '.join(map(str, interrupt.killed))} (the script and its children)"
            if interrupt.killed
            else ""
        )
        _last_words(f"oom-lsp {arguments[0]}: interrupted by {name}{stopped}")
        return 128 + interrupt.signum
    except UsageError as error:
        _error(str(error))
        return EXIT_ERROR
    except BrokenPipeError:  # `oom-lsp --check . | head`
        # Point stdout at devnull so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        return 130


# --- check ------------------------------------------------------------------------------------------


def _flatten(groups: list[list[str]] | None) -> list[str] | None:
    return None if groups is None else [item for group in groups for item in group]


def _resolver(args: argparse.Namespace) -> Any:
    from oom_lsp.analysis import registry
    from oom_lsp.config import ConfigError, ConfigResolver

    overrides: dict[str, list[str]] = {}
    for flag, key in (("select", "select"), ("extend_select", "extend-select"), ("ignore", "ignore")):
        selectors = _flatten(getattr(args, flag))
        if selectors is None:
            continue
        for selector in selectors:
            try:
                registry.expand_selector(selector)
            except registry.SelectorError as error:
                raise UsageError(f"--{key}: {error}") from None
        overrides[key] = selectors
    if getattr(args, "strict", False):
        overrides["strict"] = True  # type: ignore[assignment]
    try:
        return ConfigResolver(overrides=overrides, config_file=args.config)
    except ConfigError as error:
        raise UsageError(str(error)) from None


def run_check(args: argparse.Namespace) -> int:
    from oom_lsp.config import ConfigError

    started = time.perf_counter()
    if args.diff:
        args.fix = False  # `--fix --diff`, as in Ruff: the diff of what --fix would write, nothing written
    resolver = _resolver(args)
    paths = list(args.paths)
    try:
        stdin = paths == ["-"] or (not paths and args.stdin_filename)
        gate = _budget_gate(args, resolver, skip=bool(stdin) or args.diff)
        if stdin:
            return _check_stdin(args, resolver)
        if "-" in paths:
            raise UsageError("`-` (stdin) cannot be combined with other paths")
        return _check_paths(args, resolver, [Path(path) for path in paths or ["."]], started, gate)
    except ConfigError as error:
        raise UsageError(str(error)) from None


_BUDGET_FLAGS = ("budget", "baseline", "max_growth", "update_baseline", "estimate_script", "estimate_timeout")


def _budget_gate(args: argparse.Namespace, resolver: Any, skip: bool) -> Any:
    """The budget gate's settings (oom_lsp.usecases.budget), or None when it does not run:
    not asked for, `--no-budget`, or stdin and `--diff`, which check text only."""
    given = [flag for flag in _BUDGET_FLAGS if getattr(args, flag, None) not in (None, False)]
    if args.no_budget:
        if given:
            raise UsageError(f"--no-budget cannot be combined with --{given[0].replace('_', '-')}")
        return None
    if skip:
        if given:
            raise UsageError(
                f"--{given[0].replace('_', '-')}: the budget gate does not run with stdin or --diff"
            )
        return None
    from oom_lsp.config import load_user_config
    from oom_lsp.usecases.budget import BudgetError, gate_settings

    config = resolver.resolve_folder(Path.cwd())
    asked = any(value is not None for value in (config.budget, config.budget_baseline, args.budget, args.baseline))
    # The user's own trusted-projects, read only when the project's own scripts would run.
    runs_project_scripts = asked and bool(config.estimate_scripts) and not args.estimate_script
    try:
        return gate_settings(
            config,
            budget=args.budget,
            scripts=args.estimate_script,
            baseline=args.baseline,
            max_growth=args.max_growth,
            update_baseline=args.update_baseline,
            timeout=args.estimate_timeout,
            python=args.python,
            trusted=runs_project_scripts and load_user_config().trusts(config.root),
        )
    except BudgetError as error:
        raise UsageError(str(error)) from None


def _gate_display(live: bool, announce: bool, python: str) -> Any:
    """The budget gate's progress: which script runs (unless -q), then the estimate's status
    line per script (on a terminal)."""
    from contextlib import contextmanager

    from oom_lsp.cli.estimate import EstimateDisplay
    from oom_lsp.script_args import running_line
    from oom_lsp.usecases.budget import _shown

    @contextmanager
    def display(entry: Any) -> Any:
        if announce:
            sys.stderr.write(running_line("check: budget gate", _shown(entry.script), list(entry.args), python) + "\n")
        line = EstimateDisplay(sys.stderr, f"budget gate: {entry.entry}", quiet=not live)
        with line:
            yield line.listener()

    return display


def _run_budget_gate(args: argparse.Namespace, gate: Any, results: list[Any]) -> Any:
    """Estimate the gate's scripts and put their findings with the files' own; Ctrl-C
    kills the scripts' process groups (the handlers of the feature commands)."""
    from oom_lsp import checker
    from oom_lsp.usecases.budget import run_gate

    _install_stop_handlers()
    outcome = run_gate(gate, _gate_display(live=sys.stderr.isatty(), announce=not args.quiet, python=gate.python))
    by_path = {os.path.abspath(result.path): result for result in results}
    for path, finding in outcome.located:
        result = by_path.get(os.path.abspath(path))
        if result is None:
            result = by_path[os.path.abspath(path)] = checker.FileResult(
                Path(path), checker.display_path(path)
            )
            results.append(result)
        if result.source is None:
            try:
                result.source = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                pass  # the formats that show code frames show the line without it
        result.findings = sorted([*result.findings, finding], key=lambda item: (item.line, item.column))
    for problem in outcome.problems:
        _error(problem)
    return outcome


def _check_paths(
    args: argparse.Namespace, resolver: Any, paths: list[Path], started: float, gate: Any = None
) -> int:
    from oom_lsp import checker

    files, missing = checker.discover_files(paths, resolver, force_exclude=args.force_exclude)
    if not files and not missing and gate is None:
        return EXIT_CLEAN  # nothing to check (pre-commit passed only excluded files)
    run = checker.check_files(
        files,
        resolver,
        use_cache=not args.no_cache,
        fix=args.fix or args.diff,
        unsafe_fixes=args.unsafe_fixes,
        write=not args.diff,
    )
    results = [*missing, *run.results]
    _report_file_errors(results, verbose=args.verbose)
    if args.verbose:
        elapsed = time.perf_counter() - started
        print(
            f"Checked {len(run.results)} files in {elapsed:.2f}s: {run.analyzed} analysed, {run.cached} from the cache.",
            file=sys.stderr,
        )
    if args.diff:
        return _report_diff(args, results)
    outcome = _run_budget_gate(args, gate, results) if gate is not None else None
    _report(args, results, sys.stdout, unanswered=len(outcome.problems) if outcome is not None else 0)
    if outcome is not None and args.format in ("text", "concise", "full") and not args.quiet:
        from oom_lsp.usecases.budget import summary

        sys.stdout.write(summary(outcome))
    code = _exit_code(args, results)
    return EXIT_ERROR if outcome is not None and outcome.problems else code


def _report_file_errors(results: list[Any], *, verbose: bool) -> None:
    for result in results:
        if result.notice is not None:
            from oom_lsp.output import printable

            print(printable(f"warning: {result.display}: {result.notice}"), file=sys.stderr)
        if result.error is not None:
            _error(f"{result.display}: {result.error}")
        if result.internal_error is not None:
            last_line = result.internal_error.strip().splitlines()[-1]
            _error(
                f"{result.display}: oom-lsp failed while checking this file ({last_line}). "
                "This is a bug in oom-lsp; please report it with the file"
                + (":" if verbose else " (-v shows the traceback).")
            )
            if verbose:
                print(result.internal_error, file=sys.stderr, end="")


def _check_stdin(args: argparse.Namespace, resolver: Any) -> int:
    from oom_lsp import checker

    name = args.stdin_filename
    path = Path(name) if name else Path.cwd() / "-"
    display = checker.display_path(path) if name else "-"
    raw = sys.stdin.buffer.read()
    result = checker.check_source(
        raw, path, display, resolver, fix=args.fix or args.diff, unsafe_fixes=args.unsafe_fixes
    )
    _report_file_errors([result], verbose=args.verbose)
    if args.diff:
        return _report_diff(args, [result])
    if args.fix:
        # As Ruff: the fixed source on stdout, what remains on stderr.
        sys.stdout.write(
            result.source if result.source is not None else raw.decode("utf-8", errors="replace")
        )
        _report(args, [result], sys.stderr)
    else:
        _report(args, [result], sys.stdout)
    return _exit_code(args, [result])


def _exit_code(args: argparse.Namespace, results: list[Any]) -> int:
    if any(result.internal_error is not None for result in results):
        return EXIT_ERROR
    if args.exit_non_zero_on_fix and any(result.changed for result in results):
        return EXIT_FINDINGS
    if args.exit_zero:
        return EXIT_CLEAN
    if any(result.findings or result.error is not None for result in results):
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else (plural or word + 's')}"


def _report(args: argparse.Namespace, results: list[Any], stream: Any, unanswered: int = 0) -> None:
    """`unanswered`: the problems of the budget gate, which a clean summary must not hide."""
    from oom_lsp.output import RenderOptions, renderer

    options = RenderOptions(unsafe_fixes=args.unsafe_fixes, show_fix_titles=args.show_fixes)
    if args.statistics:
        stream.write(_statistics(results, options, args.format))
    else:
        stream.write(renderer(args.format)(results, options))
    human = args.format in ("text", "concise", "full")
    if args.show_fixes and args.fix and human:
        stream.write(_fixed_listing(results))
    if human and not args.quiet:
        stream.write(_summary(results, options, fixing=args.fix, unanswered=unanswered))


def _summary(results: list[Any], options: Any, *, fixing: bool, unanswered: int = 0) -> str:
    findings = [finding for result in results for finding in result.findings]
    fixed = sum(result.fixes_applied for result in results)
    if fixing and fixed:
        total = fixed + len(findings)
        return f"Found {_plural(total, 'error')} ({fixed} fixed, {len(findings)} remaining).\n"
    unchecked = sum(1 for result in results if result.error is not None or result.internal_error is not None)
    if not findings:
        if unchecked:
            return f"No findings, but {_plural(unchecked, 'file')} could not be checked.\n"
        if unanswered:
            return f"No findings, but the memory budget gate met {_plural(unanswered, 'problem')}.\n"
        return "All checks passed!\n"
    lines = [f"Found {_plural(len(findings), 'error')}."]
    fixable = sum(
        1 for finding in findings if finding.fix is not None and (finding.fix.is_safe or options.unsafe_fixes)
    )
    hidden = (
        sum(1 for finding in findings if finding.fix is not None and not finding.fix.is_safe)
        if not options.unsafe_fixes
        else 0
    )
    hidden_note = (
        f"{_plural(hidden, 'hidden fix', 'hidden fixes')} can be enabled with the `--unsafe-fixes` option"
        if hidden
        else ""
    )
    if fixable:
        tail = f" ({hidden_note})." if hidden_note else "."
        lines.append(f"[*] {fixable} fixable with the `--fix` option{tail}")
    elif hidden_note:
        lines.append(f"No fixes available ({hidden_note}).")
    return "".join(line + "\n" for line in lines)


def _statistics(results: list[Any], options: Any, output_format: str) -> str:
    from oom_lsp.output import applicable_fix

    counts: dict[str, dict[str, Any]] = {}
    for result in results:
        for finding in result.findings:
            entry = counts.setdefault(
                finding.code, {"code": finding.code, "name": finding.name, "count": 0, "fixable": False}
            )
            entry["count"] += 1
            entry["fixable"] = entry["fixable"] or applicable_fix(finding, options) is not None
    rows = sorted(counts.values(), key=lambda entry: (-entry["count"], entry["code"]))
    if output_format == "json":
        return json.dumps(rows, indent=2) + "\n"
    if not rows:
        return ""
    width = max(len(str(row["count"])) for row in rows)
    return "".join(
        f"{row['count']:>{width}}\t{row['code']}\t{'[*]' if row['fixable'] else '[ ]'} {row['name']}\n"
        for row in rows
    )


def _fixed_listing(results: list[Any]) -> str:
    from oom_lsp.analysis import registry

    fixed = [result for result in results if result.fixed_codes]
    if not fixed:
        return "No errors fixed.\n"
    total = sum(sum(result.fixed_codes.values()) for result in fixed)
    lines = [f"Fixed {_plural(total, 'error')}:"]
    for result in fixed:
        lines.append(f"- {result.display}:")
        for code, count in result.fixed_codes.items():
            rule = registry.rule_for(code)
            lines.append(f"    {count} × {code} ({rule.name if rule else code})")
    return "".join(line + "\n" for line in lines) + "\n"


def _report_diff(args: argparse.Namespace, results: list[Any]) -> int:
    from oom_lsp.edits import split_lines
    from oom_lsp.notebooks import is_notebook_path

    changed = [result for result in results if result.changed]
    for result in changed:
        if is_notebook_path(str(result.path)):
            from oom_lsp.notebooks.check import cell_diff

            sys.stdout.write(cell_diff(result.display, result.original, result.source))
        else:
            sys.stdout.writelines(
                difflib.unified_diff(
                    split_lines(result.original, keepends=True),
                    split_lines(result.source, keepends=True),
                    fromfile=result.display,
                    tofile=result.display,
                )
            )
        sys.stdout.write("\n")
    fixes = sum(result.fixes_applied for result in changed)
    if not args.quiet:
        message = f"Would fix {_plural(fixes, 'error')}." if fixes else "No errors would be fixed."
        print(message, file=sys.stderr)
    if any(result.internal_error is not None for result in results):
        return EXIT_ERROR
    if changed or any(result.error is not None for result in results):
        return EXIT_FINDINGS
    return EXIT_CLEAN


# --- rule ----------------------------------------------------------------------------------------------


def _rule_json(rule: Any) -> dict[str, Any]:
    from oom_lsp.output import rule_url

    return {
        "code": rule.code,
        "name": rule.name,
        "summary": rule.summary,
        "severity": rule.default_severity.value,
        "default_enabled": rule.default_enabled,
        "fix": rule.fix_applicability.value if rule.fix_applicability is not None else None,
        "explanation": rule.docs(),
        "url": rule_url(rule.code, rule.name),
    }


def run_rule(args: argparse.Namespace) -> int:
    from oom_lsp.analysis import registry

    if args.all == (args.rule is not None):
        raise UsageError("give either a rule (code or name) or --all")
    if args.all:
        rules = sorted(
            [*registry.all_rules().values(), *registry.META_RULES.values()], key=lambda rule: rule.code
        )
        if args.format == "json":
            print(json.dumps([_rule_json(rule) for rule in rules], indent=2, ensure_ascii=False))
        else:
            print("\n".join(rule.docs() for rule in rules), end="")
        return EXIT_CLEAN
    rule = registry.rule_for(args.rule.upper()) or registry.rule_by_name(args.rule.lower())
    if rule is None:
        raise UsageError(f"unknown rule {args.rule!r}; `oom-lsp rule --all` lists them")
    if args.format == "json":
        print(json.dumps(_rule_json(rule), indent=2, ensure_ascii=False))
    else:
        print(rule.docs(), end="")
    return EXIT_CLEAN


# --- server -----------------------------------------------------------------------------------------------


def run_server(args: argparse.Namespace) -> int:
    try:
        server_module = importlib.import_module("oom_lsp.server")
    except ModuleNotFoundError as error:
        if error.name != "oom_lsp.server":
            raise UsageError(f"the language server cannot start: {error}") from None
        server_module = None
    except ImportError as error:
        raise UsageError(f"the language server cannot start: {error}") from None
    start_server = getattr(server_module, "start_server", None)
    if start_server is None:
        raise UsageError(
            "the language server is not available in this installation (oom_lsp.server.start_server)"
        )
    if args.tcp is None and sys.stdin.isatty():
        print(TERMINAL_NOTICE, file=sys.stderr, flush=True)
    try:
        code = int(start_server(args.tcp, args.log_file))
    except KeyboardInterrupt:
        code = 130
    if code == 130:
        # Ctrl-C. The server's reader thread is blocked in stdin, and a worker thread may still be
        # analysing: a normal interpreter shutdown would wait for that stream's lock and abort
        # ("Fatal Python error: _enter_buffered_busy"), or join the worker first (a CI run saw
        # the server still alive 30 s after the signal). What is written is flushed; then out.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


TERMINAL_NOTICE = (
    "oom-lsp: this is the oom-lsp language server, waiting for an editor to talk to it (LSP on "
    "stdin/stdout); editors start it themselves:\n"
    "  https://github.com/oom-lsp/oom-lsp/blob/main/docs/editors.md\n"
    "To check files: oom-lsp --check PATH; every command: oom-lsp --help. Ctrl-C quits."
)
