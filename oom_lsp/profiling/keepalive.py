"""Keep the code objects a profiled run creates alive until its profile has been read.

torch's Python tracer (torch 2.x, `with_stack=True`) stores pointers to the names of the code
objects it sees, not references to them. A code object that dies before the profile is read
turns its events' names into freed memory: garbage or a UnicodeDecodeError in
`export_stacks`. The code objects that die during an ordinary training run are those of
modules imported while profiling (importlib execs a module's code once, then drops it) and
of code built at run time by exec/eval/compile (dataclasses, namedtuple, ...). While active,
`KeepCodeAlive` wraps `builtins.compile`, `exec` and `eval` to hold a reference to every
code object that goes through them; the wrappers keep the caller's globals, locals and
`from __future__` flags, so the executed code behaves as without them.
"""

import __future__
import builtins
import sys
import types

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


def _caller_future_flags():
    return sys._getframe(2).f_code.co_flags & _FUTURE_FLAGS


class KeepCodeAlive:
    def __init__(self):
        self.kept = []
        self._saved = None

    def __enter__(self):
        original_compile, original_exec, original_eval = self._saved = (builtins.compile, builtins.exec, builtins.eval)
        kept = self.kept

        def compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
            if not dont_inherit:
                flags |= _caller_future_flags()
            code = original_compile(source, filename, mode, flags, True, optimize, **kwargs)
            if isinstance(code, types.CodeType):
                kept.append(code)
            return code

        def runner(original, mode):
            def run(source, globals=None, locals=None, *args, **kwargs):
                if globals is None:
                    caller = sys._getframe(1)
                    globals = caller.f_globals
                    if locals is None:
                        locals = caller.f_locals
                if isinstance(source, (str, bytes, bytearray)):
                    if mode == "eval":
                        source = source.lstrip(b" \t" if isinstance(source, (bytes, bytearray)) else " \t")
                    source = original_compile(source, "<string>", mode, _caller_future_flags(), True)
                if isinstance(source, types.CodeType):
                    kept.append(source)
                return original(source, globals, locals, *args, **kwargs)

            return run

        builtins.compile = compile
        builtins.exec = runner(original_exec, "exec")
        builtins.eval = runner(original_eval, "eval")
        return self

    def __exit__(self, *exc_info):
        builtins.compile, builtins.exec, builtins.eval = self._saved
        return False
