"""Where the script sets its batch size (what the editor decorates, what
`--batch-size` and `--find-max-batch` change): argparse options named like a
batch size, and `DataLoader(batch_size=...)` (in `data`)."""

from __future__ import annotations

import argparse

BATCH_OPTION_NAMES = {
    "batch_size",
    "bs",
    "batch",
    "train_batch_size",
    "per_device_train_batch_size",
    "micro_batch_size",
}


def install(shims, request: dict, context, state: dict) -> None:
    batch_override = request.get("batch_size")

    # argparse: the batch-size option's parsed value is read, and replaced by
    # the override (whatever the command line said).
    original_add_argument = argparse._ActionsContainer.add_argument

    def add_argument(self, *args, **kwargs):
        action = original_add_argument(self, *args, **kwargs)
        names = {arg.lstrip("-").replace("-", "_") for arg in args if isinstance(arg, str)} | {action.dest}
        if names & BATCH_OPTION_NAMES:
            add_knob(state, context, f"argparse {args[0] if args else action.dest}")
            state["batch_dests"].add(action.dest)
        return action

    original_parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = original_parse_known_args(self, args, namespace)
        for dest in state["batch_dests"]:
            if hasattr(parsed, dest):
                if batch_override is not None:
                    setattr(parsed, dest, batch_override)
                    state["override_applied"].append(f"argparse {dest}")
                if isinstance(getattr(parsed, dest), int):
                    state["argparse_batch"] = getattr(parsed, dest)
        return parsed, extras

    state["override_applied"] = []
    state["batch_knobs"] = {}
    state["batch_dests"] = set()
    shims.patch(argparse._ActionsContainer, "add_argument", add_argument)
    shims.patch(argparse.ArgumentParser, "parse_known_args", parse_known_args)


def add_knob(state: dict, context, kind: str) -> None:
    """Where the script sets its batch size: what the editor decorates."""
    where = context.user_line()
    key = (kind, where)
    if key not in state["batch_knobs"]:
        state["batch_knobs"][key] = {
            "kind": kind,
            "file": where[0] if where else None,
            "line": where[1] if where else None,
        }
