"""`oom-lsp profile`, `oom-lsp explain` and `oom-lsp compare`.

Added to the CLI through `add_parsers(subparsers)`. Nothing here imports torch: profiling
runs the harness in a subprocess under the user's interpreter (oom_lsp.profiling.runner).

Exit codes: 0 success; 1 the profiled script ran out of memory or failed, or `explain` found
no OOM error; 2 usage errors and runs that could not start (no torch, no such file, timeout).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from oom_lsp.cli.live import LiveLine
from oom_lsp.config import ConfigError
from oom_lsp.profiling.oom_messages import describe
from oom_lsp.profiling.report import Report, ReportError, mismatches, read_report
from oom_lsp.script_args import positive_seconds, running_line, split_script_arguments
from oom_lsp.units import format_bytes

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
TABLE_LINES = 10
OUTPUT_LINES = 15


def add_parsers(subparsers: Any) -> None:
    profile = subparsers.add_parser(
        "profile",
        help="run a training script for a few optimizer steps and report its memory",
        description="Run SCRIPT (unchanged) under the given interpreter, stop it after --steps optimizer "
        "steps, and write report.json, trace.json and stacks.txt (and a CUDA memory snapshot) to --out. "
        "With --import, build the same report from an existing chrome trace or memory snapshot.",
    )
    profile.add_argument("script", nargs="?", type=Path, help="the training script")
    # Everything after SCRIPT: profile options, then `--` and the script's own arguments
    # (argparse alone cannot take options after a positional and more positionals after `--`).
    profile.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    _add_profile_options(profile, defaults=True)
    profile.set_defaults(handler=run_profile, takes_script_args=True)

    explain = subparsers.add_parser(
        "explain",
        help="find out-of-memory errors in a log or traceback, or explain a memory snapshot's peak",
        description="Read LOG ('-' for stdin) and print, for each OOM error, the allocation that failed, "
        "the device's memory state, the allocator hint and the user-code line that failed. Given a memory "
        "snapshot (a pickle from torch.cuda.memory._dump_snapshot or `oom-lsp estimate --snapshot`), print "
        "the bytes live at its peak by the lines of your code that allocated them; the pickle is read as "
        "plain data (no class or function in it is loaded).",
    )
    explain.add_argument("log", nargs="?", help="a log file, - for stdin, or a memory snapshot (.pickle)")
    explain.add_argument(
        "--last", action="store_true",
        help="the last OOM recorded by oom_guard in this project (.oom_lsp/last_oom/report.json)",
    )
    explain.add_argument("--format", choices=("text", "json"), default="text")
    explain.set_defaults(handler=run_explain)

    compare = subparsers.add_parser(
        "compare",
        help="compare two profile reports: peak per step and per top line",
        description="Print the peak before, after and the change, per step and per top line.",
    )
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    compare.add_argument("--format", choices=("text", "json"), default="text")
    compare.add_argument(
        "--force",
        action="store_true",
        help="compare reports that do not measure the same thing (a failed run, another script or device)",
    )
    compare.set_defaults(handler=run_compare)


def _add_profile_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--steps", type=int, default=default(3), help="optimizer steps to profile (default 3)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=default("auto"))
    parser.add_argument(
        "--python", default=default(sys.executable), help="the interpreter with your torch (default: this one)"
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, default=default(600.0), help="seconds before the run is killed (default 600)"
    )
    parser.add_argument("--out", type=Path, default=default(Path(".oom_lsp/profile")), help="output folder")
    parser.add_argument(
        "--import", dest="import_file", type=Path, metavar="FILE", default=default(None),
        help="a chrome trace (export_chrome_trace) or memory snapshot pickle (_dump_snapshot) to read instead",
    )


def _error(message: str) -> int:
    print(f"oom-lsp: {message}", file=sys.stderr)
    return EXIT_ERROR


# --- profile -------------------------------------------------------------------------------


class ProgressDisplay(LiveLine):
    """Steps done and elapsed time: a bar on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, steps: int, label: str) -> None:
        super().__init__(stream, label)
        self.steps = steps
        self.done = 0
        self.phase = "starting"

    def on_progress(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "step":
            self.done = int(event.get("step", self.done))
            self.phase = "running"
        elif kind == "started":
            self.phase = "running"
        elif kind == "analysing":
            self.phase = "analysing"
        else:
            return
        if self.tty:
            self.draw()
        elif kind == "step":
            self.line(f"{self.label}: step {self.done}/{self.steps} done ({self.elapsed:.1f} s)")
        else:
            self.line(f"{self.label}: {self.phase} ({self.elapsed:.1f} s)")

    def render(self) -> str:
        width = 20
        filled = width * min(self.done, self.steps) // max(self.steps, 1)
        bar = "#" * filled + "-" * (width - filled)
        return f"{self.label} [{bar}] {self.done}/{self.steps} steps  {self.elapsed:5.1f} s  {self.phase}"


def run_profile(args: argparse.Namespace) -> int:
    from oom_lsp.usecases.profile import ProfileError, ProfileRequest, run_profile

    problem = split_script_arguments(args, "profile", _add_profile_options)
    if problem:
        return _error(problem)
    if args.import_file is not None:
        return _import(args)
    if args.script is None:
        return _error("profile needs a SCRIPT (or --import FILE)")
    if not args.script.is_file():
        problem = "a folder, not a script" if args.script.is_dir() else "no such file"
        return _error(f"{args.script}: {problem}")
    if args.steps < 1:
        return _error("--steps must be at least 1")
    request = ProfileRequest(
        script=args.script, out=args.out, script_args=args.script_args, steps=args.steps,
        device=args.device, python=args.python, timeout=args.timeout,
    )
    print(running_line("profile", args.script, args.script_args, args.python), file=sys.stderr)
    display = ProgressDisplay(sys.stderr, args.steps, f"profiling {args.script.name}")
    try:
        with display:
            outcome = run_profile(request, on_progress=display.on_progress)
    except (ProfileError, ConfigError) as exc:
        return _error(str(exc))
    report = outcome.report
    print_summary(report, args.out, sys.stdout, outcome.advice)
    if outcome.no_measurement:
        return _error(outcome.no_measurement)
    if report.status == "exited" and report.exit_code:
        return EXIT_FAILED  # the script said it failed
    if report.status in ("completed", "finished", "exited"):
        return EXIT_OK
    if report.status in ("timeout", "cancelled", "crashed"):
        return EXIT_ERROR
    return EXIT_FAILED


def completed_steps(report: Report) -> int:
    return sum(1 for step in report.steps if step.complete)


def _import(args: argparse.Namespace) -> int:
    from oom_lsp.profiling.importers import ImportFormatError, import_profile

    try:
        report = import_profile(args.import_file)
    except FileNotFoundError:
        return _error(f"{args.import_file}: no such file")
    except ImportFormatError as exc:
        return _error(str(exc))
    try:
        report.write(args.out / "report.json", root=Path.cwd())
    except OSError as error:
        return _error(f"cannot write the report: {error.strerror or error}")
    print_summary(report, args.out, sys.stdout)
    return EXIT_OK


def _table(rows: list[list[str]], out: TextIO, right: frozenset[int] | set[int] = frozenset()) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        print("  " + "  ".join(cells).rstrip(), file=out)
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths), file=out)


