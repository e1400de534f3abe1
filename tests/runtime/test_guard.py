"""oom_guard on the CPU: an injected torch.OutOfMemoryError raised by a user function inside
guarded code (the fake allocation failure), the report and prompt it leaves, and the exception
the user sees afterwards: the same object, with the same traceback."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import traceback
from pathlib import Path
from types import ModuleType, TracebackType

import pytest
import torch

from oom_lsp.profiling.report import read_report
from oom_lsp.runtime import oom_guard
from oom_lsp.runtime.reports import latest_oom_diagnostic
from tests.conftest import UserConfigWriter
from tests.llm.conftest import GOOD_ANSWER
from tests.llm.fake_server import FakeModelServer

MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
    "1.10 GiB is free. Including non-PyTorch memory, this process has 22.54 GiB memory in use. Of the "
    "allocated memory 21.80 GiB is allocated by PyTorch, and 344.56 MiB is reserved by PyTorch but "
    "unallocated."
)
OLD_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total capacity; 5.01 GiB already "
    "allocated; 2.44 MiB free; 5.16 GiB reserved in total by PyTorch)"
)
TRAINING_MODULE = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        hidden = self.fc(x)
        return allocate_activations(hidden, 4)


def allocate_activations(hidden, factor):
    scratch = torch.zeros(hidden.shape[0], 32, dtype=torch.float16)
    raise torch.OutOfMemoryError(MESSAGE)


def train_step(model, batch):
    inputs, labels = batch
    out = model(inputs)
    return torch.nn.functional.cross_entropy(out, labels)
"""
FAILING_LINE = 16  # raise torch.OutOfMemoryError(MESSAGE)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    return tmp_path


