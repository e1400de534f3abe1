"""Facts across the files of a project (oom_lsp.analysis.facts.project)."""

from __future__ import annotations

import textwrap

from oom_lsp.analysis import LintSettings
from oom_lsp.analysis.engine import analyze_file
from oom_lsp.analysis.facts.library import Grad
from oom_lsp.analysis.facts.project import FileSummary, incoming_calls, module_name

ENGINE = textwrap.dedent(
    """
    import torch

    def evaluate(model, loader):
        model.eval()
        return [model(x) for x in loader]

    class Runner:
        def validate(self, model, loader):
            model.eval()
            return [model(x) for x in loader]
    """
)
TRAIN = textwrap.dedent(
    """
    import torch
    from pkg import engine
    from .engine import Runner

    def main(model, loader):
        runner = Runner()
        with torch.no_grad():
            engine.evaluate(model, loader)
            runner.validate(model, loader)

    main(None, [])
    """
)
SETTINGS = LintSettings(enabled=frozenset({"OOM303"}))


def _summary(source: str, path: str) -> FileSummary:
    summary = analyze_file(source, SETTINGS, path, module=module_name(path)).summary
    assert summary is not None
    return summary


def test_module_names_of_paths() -> None:
    assert module_name("pkg/engine.py") == "pkg.engine"
    assert module_name("pkg/__init__.py") == "pkg"
    assert module_name("scripts/my-tool.py") is None
    assert module_name("notes.txt") is None


def test_calls_into_the_project_are_summarised_with_their_grad_mode() -> None:
    summary = _summary(TRAIN, "pkg/train.py")
    calls = {(call.target, Grad(call.grad)) for call in summary.calls}
    assert ("pkg.engine.evaluate", Grad.OFF) in calls
    assert ("pkg.engine.Runner.validate", Grad.OFF) in calls
    assert FileSummary.from_dict(summary.to_dict()) == summary


def test_a_caller_in_another_file_decides_the_grad_mode() -> None:
    alone = analyze_file(ENGINE, SETTINGS, "pkg/engine.py").findings
    assert [finding.line for finding in alone] == [6, 11]  # self-contained evaluation, callers unknown
    facts = incoming_calls([_summary(TRAIN, "pkg/train.py"), _summary(ENGINE, "pkg/engine.py")])
    assert facts["pkg.engine"].incoming == {
        "evaluate": Grad.OFF,
        "Runner.validate": Grad.OFF,
        "Runner.__init__": Grad.ON,
    }
    with_project = analyze_file(ENGINE, SETTINGS, "pkg/engine.py", project=facts["pkg.engine"]).findings
    assert with_project == []


def test_a_caller_with_grad_in_another_file_keeps_the_finding() -> None:
    with_grad = TRAIN.replace("with torch.no_grad():", "if True:")
    facts = incoming_calls([_summary(with_grad, "pkg/train.py"), _summary(ENGINE, "pkg/engine.py")])
    findings = analyze_file(ENGINE, SETTINGS, "pkg/engine.py", project=facts["pkg.engine"]).findings
    assert [finding.line for finding in findings] == [6, 11]


MODEL = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def forward(self, x):
            return x

    if __name__ == "__main__":
        with torch.no_grad():
            Net()(torch.zeros(1))
    """
)
TRAINS_MODEL = textwrap.dedent(
    """
    import torch
    from pkg.model import Net

    def train(loader):
        net = Net()
        for x in loader:
            net(x).sum().backward()
    """
)


def test_a_module_made_in_another_file_runs_there_under_modes_this_file_cannot_see() -> None:
    import libcst as cst

    from oom_lsp.analysis.context import FileContext
    from oom_lsp.analysis.facts.contexts import call_graph

    def forward_grad(project: object) -> Grad:
        context = FileContext(
            source=MODEL, module=cst.parse_module(MODEL), settings=SETTINGS, path="pkg/model.py", project=project
        )
        graph = call_graph(context)
        [forward] = [f for f in graph.program.functions if f.qualname == "Net.forward"]
        return graph.entry_grad(forward)

    from oom_lsp.analysis.settings import default_settings

    def summary(source: str, path: str) -> FileSummary:
        found = analyze_file(source, default_settings(), path, module=module_name(path)).summary
        assert found is not None
        return found

    assert forward_grad(None) == Grad.OFF  # alone, the smoke test is its only caller
    facts = incoming_calls([summary(TRAINS_MODEL, "pkg/train.py"), summary(MODEL, "pkg/model.py")])
    assert Grad.UNKNOWN in forward_grad(facts["pkg.model"])
