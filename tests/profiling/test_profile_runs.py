"""Real profiling runs on the CPU of the scripts in fixtures/profiling/, through the runner.

Each script runs once per module (a few seconds each); the tests read its report.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from oom_lsp.profiling.importers import import_profile
from oom_lsp.profiling.report import Report, read_report
from oom_lsp.profiling.runner import ProfileError, ProfileRequest, profile

pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiling"
MiB = 1024**2
GiB = 1024**3


def line_of(script: str, marker: str) -> int:
    lines = (FIXTURES / script).read_text().splitlines()
    (number,) = [i for i, text in enumerate(lines, 1) if marker in text]
    return number


class Run:
    def __init__(self, report: Report, out: Path, events: list[dict], output: list[str]) -> None:
        self.report, self.out, self.events, self.output = report, out, events, output


def run_fixture(tmp_path_factory, script: str, steps: int, args=(), **options) -> Run:
    out = tmp_path_factory.mktemp(script.removesuffix(".py"))
    events: list[dict] = []
    output: list[str] = []
    request = ProfileRequest(FIXTURES / script, out, list(args), steps=steps, device="cpu", **options)
    report = profile(request, on_progress=events.append, on_output=output.append)
    return Run(report, out, events, output)


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> Run:
    return run_fixture(tmp_path_factory, "known_tensors.py", steps=2)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Run:
    return run_fixture(tmp_path_factory, "small_cnn.py", steps=2, args=["--batch-size", "4"])


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Run:
    return run_fixture(tmp_path_factory, "small_transformer.py", steps=2)


def test_known_tensors_peaks_per_step(known):
    report = known.report
    assert report.status == "completed"
    assert [s.index for s in report.steps] == [1, 2]
    assert all(s.complete for s in report.steps)
    for step in report.steps:
        # 12 MiB of buffers plus a 16-float parameter, its gradient and a few scalars.
        assert 12 * MiB <= step.peak_allocated <= 12 * MiB + 1024
    assert report.peak_allocated == max(s.peak_allocated for s in report.steps)
    assert report.device.type == "cpu"
    assert report.measured_with == "cpu-profiler"


def test_known_tensors_lines(known):
    first, second = known.report.top_lines[:2]
    # make_buffers lives in a module next to the script, imported while profiling.
    assert (first.line, first.bytes, first.function) == (line_of("known_buffers.py", "# 8 MiB"), 8 * MiB, "make_buffers")
    assert (second.line, second.bytes) == (line_of("known_buffers.py", "# 4 MiB"), 4 * MiB)
    assert first.file == second.file == str(FIXTURES / "known_buffers.py")
    assert first.code.startswith("large = torch.ones(")
    assert all(usage.bytes < 1024 for usage in known.report.top_lines[2:])


def test_known_tensors_artifacts_progress_and_round_trip(known):
    report = known.report
    assert (known.out / report.artifacts.trace).stat().st_size > 0
    stacks = (known.out / report.artifacts.stacks).read_text().splitlines()
    definition = line_of("known_buffers.py", "def make_buffers")
    buffers = [line for line in stacks if f"known_buffers.py({definition}):_make_buffers;" in line]
    assert len(buffers) == 1 and buffers[0].endswith(f" {12 * MiB}")  # flame graph: both buffers, one stack
    assert buffers[0].startswith(f"{FIXTURES / 'known_tensors.py'}(0):_<module>;")
    assert sum(int(line.rsplit(" ", 1)[1]) for line in stacks) == report.peak_allocated
    on_disk = read_report(known.out / "report.json")
    assert on_disk.to_dict() == report.to_dict()
    assert Report.from_dict(report.to_dict()).to_dict() == report.to_dict()
    kinds = [e["event"] for e in known.events]
    assert kinds == ["started", "step", "step", "analysing", "done"]
    assert [e["step"] for e in known.events if e["event"] == "step"] == [1, 2]
    assert report.exit_code == 0


def test_chrome_trace_import_reproduces_the_steps(known):
    imported = import_profile(known.out / "trace.json")
    assert imported.status == "imported"
    # The trace starts with training (the optimizer's creation): the 16-float parameter made
    # before it counts in the profile's peaks, not in the trace's.
    assert [s.peak_allocated + 64 for s in imported.steps] == [s.peak_allocated for s in known.report.steps]
    top = imported.top_lines[0]
    # A chrome trace has no call-site lines: the function that allocated, at its def line.
    assert (top.file, top.function, top.line, top.bytes) == (
        str(FIXTURES / "known_buffers.py"), "make_buffers", line_of("known_buffers.py", "def make_buffers"), 12 * MiB
    )


def test_cnn(cnn):
    report = cnn.report
    assert report.status == "completed"
    assert len(report.steps) == 2
    assert (report.batch_size, report.input_shape) == (4, [4, 3, 32, 32])
    parameters = 4 * ((3 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 8 * 8 * 10 + 10))
    by_line = {usage.line: usage.bytes for usage in report.top_lines}
    init_lines = range(line_of("small_cnn.py", "self.features = nn.Sequential("), line_of("small_cnn.py", "self.head =") + 1)
    assert sum(b for line, b in by_line.items() if line in init_lines) == parameters
    assert by_line[line_of("small_cnn.py", "optimizer.step()")] >= 2 * parameters  # AdamW's two moments
    assert line_of("small_cnn.py", "return self.head(") in by_line
    assert report.steps[1].peak_allocated >= 3 * parameters
    assert report.top_modules and all(m.name.startswith("Net.") for m in report.top_modules)


def test_transformer(transformer):
    report = transformer.report
    assert report.status == "completed"
    assert len(report.steps) == 2
    assert (report.batch_size, report.input_shape) == (4, [4, 32])
    names = {m.name for m in report.top_modules}
    assert "TinyLM.encoder.layers.0.self_attn" in names
    assert report.top_lines[0].line == line_of("small_transformer.py", "return self.out(self.encoder(")


def test_crash(tmp_path_factory):
    run = run_fixture(tmp_path_factory, "crashes.py", steps=2)
    assert run.report.status == "error"
    assert run.report.error == "ValueError: corrupt shard 17"
    assert run.report.exit_code == 1
    assert 'raise ValueError("corrupt shard 17")' in run.report.output_tail


def test_sys_exit(tmp_path_factory):
    run = run_fixture(tmp_path_factory, "calls_exit.py", steps=3)
    report = run.report
    assert (report.status, report.exit_code) == ("exited", 3)
    assert report.steps[0].complete
    assert "leaving early" in report.output_tail


def test_fake_oom_is_reported_on_the_user_line(tmp_path_factory):
    run = run_fixture(tmp_path_factory, "fake_oom.py", steps=3)
    report = run.report
    assert report.status == "oom"
    failing = report.oom.error.failing_frame
    assert (failing.file, failing.line, failing.function) == (
        str(FIXTURES / "fake_oom.py"), line_of("fake_oom.py", "raise RuntimeError(MESSAGE)"), "grow_activations"
    )
    assert report.oom.error.frames[0].line == line_of("fake_oom.py", "    grow_activations(batch)")
    assert report.oom.error.tried_to_allocate == 2 * GiB
    assert report.oom.step == 2
    assert report.steps[0].complete and not report.steps[-1].complete
    assert read_report(run.out / "report.json").oom.to_dict() == report.oom.to_dict()


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in ("Z", "X")


def _child_pid(output: list[str]) -> int | None:
    for line in output:
        match = re.fullmatch(r"child (\d+)", line.strip())
        if match:
            return int(match.group(1))
    return None


@pytest.mark.serial  # counts processes: the serial pass
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_timeout_kills_the_whole_process_group(tmp_path):
    from oom_lsp.profiling.runner import ProfileRun

    child_started = threading.Event()
    output: list[str] = []

    def watch(line: str) -> None:
        output.append(line)
        if _child_pid([line]) is not None:
            child_started.set()

    run = ProfileRun(ProfileRequest(FIXTURES / "hangs.py", tmp_path, steps=1, device="cpu", timeout=1), on_output=watch)
    run.start()
    assert child_started.wait(60), output  # the script got as far as starting its child
    started = time.monotonic()
    report = run.wait()  # the timeout counts from here
    assert report.status == "timeout"
    assert 1 <= time.monotonic() - started < 10
    child = _child_pid(output)
    assert not _alive(run.pid)
    assert not _alive(child)
    assert _group_members(run.pid) == []
    assert read_report(tmp_path / "report.json").status == "timeout"
    assert "killed after 1 s" in report.notes[0]


@pytest.mark.serial  # counts processes: the serial pass
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_cancel_kills_the_whole_process_group(tmp_path):
    from oom_lsp.profiling.runner import ProfileRun

    cancel = threading.Event()
    output: list[str] = []

    def watch(line: str) -> None:
        output.append(line)
        if _child_pid([line]) is not None:
            cancel.set()

    run = ProfileRun(ProfileRequest(FIXTURES / "hangs.py", tmp_path, device="cpu", timeout=60), on_output=watch,
                     cancel=cancel)
    run.start()
    report = run.wait()
    assert report.status == "cancelled"
    child = _child_pid(output)
    assert not _alive(run.pid) and not _alive(child)
    assert _group_members(run.pid) == []


def test_interpreter_without_torch(tmp_path):
    # The same interpreter without site-packages: no torch, but the harness is importable.
    python = tmp_path / "python-without-torch"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    request = ProfileRequest(FIXTURES / "known_tensors.py", tmp_path / "out", python=str(python), timeout=60)
    with pytest.raises(ProfileError, match=re.escape(f"{python} has no torch: install torch in that environment or pass --python")):
        profile(request)


def test_missing_interpreter(tmp_path):
    request = ProfileRequest(FIXTURES / "known_tensors.py", tmp_path, python=str(tmp_path / "nope"))
    with pytest.raises(ProfileError, match="cannot run"):
        profile(request)


def test_cli_profile_end_to_end(tmp_path, capsys):
    from oom_lsp.cli import main

    out = tmp_path / "cli"
    code = main(["profile", str(FIXTURES / "small_cnn.py"), "--steps", "1", "--device", "cpu", "--out", str(out),
                 "--", "--batch-size", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "status: completed" in captured.out
    assert "batch size seen: 2" in captured.out
    assert "step 1/1 done" in captured.err  # plain progress lines: stderr is not a terminal here
    assert read_report(out / "report.json").batch_size == 2


def test_cli_profile_rejects_script_options_before_the_separator(tmp_path, capsys):
    from oom_lsp.cli import main

    code = main(["profile", str(FIXTURES / "small_cnn.py"), "--batch-size", "2", "--out", str(tmp_path)])
    assert code == 2
    assert "put the script's own arguments after --" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


def test_environment_puts_the_package_on_the_path(tmp_path):
    from oom_lsp.profiling.runner import ProfileRun

    env = ProfileRun(ProfileRequest(FIXTURES / "known_tensors.py", tmp_path, device="cpu")).environment()
    package_parent = str(Path(__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == package_parent
    assert env["CUDA_VISIBLE_DEVICES"] == ""


PRINTS_BEFORE_TRAINING = """
import torch

for index in range(20_000):
    print("preparing", index)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(32, 64)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_what_runs_before_training_is_not_traced_but_counted(tmp_path):
    """Python calls are recorded from the start of training, not from the script's first line
    (a million prints before it made a 271 MB trace); what the setup allocated still counts,
    and the parameters keep the lines that made them."""
    script = tmp_path / "train.py"
    script.write_text(PRINTS_BEFORE_TRAINING)
    report = profile(ProfileRequest(script, tmp_path / "out", steps=2, device="cpu"))
    assert report.status == "completed", report.output_tail
    trace = (tmp_path / "out" / "trace.json").read_text()
    assert "built-in function print" not in trace and "train.py(5)" not in trace  # nor the loop of prints
    parameters = 4 * (64 * 256 + 256 + 256 * 8 + 8)
    by_line = {usage.line: usage.bytes for usage in report.top_lines}
    assert by_line.get(6) == parameters  # `model = torch.nn.Sequential(...)`, allocated before training
    assert report.steps[0].peak_allocated >= 2 * parameters  # the weights and their gradients
