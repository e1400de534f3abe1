"""`oom-lsp prompt`, `oom-lsp fix --ai` and `oom-lsp validate`.

    oom-lsp prompt train.py [--error LOG] [--profile REPORT.json] [--line N] [--system]
    oom-lsp fix --ai train.py [--error LOG] [--profile REPORT.json] [--line N] [--dry-run]
    oom-lsp validate train.py --before REPORT.json [--after REPORT.json]

Added to the CLI through `add_parsers(subparsers)`. Light at import time: openai,
pydantic, libcst and torch are loaded only when a command runs (the user's torch only
ever in a subprocess).

Exit codes: 0 success (a prompt printed, an edit applied or shown, a peak that did not
grow); 1 no edit (diagnosis only, or every proposed edit refused) or a peak that grew or
still ran out of memory; 2 usage, configuration, model-server or measurement errors.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any, TextIO

from oom_lsp.script_args import positive_seconds

EXIT_OK, EXIT_NO_FIX, EXIT_ERROR = 0, 1, 2


class CommandError(Exception):
    """A problem to report on stderr with exit code 2."""


def add_parsers(subparsers: Any) -> None:
    prompt = subparsers.add_parser(
        "prompt",
        help="print the AI-fix prompt for a script (the seven sections), without sending it",
        description="Print, in Markdown, the prompt `fix --ai` would send: context, error, profiling, "
        "diagnosis, solutions, validation, documentation, filled from the script, an OOM log and a profile "
        "or estimate report. Nothing is sent anywhere.",
    )
    _add_inputs(prompt)
    prompt.add_argument("--system", action="store_true", help="also print the system message")
    prompt.set_defaults(handler=run_prompt)

    fix = subparsers.add_parser(
        "fix",
        help="ask the configured model for a memory fix (--ai) and apply it after checking it",
        description="Build the prompt, ask the OpenAI-compatible model configured in [tool.oom-lsp.llm], "
        "check the proposed SEARCH/REPLACE edits (unique match in the function sent, the file still parses), "
        "print the diff, apply it unless --dry-run, and log it in the fix log.",
    )
    fix.add_argument("--ai", action="store_true", help="use the configured model (required)")
    _add_inputs(fix)
    fix.add_argument("--dry-run", action="store_true", help="print the diff, change nothing, log nothing")
    fix.add_argument(
        "--fix-log", type=Path, metavar="PATH", help="the fix log (default: fix-log in the settings)"
    )
    fix.set_defaults(handler=run_fix)

    validate = subparsers.add_parser(
        "validate",
        help="measure a script again and compare its peak with a report from before a fix",
        description="Re-run what produced --before (`oom-lsp profile` for a profile report, `oom-lsp estimate` "
        "for an estimate) on the script as it is now, print the peak before, after and the change, and record "
        "the figures in the fix log entry of the script that has none yet.",
    )
    validate.add_argument("script", type=Path)
    validate.add_argument(
        "--before",
        type=Path,
        required=True,
        metavar="REPORT.json",
        help="a profile report.json or an `estimate --format json` output",
    )
    validate.add_argument(
        "--after", type=Path, metavar="REPORT.json", help="compare with this report instead of re-running"
    )
    validate.add_argument(
        "--python", default=sys.executable, help="the interpreter with your torch (default: this one)"
    )
    validate.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds before the run is killed (default 600)"
    )
    validate.add_argument(
        "--out", type=Path, default=Path(".oom_lsp/validate"), help="output folder of a profile run"
    )
    validate.add_argument(
        "--fix-log", type=Path, metavar="PATH", help="the fix log (default: fix-log in the settings)"
    )
    validate.add_argument("--no-log", action="store_true", help="do not record the figures in the fix log")
    validate.set_defaults(handler=run_validate)


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", type=Path, help="the training script")
    parser.add_argument("--error", type=Path, metavar="LOG", help="a log or traceback with the OOM error")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="REPORT.json",
        help="a profile report.json, or the output of `oom-lsp estimate --format json` "
        "(default: the last `oom-lsp profile` of the script, if .oom_lsp/profile/report.json is its)",
    )
    parser.add_argument(
        "--line",
        type=int,
        metavar="N",
        help="the line to fix (default: the error's, the profile's or the first finding's)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose torch/CUDA/Python versions go in the prompt (default: this one)",
    )


def _fail(message: str, err: TextIO) -> int:
    err.write(f"oom-lsp: {message}\n")
    return EXIT_ERROR


# --- Inputs --------------------------------------------------------------------------------


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path}: not a UTF-8 text file ({what})") from None
    except OSError as error:
        raise CommandError(f"{path}: {error.strerror or error}") from None


def _read_script(path: Path) -> tuple[str, str]:
    """The script's text as Python reads it (BOM and coding cookie honoured, line endings
    kept as they are) and its encoding, to write it back the same way."""
    from oom_lsp.checker import decode_source

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except OSError as error:
        raise CommandError(f"{path}: {error.strerror or error}") from None
    decoded = decode_source(raw)
    if decoded.text is None:
        line, column, message = decoded.problem or (1, 0, "cannot be decoded")
        raise CommandError(f"{path}:{line}:{column + 1}: {message}")
    return decoded.text, decoded.encoding


def _config(script: Path) -> Any:
    from oom_lsp.config import ConfigError, ConfigResolver

    try:
        return ConfigResolver().resolve(script)
    except ConfigError as error:
        raise CommandError(str(error)) from None


def _llm_settings(config: Any) -> Any:
    """The LLM settings for the CLI: the user's config file under the project's table
    (oom_lsp.llm.settings says which keys a project may set)."""
    from oom_lsp.config import ConfigError
    from oom_lsp.llm.settings import resolve_settings

    try:
        return resolve_settings(config)
    except ConfigError as error:
        raise CommandError(str(error)) from None


def _fix_log(args: argparse.Namespace, settings: Any, config: Any) -> Path:
    """`--fix-log` (the user's own choice: anywhere, but a Markdown fix log), else the
    settings' `fix-log`, inside the project."""
    from oom_lsp.llm.fixlog import FixLogError, checked_log_path

    try:
        if args.fix_log is not None:
            return checked_log_path(args.fix_log, None)
        return settings.fix_log_path(config.root)
    except FixLogError as error:
        raise CommandError(str(error)) from None


def _last_profile(script: Path) -> Path | None:
    """The report of the last `oom-lsp profile` of this script (its default --out), if any."""
    from oom_lsp.llm.validation import MeasurementError, read_measurement
    from oom_lsp.usecases.profile import LAST_PROFILE

    path = LAST_PROFILE
    if not path.is_file():
        return None
    try:
        measurement = read_measurement(path)
    except MeasurementError:
        return None  # a stale or foreign file: ignored, as if absent
    profiled = measurement.data.script if measurement.kind == "profile" else None
    if profiled is None or Path(profiled).resolve() != script.resolve():
        return None
    sys.stderr.write(f"oom-lsp: using the last profile of {script}: {path} (--profile to choose another)\n")
    return path


def _build_request(args: argparse.Namespace, config: Any) -> Any:
    from oom_lsp.llm.context import probe_environment
    from oom_lsp.profiling.oom_messages import find_ooms
    from oom_lsp.usecases.ai_fix import PromptError, fix_request

    text, _ = _read_script(args.script)
    oom = None
    if args.error is not None:
        ooms = find_ooms(_read_text(args.error, "the log"))
        if not ooms:
            raise CommandError(f"{args.error}: no out-of-memory error found in it")
        in_script = [
            found for found in ooms if any(Path(f.file).name == args.script.name for f in found.frames)
        ]
        oom = (in_script or ooms)[-1]
    report = estimate = None
    profile = args.profile or _last_profile(args.script)
    if profile is not None:
        from oom_lsp.llm.validation import MeasurementError, read_measurement

        try:
            measurement = read_measurement(profile)
        except MeasurementError as error:
            raise CommandError(str(error)) from None
        report, estimate = (
            (measurement.data, None) if measurement.kind == "profile" else (None, measurement.data)
        )
    try:
        request = fix_request(
            str(args.script),
            text,
            lint_settings=config.settings_for(args.script),
            line=args.line,
            oom=oom,
            report=report,
            estimate=estimate,
            gpu_memory=config.gpu_memory,
        )
    except PromptError:
        raise CommandError(
            f"{args.script}: no finding, error or profile points at a line to fix; give one with --line N"
        ) from None
    return dataclasses.replace(request, environment=probe_environment(args.python))


# --- prompt --------------------------------------------------------------------------------


def run_prompt(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from oom_lsp.llm.prompt import PromptError, build_prompt

    out, err = out or sys.stdout, err or sys.stderr
    try:
        config = _config(args.script)
        request = _build_request(args, config)
        prompt = build_prompt(request, _llm_settings(config).response_format)
    except (CommandError, PromptError) as error:
        return _fail(str(error), err)
    out.write(prompt.markdown(include_system=args.system))
    err.write(f"oom-lsp: ~{prompt.tokens} tokens (characters / 4); nothing was sent\n")
    return EXIT_OK


# --- fix --ai ------------------------------------------------------------------------------


def run_fix(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from oom_lsp.llm.settings import NotReady

    out, err = out or sys.stdout, err or sys.stderr
    if not args.ai:
        return _fail("`fix` needs --ai (deterministic fixes: `oom-lsp check --fix`)", err)
    try:
        config = _config(args.script)
        settings = _llm_settings(config)
        settings.check_ready()
        settings.api_key()
        log = None if args.dry_run else _fix_log(args, settings, config)
    except NotReady as problem:
        return _fail(str(problem), err)
    except CommandError as error:
        return _fail(str(error), err)
    for note in settings.notes():
        err.write(f"oom-lsp: {note}\n")
    from oom_lsp.llm.prompt import PromptError
    from oom_lsp.usecases.ai_fix import propose

    try:
        request = _build_request(args, config)
    except (CommandError, PromptError) as error:
        return _fail(str(error), err)
    err.write(
        f"oom-lsp: asking {settings.model} at {settings.host} about {request.subject} "
        f"({args.script}, line {request.line})\n"
    )
    outcome = asyncio.run(
        propose(request, settings, on_progress=lambda message: err.write(f"oom-lsp: {message}\n"))
    )
    result = outcome.proposal
    if result is None:
        return _fail(outcome.message, err)
    out.write("Diagnosis:\n" + "".join(f"  {line}\n" for line in result.diagnosis().splitlines()))
    if result.fix.validation.step:
        out.write(f"Validation: {result.fix.validation.step}\n")
    if result.edit is None:
        out.write(f"No edit: {result.problem}. {args.script} was not changed.\n")
        return EXIT_NO_FIX
    out.write(result.edit.diff(str(args.script)))
    out.write(f"Changelog: {result.changelog}\n")
    if args.dry_run or log is None:
        out.write(f"--dry-run: {args.script} was not changed.\n")
        return EXIT_OK
    return _apply(args, config, settings, outcome, log, out, err)


def _apply(
    args: argparse.Namespace, config: Any, settings: Any, outcome: Any, log: Path, out: TextIO, err: TextIO
) -> int:
    from oom_lsp.usecases.ai_fix import log_applied, still_current

    try:
        current, encoding = _read_script(args.script)
    except CommandError as error:
        return _fail(str(error), err)
    if not still_current(current, outcome):
        return _fail(
            f"{args.script} changed while the model was answering; nothing was written: run again", err
        )
    result = outcome.proposal
    # The same encoding (a BOM stays) and, in the text, the file's own line endings.
    from oom_lsp import safe_files

    try:
        safe_files.write_through(args.script, result.edit.new_text.encode(encoding), root=config.root)
    except OSError as error:
        return _fail(f"{args.script} was not changed: {error.strerror or error}", err)
    display = _display(args.script, config.root)
    reason = log_applied(
        result, log, display, settings.host, None if args.fix_log is not None else config.root
    )
    if reason is not None:
        out.write(f"Applied to {args.script}.\n")
        err.write(f"oom-lsp: warning: the fix log {log} could not be written: {reason}\n")
    else:
        out.write(f"Applied to {args.script}; logged in {log}.\n")
    out.write(f"Measure it: oom-lsp validate {args.script} --before REPORT.json\n")
    return EXIT_OK


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# --- validate ------------------------------------------------------------------------------


def run_validate(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from oom_lsp.usecases import validate

    out, err = out or sys.stdout, err or sys.stderr
    try:
        if not args.no_log:
            _config(args.script)  # a broken configuration is reported now, not after the run
        if not args.script.is_file():
            raise CommandError(
                f"{args.script}: {'a folder, not a script' if args.script.is_dir() else 'no such file'}"
            )
        before = validate.read_measurement(args.before)
        if args.after is not None:
            result = validate.compare(before, validate.read_measurement(args.after))
        else:
            from oom_lsp.script_args import running_line

            data = before.data
            argv = list((data.argv if before.kind == "profile" else data.args) or [])
            err.write(f"oom-lsp: re-running the {before.kind} of {args.script}\n")
            err.write(running_line("validate", args.script, argv, args.python) + "\n")
            result = validate.measure(
                args.script, before, python=args.python, timeout=args.timeout, out=args.out
            )
    except (CommandError, validate.MeasurementError) as error:
        return _fail(str(error), err)
    after = result.after
    if result.broken_after:
        for message in result.broken_after:
            out.write(f"not validated: {message}\n")
        tail = [line for line in (after.data.output_tail or "").splitlines() if line.strip()][-8:]
        out.writelines(f"  | {line}\n" for line in tail)
        return EXIT_NO_FIX
    if result.refused:
        after_name = args.after or "the new run"
        return _fail(f"{args.before} and {after_name} cannot be compared: {'; '.join(result.refused)}", err)
    for warning in result.warnings:
        err.write(f"warning: {warning}\n")
    out.write(f"peak before: {_format(before.peak)} ({before.kind}, {before.source})\n")
    if after.peak is None:
        out.write(f"peak after:  not measured (the run ended with status `{after.status}`)\n")
        return EXIT_NO_FIX
    out.write(f"peak after:  {_format(after.peak)} ({after.kind}, {after.source})\n")
    change = result.change
    if change is not None:
        noise = f" (within the measurement noise of ±{_format(result.tolerance)}: unchanged)"
        if not (result.within_noise and result.tolerance):
            noise = ""
        out.write(f"change:      {change.render().split(', ', 1)[1]}{noise}\n")
    if after.ran_out_of_memory:
        out.write("it still runs out of memory\n")
    if change is not None and not args.no_log:
        try:
            _record(args, result, out)
        except CommandError as error:
            return _fail(str(error), err)
    return EXIT_NO_FIX if result.grew else EXIT_OK


def _format(size: int | None) -> str:
    from oom_lsp.units import format_bytes

    return format_bytes(size) if size is not None else "unknown"


def _record(args: argparse.Namespace, result: Any, out: TextIO) -> None:
    from oom_lsp.usecases.validate import record

    config = _config(args.script)
    log = _fix_log(args, _llm_settings(config), config)
    root = None if args.fix_log is not None else config.root
    entry = record(result, log, _display(args.script, config.root), root=root)
    if entry:
        out.write(f"recorded in {log} (entry {entry})\n")
