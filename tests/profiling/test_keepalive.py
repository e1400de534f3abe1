"""KeepCodeAlive wraps compile/exec/eval in the profiled process: they must behave as the builtins do."""

import builtins

from oom_lsp.profiling.keepalive import KeepCodeAlive

GLOBAL_SEEN = None


def test_exec_and_eval_keep_the_callers_namespaces():
    local_value = 21
    originals = (builtins.compile, builtins.exec, builtins.eval)
    with KeepCodeAlive() as keeper:
        assert builtins.exec is not originals[1]
        exec("global GLOBAL_SEEN\nGLOBAL_SEEN = 'set by exec'")
        doubled = eval("  local_value * 2")  # eval strips leading blanks, like the builtin
        namespace = {}
        exec("x = 1", namespace)
    assert GLOBAL_SEEN == "set by exec"
    assert doubled == 42
    assert namespace["x"] == 1
    assert len(keeper.kept) == 3
    assert (builtins.compile, builtins.exec, builtins.eval) == originals


def test_compiled_code_is_kept_and_future_flags_follow_the_caller():
    # This module has no `from __future__ import annotations`: annotations stay evaluated.
    with KeepCodeAlive() as keeper:
        code = compile("def f(x: int): pass", "<test>", "exec")
        namespace = {}
        exec(code, namespace)
    assert code in keeper.kept
    assert namespace["f"].__annotations__ == {"x": int}


def test_module_code_of_an_import_is_kept(tmp_path, monkeypatch):
    (tmp_path / "imported_while_profiling.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with KeepCodeAlive() as keeper:
        import imported_while_profiling
    assert imported_while_profiling.VALUE == 7
    assert any(c.co_filename.endswith("imported_while_profiling.py") for c in keeper.kept)
