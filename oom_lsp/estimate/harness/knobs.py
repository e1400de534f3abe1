"""Where the script sets its batch size (what the editor decorates, what `--batch-size` and
`--find-max-batch` change):

- argparse options named like a batch size (`--batch-size`, `--bs`, ...);
- `DataLoader(batch_size=...)` (in `data`);
- module globals of the script (`batch_size = 12`, nanoGPT's, which its configurator overrides from
  a config file or `--batch_size=8`): `run_script` runs the script with a mapping for its module-level
  names that sees each store and load (functions keep the module's own dict as their globals);
- `TrainingArguments(per_device_train_batch_size=...)` of Hugging Face Transformers (and its
  subclasses), patched when `transformers.training_args` is imported;
- Lightning: a `batch_size` parameter of a `LightningDataModule`'s or `LightningModule`'s
  `__init__` (a hyperparameter), passed at the call or left to its default."""

from __future__ import annotations

import argparse
import collections.abc
import functools
import importlib.abc
import importlib.util
import inspect
import io
import linecache
import os
import re
import runpy
import sys

BATCH_OPTION_NAMES = {
    "batch_size",
    "bs",
    "batch",
    "train_batch_size",
    "per_device_train_batch_size",
    "micro_batch_size",
}
# Module globals: not `batch`, a loop variable as often as a size (`for batch in range(n)`).
GLOBAL_BATCH_NAMES = BATCH_OPTION_NAMES - {"batch"}
# How far below a call's first line its keyword argument is looked for.
_CALL_LINES = 40


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

    def training_arguments(module) -> None:
        cls = getattr(module, "TrainingArguments", None)
        if cls is None or not hasattr(cls, "__post_init__"):
            return
        original_post_init = cls.__post_init__

        def post_init(self):
            name = "per_device_train_batch_size"
            add_knob(state, context, f"TrainingArguments({name}=...)", keyword=name)
            if batch_override is not None:
                setattr(self, name, batch_override)
                state["override_applied"].append(f"TrainingArguments({name}=...)")
            state["knob_batch"] = getattr(self, name)
            return original_post_init(self)

        shims.patch(cls, "__post_init__", post_init)

    def lightning(module, base_name: str) -> None:
        base = getattr(module, base_name, None)
        if base is None:
            return
        own = base.__dict__.get("__init_subclass__")

        def init_subclass(cls, **kwargs):
            if own is not None:
                own.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            init = cls.__dict__.get("__init__")
            if init is not None and not hasattr(init, "__oom_lsp_knob__"):
                cls.__init__ = _knob_init(init, f"{base_name}.__init__", batch_override, context, state)

        base.__init_subclass__ = classmethod(init_subclass)
        shims.at_undo(
            lambda: (
                setattr(base, "__init_subclass__", own)
                if own is not None
                else delattr(base, "__init_subclass__")
            )
        )

    hooks = {"transformers.training_args": training_arguments}
    for package in ("lightning.pytorch", "pytorch_lightning"):
        hooks[f"{package}.core.datamodule"] = functools.partial(lightning, base_name="LightningDataModule")
        hooks[f"{package}.core.module"] = functools.partial(lightning, base_name="LightningModule")
    finder = AfterImport(hooks)
    for name, hook in hooks.items():
        if name in sys.modules:  # imported by an earlier run in this interpreter
            hook(sys.modules[name])
    sys.meta_path.insert(0, finder)
    shims.at_undo(lambda: sys.meta_path.remove(finder))