def _where(file: str, line: int) -> str:
    return f"{file}:{line}"


def print_summary(report: Report, out_dir: Path, out: TextIO, advice: list[str] | None = None) -> None:
    device = report.device
    device_text = device.type + (f" ({device.name})" if device.name else "")
    if device.total_memory:
        device_text += f", {format_bytes(device.total_memory)}"
    print(f"status: {report.status}" + (f" (exit code {report.exit_code})" if report.status == "exited" else ""), file=out)
    print(f"device: {device_text}" + (f"; torch {report.torch_version}" if report.torch_version else ""), file=out)
    if report.batch_size is not None:
        print(f"batch size seen: {report.batch_size} (input shape {report.input_shape})", file=out)
    if report.steps:
        rows = [["step", "peak allocated", "peak reserved", "wall time"]]
        for step in report.steps:
            rows.append([
                f"{step.index}" + ("" if step.complete else " (cut short)"),
                format_bytes(step.peak_allocated),
                format_bytes(step.peak_reserved) if step.peak_reserved is not None else "-",
                f"{step.wall_time:.2f} s" if step.wall_time is not None else "-",
            ])
        print("", file=out)
        _table(rows, out, right={1, 2, 3})
    if report.peak_allocated is not None:
        print(f"\npeak allocated: {format_bytes(report.peak_allocated)}", file=out)
    if report.top_lines:
        print("\ntop lines by memory live at the peak:", file=out)
        rows = [["bytes", "line", "code"]]
        for usage in report.top_lines[:TABLE_LINES]:
            rows.append([format_bytes(usage.bytes), _where(usage.file, usage.line), (usage.code or usage.function or "")[:60]])
        _table(rows, out, right={0})
    if report.top_modules:
        print("\ntop modules:", file=out)
        rows = [["bytes", "module", "type"]]
        rows += [[format_bytes(m.bytes), m.name, m.type] for m in report.top_modules[:5]]
        _table(rows, out, right={0})
    if report.oom:
        print("\nout of memory:", file=out)
        for label, value in describe(report.oom.error):
            print(f"  {label}: {value}", file=out)
        for line in advice or []:
            print(f"  next: {line}", file=out)
    if report.error:
        print(f"\nerror: {report.error}", file=out)
    failed = report.status in ("oom", "error", "timeout", "crashed") or (
        report.status in ("finished", "exited") and (report.exit_code or not completed_steps(report))
    )
    if failed and report.output_tail:
        print("\nlast lines of the script's output:", file=out)
        for line in report.output_tail.splitlines()[-OUTPUT_LINES:]:
            print(f"  | {line}", file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    artifacts = report.artifacts
    files = [name for name in (artifacts.trace, artifacts.stacks, artifacts.snapshot) if name]
    print(f"\nreport: {out_dir / 'report.json'}" + (f" (also {', '.join(files)})" if files else ""), file=out)


# --- explain -------------------------------------------------------------------------------


def run_explain(args: argparse.Namespace) -> int:
    if args.last:
        from oom_lsp.runtime.reports import run_explain_last

        return run_explain_last(Path.cwd(), args.format, sys.stdout, sys.stderr)
    if args.log is None:
        return _error("explain needs a LOG (or - for stdin), or --last")
    from oom_lsp.usecases.explain import explain, next_steps, read_log

    if args.log != "-" and _is_pickle(Path(args.log)):
        return _explain_snapshot(Path(args.log), args.format)
    if args.log == "-":
        text = sys.stdin.read()
    else:
        try:
            text = read_log(Path(args.log), limit=None)
        except OSError as exc:
            return _error(f"{args.log}: {exc.strerror or exc}")
    explanation = explain(text)
    ooms = explanation.ooms
    if args.format == "json":
        print(json.dumps(explanation.to_json(), indent=2))
    elif not ooms:
        print("no out-of-memory error found", file=sys.stderr)
    else:
        try:
            advice = [next_steps(oom) for oom in ooms]
        except ConfigError as error:
            return _error(str(error))
        for number, (oom, lines) in enumerate(zip(ooms, advice), 1):
            if number > 1:
                print()
            print(f"out-of-memory error {number} of {len(ooms)} (line {oom.log_line}):")
            for label, value in describe(oom):
                print(f"  {label}: {value}")
            for line in lines:
                print(f"  next: {line}")
    return EXIT_OK if ooms else EXIT_FAILED


def _is_pickle(path: Path) -> bool:
    from oom_lsp.usecases.explain import is_snapshot

    return is_snapshot(path)


SNAPSHOT_TRUST = (
    "read as plain data: oom-lsp's own pickle reader takes only dicts, lists, strings and numbers and "
    "refuses any class or function, so a snapshot from elsewhere cannot run code"
)


def _explain_snapshot(path: Path, output: str) -> int:
    """`oom-lsp explain snapshot.pickle`: the bytes live at the snapshot's peak, by the user line
    that allocated them (the innermost frame of the user's code; profiling/importers.py)."""
    from oom_lsp.profiling.importers import ImportFormatError
    from oom_lsp.usecases.explain import explain_snapshot

    try:
        explanation = explain_snapshot(path)
    except ImportFormatError as error:
        return _error(str(error))
    except OSError as exc:
        return _error(f"{path}: {exc.strerror or exc}")
    report, held_by, failed = explanation.report, explanation.held_by, explanation.failed
    attributed = sum(usage.bytes for usage in report.top_lines)
    if output == "json":
        print(
            json.dumps(
                {
                    "snapshot": str(path),
                    "trust": SNAPSHOT_TRUST,
                    "peak_allocated_bytes": report.peak_allocated,
                    "peak_reserved_bytes": report.peak_reserved,
                    "top_lines": [usage.to_dict() for usage in report.top_lines],
                    "held_by": [group.to_dict() for group in held_by],
                    "failed_allocation": failed.to_dict() if failed else None,
                    "notes": report.notes,
                },
                indent=2,
            )
        )
        return EXIT_OK
    print(f"{path}: a PyTorch memory snapshot, {SNAPSHOT_TRUST}")
    print(f"  peak allocated: {format_bytes(report.peak_allocated)} ({report.peak_allocated:,} bytes)")
    if report.peak_reserved >= report.peak_allocated:  # an estimate export records no reserved memory
        print(f"  peak reserved:  {format_bytes(report.peak_reserved)} (the segments the snapshot records)")
    if not report.top_lines:
        print("  no frame of the live blocks is in your code: record with "
              "torch.cuda.memory._record_memory_history(stacks=\"python\")")
    else:
        print("  top lines at the peak (bytes still live there, by the line of your code that allocated them):")
        _print_lines(report.top_lines)
        rest = report.peak_allocated - attributed
        if rest > 0:
            print(f"    {format_bytes(rest):>11}  outside your code, or below the top {len(report.top_lines)}")
    if held_by:
        print("  held at the peak by (where the snapshot says: its frames, its backward passes):")
        for group in held_by:
            blocks = f"{group.blocks} block{'s' if group.blocks != 1 else ''}" if group.blocks else "no frames"
            print(f"    {format_bytes(group.bytes):>11}  {group.holder}  ({blocks})")
    if failed:
        free = f", {format_bytes(failed.device_free)} free on the device" if failed.device_free is not None else ""
        print(
            f"  the allocation that failed: {format_bytes(failed.requested)} requested{free}; "
            f"{format_bytes(failed.live)} live then, by the line that allocated it:"
        )
        _print_lines(failed.top_lines)
    for note in report.notes:
        print(f"  note: {note}")
    return EXIT_OK


def _print_lines(top_lines: list) -> None:
    for usage in top_lines[:TABLE_LINES]:
        blocks = f"{usage.allocations} block{'s' if usage.allocations != 1 else ''}"
        print(f"    {format_bytes(usage.bytes):>11}  {_rel(usage.file)}:{usage.line}  ({blocks})")


def _rel(file: str) -> str:
    try:
        return str(Path(file).relative_to(Path.cwd()))
    except ValueError:
        return file


# --- compare -------------------------------------------------------------------------------


def _change(before: int | None, after: int | None) -> str:
    if before is None or after is None:
        return "-"
    delta = after - before
    text = ("+" if delta > 0 else "") + format_bytes(delta)
    if before:
        text += f" ({100 * delta / before:+.1f} %)"
    return text


def _line_change(before: int | None, after: int | None) -> str:
    # A line absent from one report's top lines may still hold memory below the cut: no number then.
    if before is None:
        return "new in the top lines"
    if after is None:
        return "left the top lines"
    return _change(before, after)


def compare_reports(before: Report, after: Report) -> dict[str, Any]:
    """Peaks per step and per top line; lines are matched by file and code text, then by line number."""
    steps = []
    for index in range(max(len(before.steps), len(after.steps))):
        b = before.steps[index].peak_allocated if index < len(before.steps) else None
        a = after.steps[index].peak_allocated if index < len(after.steps) else None
        steps.append({"step": index + 1, "before": b, "after": a})

    def key(usage: Any) -> tuple[str, str | int]:
        return (usage.file, usage.code) if usage.code else (usage.file, usage.line)

    rows: dict[tuple[str, str | int], dict[str, Any]] = {}
    for side, report in (("before", before), ("after", after)):
        for usage in report.top_lines:
            row = rows.setdefault(key(usage), {"file": usage.file, "code": usage.code, "before": None, "after": None})
            row[side] = usage.bytes
            row[f"{side}_line"] = usage.line
    lines = sorted(rows.values(), key=lambda r: -max(r["before"] or 0, r["after"] or 0))
    return {
        "peak": {"before": before.peak_allocated, "after": after.peak_allocated},
        "steps": steps,
        "lines": lines,
    }


def run_compare(args: argparse.Namespace) -> int:
    try:
        before, after = read_report(args.before), read_report(args.after)
    except ReportError as exc:
        return _error(str(exc))
    found = mismatches(before, after)
    refused = [m.message for m in found if m.refuse]
    if refused and not args.force:
        for message in refused:
            print(f"oom-lsp: cannot compare {args.before} and {args.after}: {message}", file=sys.stderr)
        return _error("--force compares them anyway")
    for mismatch in found:
        print(f"warning: {mismatch.message}", file=sys.stderr)
    result = compare_reports(before, after)
    result["warnings"] = [m.message for m in found]
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return EXIT_OK
    out = sys.stdout
    peak = result["peak"]
    print(f"peak allocated: {format_bytes(peak['before'])} -> {format_bytes(peak['after'])}  "
          f"{_change(peak['before'], peak['after'])}", file=out)
    rows = [["step", "before", "after", "change"]]
    for step in result["steps"]:
        rows.append([str(step["step"]), format_bytes(step["before"]), format_bytes(step["after"]),
                     _change(step["before"], step["after"])])
    print("", file=out)
    _table(rows, out, right={1, 2})
    if result["lines"]:
        rows = [["line", "before", "after", "change", "code"]]
        for line in result["lines"][:TABLE_LINES * 2]:
            number = line.get("after_line", line.get("before_line"))
            rows.append([_where(line["file"], number), format_bytes(line["before"]) if line["before"] is not None else "-",
                         format_bytes(line["after"]) if line["after"] is not None else "-",
                         _line_change(line["before"], line["after"]), (line["code"] or "")[:50]])
        print("\ntop lines:", file=out)
        _table(rows, out, right={1, 2})
    return EXIT_OK