def load_training_module(folder: Path, message: str = MESSAGE) -> ModuleType:
    path = folder / "training.py"
    path.write_text(TRAINING_MODULE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"training_{abs(hash(folder))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.MESSAGE = message
    return module


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(64, 16), torch.zeros(64, dtype=torch.long)


def tb_chain(tb: TracebackType | None) -> list[tuple[TracebackType, str, int]]:
    chain = []
    while tb is not None:
        chain.append((tb, tb.tb_frame.f_code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    return chain


def test_injected_oom_writes_report_and_prompt_and_reraises_the_same_exception(project: Path) -> None:
    training = load_training_module(project)
    messages: list[str] = []
    seen: dict[str, object] = {}
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with oom_guard(project_root=project, log=messages.append):
            try:
                training.train_step(training.Net(), batch())
            except torch.OutOfMemoryError as error:
                seen["error"] = error
                seen["chain"] = tb_chain(error.__traceback__)
                seen["formatted"] = traceback.format_exception(error)
                raise

    error = caught.value
    assert error is seen["error"]
    assert tb_chain(error.__traceback__) == seen["chain"]
    assert traceback.format_exception(error) == seen["formatted"]
    assert error.__cause__ is None and error.__context__ is None
    assert str(error) == MESSAGE

    folder = project / ".oom_lsp" / "last_oom"
    assert messages == [
        f"oom-lsp: out-of-memory report written to {folder / 'report.json'} (prompt: prompt.md)"
    ]
    report = read_report(folder / "report.json")
    assert report.status == "oom"
    assert report.oom is not None
    oom = report.oom.error
    assert oom.exception_type == "torch.OutOfMemoryError"
    assert (oom.tried_to_allocate, oom.free) == (int(1.5 * 2**30), round(1.10 * 2**30))
    failing = oom.failing_frame
    assert failing is not None
    assert (Path(failing.file).name, failing.line, failing.function) == (
        "training.py",
        FAILING_LINE,
        "allocate_activations",
    )
    assert [frame.function for frame in oom.frames][-3:] == ["train_step", "forward", "allocate_activations"]
    assert all("oom_lsp" not in Path(frame.file).parts for frame in oom.frames)
    assert (report.batch_size, report.input_shape) == (64, [64, 16])
    assert report.torch_version == torch.__version__
    assert any("torch sees none" in note for note in report.notes)

    tensors = json.loads((folder / "report.json").read_text())["failing_frame_tensors"]
    by_name = {tensor["name"]: tensor for tensor in tensors}
    assert by_name["hidden"] == {
        "name": "hidden",
        "shape": [64, 8],
        "dtype": "float32",
        "device": "cpu",
        "bytes": 64 * 8 * 4,
        "requires_grad": True,
        "parameter": False,
    }
    assert by_name["scratch"]["shape"] == [64, 32] and by_name["scratch"]["bytes"] == 64 * 32 * 2

    prompt = (folder / "prompt.md").read_text()
    assert "## Error" in prompt and "## Profiling" in prompt and "## Documentation" in prompt
    assert f"training.py:{FAILING_LINE} in allocate_activations" in prompt
    assert "Batch size at the failure: 64 (leading dimension of `x`, shape [64, 16])" in prompt
    assert "hidden: float32[64, 8] on cpu, 2 KiB (requires grad)" in prompt
    assert "scratch: float16[64, 32] on cpu, 4 KiB" in prompt


def test_decorator_form_records_and_keeps_the_traceback(project: Path) -> None:
    training = load_training_module(project)
    seen: dict[str, object] = {}

    @oom_guard(project_root=project, log=lambda message: None)
    def train(model: torch.nn.Module) -> torch.Tensor:
        try:
            return training.train_step(model, batch())
        except torch.OutOfMemoryError as error:
            seen["error"], seen["chain"] = error, tb_chain(error.__traceback__)
            raise

    assert train.__name__ == "train"
    with pytest.raises(torch.OutOfMemoryError) as caught:
        train(training.Net())
    after = tb_chain(caught.value.__traceback__)
    before = seen["chain"]
    assert caught.value is seen["error"]
    assert after[-len(before) :] == before  # only the callers' frames were added on the way out
    report = read_report(project / ".oom_lsp" / "last_oom" / "report.json")
    assert report.oom is not None and report.oom.error.failing_frame.line == FAILING_LINE  # type: ignore[union-attr]


def test_bare_decorator_and_coroutines(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OOM_LSP_PROJECT_ROOT", str(project))
    training = load_training_module(project)

    @oom_guard
    async def train() -> torch.Tensor:
        await asyncio.sleep(0)
        return training.train_step(training.Net(), batch())

    with pytest.raises(torch.OutOfMemoryError):
        asyncio.run(train())
    assert (project / ".oom_lsp" / "last_oom" / "report.json").is_file()


def test_generators_are_refused() -> None:
    with pytest.raises(TypeError, match="put `with oom_guard\\(\\):` inside it"):

        @oom_guard()
        def batches() -> object:
            yield 1


def test_runtime_error_form_of_older_torch(project: Path) -> None:
    training = load_training_module(project, OLD_MESSAGE)

    def fail_like_torch_1(hidden: torch.Tensor, factor: int) -> None:
        raise RuntimeError(OLD_MESSAGE)

    training.allocate_activations = fail_like_torch_1
    with pytest.raises(RuntimeError) as caught:
        with oom_guard(project_root=project, log=lambda message: None):
            training.train_step(training.Net(), batch())
    assert type(caught.value) is RuntimeError
    report = read_report(project / ".oom_lsp" / "last_oom" / "report.json")
    assert report.oom is not None
    assert report.oom.error.exception_type == "RuntimeError"
    assert report.oom.error.tried_to_allocate == 20 * 2**20
    assert report.oom.error.failing_frame.function == "fail_like_torch_1"  # type: ignore[union-attr]


def test_other_exceptions_and_normal_exits_write_nothing(project: Path) -> None:
    with pytest.raises(ValueError):
        with oom_guard(project_root=project):
            raise ValueError("not about memory")
    with pytest.raises(RuntimeError):
        with oom_guard(project_root=project):
            raise RuntimeError("shape mismatch")
    with oom_guard(project_root=project):
        torch.ones(3).sum()
    assert not (project / ".oom_lsp").exists()


def test_a_failing_recording_never_replaces_the_oom(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oom_lsp.runtime import capture

    def broken(exc: BaseException, options: object) -> Path:
        raise OSError("disk full")

    monkeypatch.setattr(capture, "record_oom", broken)
    messages: list[str] = []
    error = torch.OutOfMemoryError(MESSAGE)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with oom_guard(project_root=project, log=messages.append):
            raise error
    assert caught.value is error and caught.value.__context__ is None
    assert "could not write the out-of-memory report" in messages[0] and "disk full" in messages[0]


def test_record_history_without_cuda_is_noted_not_fatal(project: Path) -> None:
    messages: list[str] = []
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, record_history=True, log=messages.append):
            raise torch.OutOfMemoryError(MESSAGE)
    assert "needs a CUDA device" in messages[0]
    report = read_report(project / ".oom_lsp" / "last_oom" / "report.json")
    assert report.artifacts.snapshot is None


def test_the_diagnostic_for_the_language_server(project: Path) -> None:
    training = load_training_module(project)
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, log=lambda message: None):
            training.train_step(training.Net(), batch())
    diagnostic = latest_oom_diagnostic(project / ".oom_lsp" / "last_oom" / "report.json")
    assert diagnostic is not None
    path, line, message, facts = diagnostic
    assert (Path(path).name, line) == ("training.py", FAILING_LINE)
    assert message == "CUDA out of memory here: tried to allocate 1.5 GiB with 1.1 GiB free, batch 64"
    assert facts["prompt"] == str(project / ".oom_lsp" / "last_oom" / "prompt.md")
    assert facts["batch_size"] == 64 and facts["tried_to_allocate"] == int(1.5 * 2**30)


def _enable_llm(user_config: UserConfigWriter, base_url: str) -> None:
    user_config(llm={"enabled": True, "base-url": base_url, "model": "test-model"})


def test_ask_writes_the_answer_beside_the_report_and_changes_no_code(
    project: Path, user_config: UserConfigWriter
) -> None:
    training = load_training_module(project)
    answer = GOOD_ANSWER.replace("line 15 adds `loss`", "line 16 allocates").split("## Edits")[0] + (
        "## Edits\n## Validation\nThe peak stays under the capacity.\n## Changelog\nHalve the batch size\n"
    )
    with FakeModelServer() as server:
        server.script({"content": answer})
        _enable_llm(user_config, server.base_url)
        messages: list[str] = []
        with pytest.raises(torch.OutOfMemoryError):
            with oom_guard(project_root=project, ask=True, log=messages.append):
                training.train_step(training.Net(), batch())
        sent = server.requests[0]["body"]["messages"][1]["content"]
    folder = project / ".oom_lsp" / "last_oom"
    written = (folder / "answer.md").read_text()
    assert "1. Loss accumulated with its graph (high)" in written
    assert "Halve the batch size" in written
    assert "Batch size at the failure: 64" in sent  # the same facts as prompt.md
    assert (project / "training.py").read_text() == TRAINING_MODULE
    assert any("diagnosis written" in message for message in messages)


def test_ask_failures_are_logged_and_the_oom_still_propagates(
    project: Path, user_config: UserConfigWriter
) -> None:
    with FakeModelServer() as server:
        server.script({"status": 401, "error": "bad key"})
        _enable_llm(user_config, server.base_url)
        training = load_training_module(project)
        messages: list[str] = []
        with pytest.raises(torch.OutOfMemoryError):
            with oom_guard(project_root=project, ask=True, log=messages.append):
                training.train_step(training.Net(), batch())
    assert (project / ".oom_lsp" / "last_oom" / "report.json").is_file()
    assert any(message.startswith("oom-lsp: could not ask for a diagnosis") for message in messages)
    assert not (project / ".oom_lsp" / "last_oom" / "answer.md").exists()


def test_ask_with_ai_fixes_disabled_sends_nothing(project: Path) -> None:
    training = load_training_module(project)
    messages: list[str] = []
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, ask=True, log=messages.append):
            training.train_step(training.Net(), batch())
    assert "AI fixes are disabled, and nothing was sent" in messages[-1]


def test_ask_ignores_a_project_that_enables_itself(project: Path) -> None:
    """A repository's own pyproject.toml cannot send its code (and a key) anywhere."""
    with FakeModelServer() as server:
        (project / "pyproject.toml").write_text(
            f'[tool.oom-lsp.llm]\nenabled = true\nbase-url = "{server.base_url}"\nmodel = "m"\n', encoding="utf-8"
        )
        training = load_training_module(project)
        messages: list[str] = []
        with pytest.raises(torch.OutOfMemoryError):
            with oom_guard(project_root=project, ask=True, log=messages.append):
                training.train_step(training.Net(), batch())
        assert server.requests == []
    assert "which a project cannot decide for you" in messages[-1]


def test_importing_the_runtime_loads_neither_libcst_nor_torch() -> None:
    import subprocess

    code = (
        "import sys; from oom_lsp.runtime import oom_guard, memory_monitor; "
        "print(sorted(m for m in ('torch', 'libcst', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_explain_last(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from oom_lsp.cli import main

    monkeypatch.chdir(project)
    monkeypatch.delenv("OOM_LSP_PROJECT_ROOT", raising=False)
    assert main(["explain", "--last"]) == 1  # the root is found from the current folder
    assert "no out-of-memory report" in capsys.readouterr().err
    training = load_training_module(project)
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, log=lambda message: None):
            training.train_step(training.Net(), batch())
    assert main(["explain", "--last"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (
        f"{project / 'training.py'}:{FAILING_LINE}: CUDA out of memory here: tried to allocate 1.5 GiB "
        "with 1.1 GiB free, batch 64"
    )
    assert "    hidden: float32[64, 8] on cpu, 2 KiB (requires grad)" in text
    assert text.rstrip().endswith("(also prompt.md)")
    assert main(["explain", "--last", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["diagnostic"]["line"] == FAILING_LINE and data["ooms"][0]["backend"] == "cuda"
    assert main(["explain"]) == 2


def test_project_root_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oom_lsp.runtime.reports import find_project_root

    script = tmp_path / "repo" / "src" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("", encoding="utf-8")
    (tmp_path / "repo" / ".git").mkdir()
    assert find_project_root(script, environ={}) == tmp_path / "repo"
    (tmp_path / "repo" / "src" / "pyproject.toml").write_text("", encoding="utf-8")
    assert find_project_root(script, environ={}) == tmp_path / "repo" / "src"
    assert find_project_root(script, environ={"OOM_LSP_PROJECT_ROOT": str(tmp_path)}) == tmp_path
    monkeypatch.chdir(tmp_path)
    assert find_project_root(Path("/"), environ={}) == tmp_path  # no marker anywhere: the current folder


def test_nested_guards_record_once(project: Path) -> None:
    training = load_training_module(project)
    messages: list[str] = []

    @oom_guard(project_root=project, log=messages.append)
    def train() -> torch.Tensor:
        return training.train_step(training.Net(), batch())

    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, log=messages.append):
            train()
    assert len(messages) == 1
    # A new error is recorded again, even from the same line.
    with pytest.raises(torch.OutOfMemoryError):
        train()
    assert len(messages) == 2