def _knob_init(init, kind: str, batch_override, context, state: dict):
    """A subclass's `__init__` whose batch-size parameter is a knob: its value read (and
    overridden) at each instantiation."""
    try:
        signature = inspect.signature(init)
    except (TypeError, ValueError):
        return init
    names = [name for name in signature.parameters if name in BATCH_OPTION_NAMES]
    if not names:
        return init
    name = names[0]

    @functools.wraps(init)
    def knob_init(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return init(self, *args, **kwargs)
        value = bound.arguments.get(name, signature.parameters[name].default)
        if not isinstance(value, int) or isinstance(value, bool):
            return init(self, *args, **kwargs)
        if name in bound.arguments:
            add_knob(state, context, f"{kind}({name}=...)", keyword=name)
        else:  # its default, on the def's line
            code = init.__code__
            line = _keyword_line(code.co_filename, code.co_firstlineno, name) or code.co_firstlineno
            add_knob(state, context, f"{kind}({name}=...)", where=(code.co_filename, line))
        if batch_override is not None:
            bound.arguments[name] = batch_override
            state["override_applied"].append(f"{kind}({name}=...)")
        state["knob_batch"] = bound.arguments.get(name, value)
        return init(*bound.args, **bound.kwargs)

    knob_init.__oom_lsp_knob__ = True
    return knob_init


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `hooks[name](module)` once the module `name` has been executed (imported by the
    script, when and if it is): libraries are patched without being imported by the harness."""

    def __init__(self, hooks: dict):
        self.hooks = hooks
        self.finding: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or name in self.finding:
            return None
        self.finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, self.hooks[name])
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, hook):
        self.loader = loader
        self.hook = hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.hook(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class ModuleNames(collections.abc.MutableMapping):
    """The script's module-level names as its code stores and loads them (the `locals` of its
    module code; the module's own dict stays its globals, written through): a store of a
    batch-size name is a knob (its line, when the code runs from a file of the script's), and
    with an override each load gives the override."""

    def __init__(self, module_globals: dict, override, context, state: dict):
        self.globals = module_globals
        self.override = override
        self.context = context
        self.state = state

    def __getitem__(self, name):
        value = self.globals[name]
        if name in GLOBAL_BATCH_NAMES and isinstance(value, int) and not isinstance(value, bool):
            if self.override is not None and value != self.override:
                value = self.globals[name] = self.override
                self.state["override_applied"].append(f"global {name}")
            self.state["knob_batch"] = value
        return value

    def __setitem__(self, name, value):
        if name in GLOBAL_BATCH_NAMES and isinstance(value, int) and not isinstance(value, bool):
            frame = sys._getframe(1)
            if os.path.isfile(frame.f_code.co_filename):  # not exec'd text: no line to show
                add_knob(
                    self.state,
                    self.context,
                    f"global {name}",
                    where=(frame.f_code.co_filename, frame.f_lineno),
                )
            if self.override is not None:
                value = self.override
                self.state["override_applied"].append(f"global {name}")
            self.state["knob_batch"] = value
        self.globals[name] = value

    def __delitem__(self, name):
        del self.globals[name]

    def __contains__(self, name):
        return name in self.globals

    def __iter__(self):
        return iter(self.globals)

    def __len__(self):
        return len(self.globals)


def run_script(path: str, request: dict, context, state: dict) -> None:
    """`runpy.run_path(path, run_name="__main__")` for a script file, its module-level names
    seen by `ModuleNames`."""
    if not os.path.isfile(path):
        runpy.run_path(path, run_name="__main__")
        return
    with io.open_code(path) as handle:
        source = handle.read()
    code = compile(source, path, "exec", dont_inherit=True)
    with runpy._TempModule("__main__") as temp:
        module_globals = temp.module.__dict__
        module_globals.update(
            __name__="__main__",
            __file__=path,
            __cached__=None,
            __doc__=None,
            __loader__=None,
            __package__=None,
            __spec__=None,
        )
        names = ModuleNames(module_globals, request.get("batch_size"), context, state)
        exec(code, module_globals, names)  # noqa: S102 - the user's script, as runpy.run_path runs it


def _keyword_line(filename: str, first: int, keyword: str) -> int | None:
    """The line, from `first` on, where `keyword=` is written (a call's or a def's keyword)."""
    pattern = re.compile(rf"\b{re.escape(keyword)}\b\s*(:[^=]*)?=")
    for line in range(first, first + _CALL_LINES):
        text = linecache.getline(filename, line)
        if not text:
            return None
        if pattern.search(text):
            return line
    return None


def add_knob(state: dict, context, kind: str, keyword: str | None = None, where=None) -> None:
    """Where the script sets its batch size: what the editor decorates. `keyword`: the keyword
    argument of the call on the user's line, looked for on the call's lines."""
    if where is None:
        where = context.user_line()
        if where is not None and keyword:
            where = (where[0], _keyword_line(where[0], where[1], keyword) or where[1])
    key = (kind, where)
    if key not in state["batch_knobs"]:
        state["batch_knobs"][key] = {
            "kind": kind,
            "file": where[0] if where else None,
            "line": where[1] if where else None,
        }
