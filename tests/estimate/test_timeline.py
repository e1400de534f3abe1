"""The traced step's memory timeline exported in PyTorch's memory-snapshot format
(`oom-lsp estimate --snapshot`), read back by PyTorch's own `torch.cuda._memory_viz`."""

from __future__ import annotations

import base64
import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oom_lsp.estimate.timeline import Alloc, Timeline, to_snapshot
from oom_lsp.profiling.importers import CATEGORIES
from tests import console

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "estimate"


def _replayed_peak(snapshot: dict) -> int:
    """The active-memory peak the viewer draws: allocs add, completed frees subtract (replayed here,
    not with timeline.active_peak: the test must not trust the code it checks)."""
    current = peak = 0
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        peak = max(peak, current)
    return peak


def _memory_viz(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """PyTorch's own snapshot tool, as a user runs it."""
    command = [sys.executable, "-m", "torch.cuda._memory_viz", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_a_freed_block_s_address_is_reused_and_live_blocks_are_the_segments():
    timeline = Timeline(
        [
            [0, 1024, "parameters", "aten.empty", "outside the step", "train.py:3", "Linear"],
            [1, 4096, "activations", "aten.mm", "forward", "train.py:9", "Linear"],
            [1, -4096],
            [2, 4096, "gradients", "aten.mm", "backward", "train.py:10", "Linear"],
        ],
        workspace_bytes=512,
        peak_bytes=512 + 1024 + 4096,
    )
    snapshot = to_snapshot(timeline)
    allocs = [event for event in snapshot["device_traces"][0] if event["action"] == "alloc"]
    assert [event["size"] for event in allocs] == [512, 1024, 4096, 4096]
    assert allocs[2]["addr"] == allocs[3]["addr"]  # the freed 4 KiB block taken again
    assert allocs[2]["frames"] == [
        {"filename": "<aten>", "line": 0, "name": "aten.mm"},
        {"filename": "train.py", "line": 9, "name": "Linear"},
    ]
    assert [event["action"] for event in snapshot["device_traces"][0]].count("free_completed") == 1
    assert sorted(block["size"] for seg in snapshot["segments"] for block in seg["blocks"]) == [
        512,
        1024,
        4096,
    ]
    assert _replayed_peak(snapshot) == timeline.peak()[0] == 512 + 1024 + 4096
    assert isinstance(next(iter(timeline)), Alloc)  # the workspace, first


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_memory_viz_renders_the_export_and_its_peak_is_the_estimate_s(tmp_path, device):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(
        ["estimate", "mlp.py", "--device", device, "--format", "json", "--snapshot", "step.pickle"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert "oom-lsp estimate: wrote step.pickle" in result.stderr
    # PyTorch's own tool renders it: the page embeds the pickle the web viewer then reads.
    viz = _memory_viz(["trace_plot", "step.pickle", "-o", "out.html"], tmp_path)
    assert viz.returncode == 0, viz.stderr
    embedded = re.search(r'"base64": "([^"]+)"', (tmp_path / "out.html").read_text()).group(1)
    snapshot = pickle.loads(base64.b64decode(embedded))
    assert snapshot["device_traces"][0], "an empty trace"
    assert _replayed_peak(snapshot) == estimate["peak_bytes"]
    # ... and its text trace reads every event.
    text = _memory_viz(["trace", "step.pickle"], tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"{len(snapshot['device_traces'][0])} entries" in text.stdout


def _page_peak(page: str) -> int:
    return int(re.search(r'data-peak-bytes="(\d+)"', page).group(1))


def test_the_page_stacks_the_categories_and_marks_the_peak_where_the_estimate_puts_it():
    from oom_lsp.estimate.page import render_page
    from oom_lsp.estimate.results import EstimateResult
    from tests.estimate.factories import prediction, what_if_row, what_if_table

    events = [
        [0, 400, "parameters", "aten.empty", "outside the step", "train.py:3", "fc"],
        [1, 600, "temporaries", "aten.mm", "optimizer step", "train.py:12", "fc"],
        [1, 0, "optimizer_state"],  # known as state once the optimizer keeps it
        [2, 600, "activations", "aten.mm", "forward", "train.py:9", "fc"],
        [2, -600],
    ]
    timeline = Timeline(events, workspace_bytes=0, peak_bytes=1600)
    result = EstimateResult(prediction(peak_bytes=1600, timeline=timeline))
    table = what_if_table("train.py", [what_if_row("knob:bf16", "bf16 autocast", 1500, saving=500)])
    page = render_page(result, table)
    assert _page_peak(page) == 1600 == timeline.peak()[0]
    summary = json.loads(
        re.search(r'<script type="application/json" id="summary">(.*?)</script>', page).group(1)
    )
    assert summary["peak_line"] == "train.py:12" and summary["peak_op"] == "aten.mm.default"
    # At the peak: the state recategorised, not the temporaries it was made as.
    at_peak = page.split("<h2>At the peak</h2>")[1].split("</table>")[0]
    assert "optimizer state</td><td class=n>600 bytes" in at_peak and "temporaries" not in at_peak
    assert "activations</td><td class=n>600 bytes" in at_peak
    assert "<h2>What if</h2>" in page and "bf16 autocast" in page
    # Self-contained: nothing fetched (the only URL is SVG's namespace).
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"]
    assert "<script src" not in page and "<link" not in page


def test_the_page_written_by_the_console_script_has_the_estimate_s_peak(tmp_path):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(["estimate", "mlp.py", "--format", "json", "--html", "step.html"], tmp_path)
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert "oom-lsp estimate: wrote step.html" in result.stderr
    page = (tmp_path / "step.html").read_text()
    assert _page_peak(page) == estimate["peak_bytes"]
    # The peak's line, named from the script's folder (the page may be opened anywhere).
    shown = Path(estimate["peak_at"]["file"]).relative_to(tmp_path.resolve())
    assert f"{shown}:{estimate['peak_at']['line']}, during" in page
    assert str(tmp_path.resolve()) not in page
    assert "<svg" in page and "<polygon" in page


@pytest.mark.parametrize(
    ("script", "options"),
    [
        ("mlp.py", []),
        # On the CPU a convolution's oneDNN scratch (measured on the real kernel) is counted at its
        # line, in the estimate's top lines as in the export.
        ("cnn.py", ["--device", "cpu"]),
    ],
)
def test_explain_on_the_export_names_the_estimate_s_top_lines(tmp_path, script, options):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / script, tmp_path)
    result = console.run(
        ["estimate", script, "--format", "json", "--snapshot", "step.pickle", *options], tmp_path
    )
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    explained = console.run(["explain", "step.pickle", "--format", "json"], tmp_path)
    assert explained.returncode == 0, explained.stderr
    data = json.loads(explained.stdout)
    assert data["peak_allocated_bytes"] == estimate["peak_bytes"]
    lines = {f"{line['file']}:{line['line']}": line["bytes"] for line in data["top_lines"]}
    for place, size in estimate["top_lines"]:
        assert abs(lines[place] - size) <= size / 100, (place, size, lines.get(place))
    # What holds the peak's bytes: the export's categories, the estimate's breakdown at the peak. A
    # block keeps the role it ends with (cnn.py on the CPU: 2 KiB made as a temporary and known as a
    # gradient after the peak); mlp.py's are equal to the byte.
    held = {group["holder"]: group["bytes"] for group in data["held_by"]}
    breakdown = {CATEGORIES.get(name, name): size for name, size in estimate["breakdown"].items() if size}
    assert sum(held.values()) == estimate["peak_bytes"]
    assert set(held) == set(breakdown)
    for holder, size in breakdown.items():
        assert abs(held[holder] - size) <= estimate["peak_bytes"] / 1000, (holder, held[holder], size)
    if script == "mlp.py":
        assert held == breakdown
        assert held["the optimizer (its state)"] == estimate["breakdown"]["optimizer_state"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--snapshot", "s.pickle", "--find-max-batch"], "--snapshot and --html draw one trace"),
        (["--html", "p.html", "--world-size", "1,2"], "--snapshot and --html draw one trace"),
        (["--snapshot", "s.pickle", "--what-if"], "--snapshot exports the script's own trace"),
    ],
)
def test_flags_that_draw_no_single_trace_are_refused_in_one_line(tmp_path, flags, message):
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(["estimate", "mlp.py", *flags], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"oom-lsp estimate: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("s.pickle")) and not list(tmp_path.glob("p.html"))


def test_a_notebook_is_refused_in_one_line(tmp_path):
    (tmp_path / "train.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    result = console.run(["estimate", "train.ipynb", "--html", "p.html"], tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "oom-lsp estimate: train.ipynb: --snapshot and --html take a .py script, not a notebook (yet)\n"
    )


def test_a_page_into_a_missing_folder_is_refused_before_the_trace(tmp_path):
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(["estimate", "mlp.py", "--html", "no/such/folder/p.html"], tmp_path)
    assert result.returncode == 2
    assert result.stderr == "oom-lsp estimate: --html no/such/folder/p.html: no such folder no/such/folder\n"


def test_a_snapshot_that_cannot_be_written_keeps_the_printed_estimate(tmp_path):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    (tmp_path / "taken").mkdir()  # a folder where the file should go
    result = console.run(["estimate", "mlp.py", "--format", "json", "--snapshot", "taken"], tmp_path)
    assert result.returncode == 2
    assert json.loads(result.stdout)["peak_bytes"] > 0  # the estimate, still printed
    assert result.stderr.strip().splitlines()[-1] == "oom-lsp estimate: cannot write taken: Is a directory"


def test_with_what_if_the_page_has_the_table_s_rows(tmp_path):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(
        ["estimate", "mlp.py", "--what-if", "--format", "json", "--html", "p.html"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    page = (tmp_path / "p.html").read_text()
    assert _page_peak(page) == table["baseline"]["peak_bytes"]
    section = page.split("<h2>What if</h2>")[1]
    for row in table["changes"]:
        assert f"<td>{row['title']}</td>" in section
    # Each change's own traced step, drawn against the script's: its chart's peak is its row's.
    charts = re.findall(r'<figure class=change data-peak-bytes="(\d+)"><figcaption>([^<]*?): allocated', section)
    measured = {row["title"]: row["peak_bytes"] for row in table["changes"] if row.get("peak_bytes")}
    assert measured and {title: int(peak) for peak, title in charts} == measured
    assert section.count("<polyline") == 2 * len(charts)  # the change's line and the script's


def test_an_fsdp2_rank_s_page_and_snapshot_have_its_peak(tmp_path):
    # FSDP2 frees and regathers its unsharded parameters by resizing storages: each resize is a
    # free and an allocation in the timeline.
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "distributed" / "fsdp2_mlp.py", tmp_path)
    args = ["estimate", "fsdp2_mlp.py", "--world-size", "4", "--format", "json"]
    result = console.run([*args, "--snapshot", "s.pickle", "--html", "p.html"], tmp_path)
    assert result.returncode == 0, result.stderr
    peak = json.loads(result.stdout)["peak_bytes"]
    assert _page_peak((tmp_path / "p.html").read_text()) == peak
    assert _replayed_peak(pickle.loads((tmp_path / "s.pickle").read_bytes())) == peak


def test_the_cublas_workspace_is_counted_at_the_first_matrix_product_s_line(tmp_path):
    """CUDA makes cuBLAS's workspace at the first matrix product, through the caching allocator
    with that call's frames, so a real snapshot shows it at that line (the cs336 snapshots of
    bench/README.md: 32 MiB at transformer.py:22, Linear.forward). The estimate counts it there too,
    in its top lines and in its export."""
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(["estimate", "mlp.py", "--format", "json", "--snapshot", "step.pickle"], tmp_path)
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    workspace = estimate["breakdown"]["workspaces"]
    assert workspace > 0
    snapshot = pickle.loads((tmp_path / "step.pickle").read_bytes())
    (first,) = [e for e in snapshot["device_traces"][0] if e.get("category") == "workspaces"]
    place = f"{first['frames'][1]['filename']}:{first['frames'][1]['line']}"
    source = (tmp_path / "mlp.py").read_text().splitlines()[first["frames"][1]["line"] - 1]
    assert "(" in source  # a call: the model's forward that ran the first Linear
    top = dict(estimate["top_lines"])
    assert top[place] >= workspace
    explained = json.loads(console.run(["explain", "step.pickle", "--format", "json"], tmp_path).stdout)
    assert {f"{u['file']}:{u['line']}": u["bytes"] for u in explained["top_lines"]}[place] == top[place]
