"""Options written after the user's script on the command line.

`oom-lsp profile train.py --steps 2 -- --lr 3e-4` and `oom-lsp estimate ...`
accept their own options after SCRIPT; what follows `--` belongs to the
script. argparse cannot express that order, so the commands parse the tail
themselves with the same option definitions.

Such a command's parser sets the default `takes_script_args=True`, and the
CLI cuts the command line at the first `--` before argparse sees it
(`args.script_tail`): argparse gives a `--` right after an optional
positional to that positional, so `estimate train.py -- --lr 3` would
otherwise lose it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def split_script_arguments(
    args: argparse.Namespace,
    command: str,
    add_options: Callable[..., None],
) -> str | None:
    """Parse the options in `args.rest` into `args` and set `args.script_args`
    to what follows `--`. Returns an error message, or None."""
    rest = list(args.rest)
    tail = getattr(args, "script_tail", None)
    if tail is not None:
        options, args.script_args = rest, list(tail)
    elif "--" in rest:
        cut = rest.index("--")
        options, args.script_args = rest[:cut], rest[cut + 1 :]
    else:
        options, args.script_args = rest, []
    late = argparse.ArgumentParser(prog=f"oom-lsp {command}", add_help=False, exit_on_error=False)
    add_options(late, defaults=False)
    try:
        parsed, unknown = late.parse_known_args(options)
    except argparse.ArgumentError as error:  # a bad value: `--timeout -1`
        return str(error)
    if unknown:
        return f"unknown {command} option(s) {' '.join(unknown)}: put the script's own arguments after --"
    for name, value in vars(parsed).items():
        setattr(args, name, value)
    return None


def running_line(command: str, script: object, script_args: list[str], python: str) -> str:
    """What a command that runs the user's code says before it does (on stderr, whatever the
    output format): the script, its arguments and the interpreter, so that running a
    project's code is never a surprise."""
    import shlex

    return f"oom-lsp {command}: running {shlex.join([str(script), *map(str, script_args)])} with {python}"


def positive_seconds(value: str) -> float:
    """An argparse type for a timeout: a positive, finite number of seconds (`--timeout -1`,
    `0` or `nan` would never stop a run, or stop it at once)."""
    import math

    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds
