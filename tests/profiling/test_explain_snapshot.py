"""`oom-lsp explain snapshot.pickle`: a memory snapshot's peak by the user lines that allocated
what is live there, read as plain data by oom-lsp's own pickle reader (a hostile pickle runs nothing)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

from tests import console


def _snapshot(tmp_path):
    user = str(tmp_path / "train.py")

    def alloc(addr, size, line):
        frames = [
            {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"}
        ]
        frames.append({"filename": user, "line": line, "name": "<module>"})
        return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames}

    def free(addr, size):
        return {"action": "free_completed", "addr": addr, "size": size, "stream": 0, "frames": []}

    trace = [
        alloc(0, 4096, 5),
        alloc(4096, 1024, 7),
        alloc(8192, 2048, 7),
        free(8192, 2048),
        alloc(8192, 512, 9),
    ]
    segments = [
        {
            "device": 0,
            "address": 0,
            "total_size": 2 << 20,
            "blocks": [
                {"address": 0, "size": 4096, "state": "active_allocated"},
                {"address": 4096, "size": 1024, "state": "active_allocated"},
                {"address": 8192, "size": 512, "state": "active_allocated"},
            ],
        }
    ]
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [trace]}))
    return path


def test_the_peak_is_attributed_to_the_user_lines_that_allocated_it(tmp_path):
    path = _snapshot(tmp_path)
    result = console.run(["explain", str(path), "--format", "json"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["peak_allocated_bytes"] == 4096 + 1024 + 2048
    assert [(line["line"], line["bytes"]) for line in data["top_lines"]] == [(5, 4096), (7, 3072)]
    assert "own pickle reader" in data["trust"]
    text = console.run(["explain", str(path)], tmp_path)
    assert text.returncode == 0, text.stderr
    assert "own pickle reader" in text.stdout.splitlines()[0]
    assert "4.00 KiB  train.py:5  (1 block)" in text.stdout
    assert "3.00 KiB  train.py:7  (2 blocks)" in text.stdout


class _Hostile:
    def __reduce__(self):
        return (subprocess.call, ([sys.executable, "-c", "open('pwned', 'w').write('ran')"],))


def test_a_hostile_pickle_runs_nothing_and_is_refused_in_one_line(tmp_path):
    evil = tmp_path / "snapshot.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Hostile()]]}))
    result = console.run(["explain", str(evil)], tmp_path)
    assert result.returncode == 2
    assert not (tmp_path / "pwned").exists()
    assert result.stderr.strip().splitlines() == [
        "oom-lsp: a memory snapshot holds only plain data; this pickle wants subprocess.call"
    ]
    assert "Traceback" not in result.stderr


def test_a_pickle_that_is_not_a_snapshot_says_so(tmp_path):
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    result = console.run(["explain", str(path)], tmp_path)
    assert result.returncode == 2
    assert "not a CUDA memory snapshot" in result.stderr


def _training_snapshot(tmp_path):
    """Three steps of a loop as a real recording (stacks="python") has them: the model before the
    loop, each step's forward in train.py, its backward in torch/autograd/, Adam's state in
    torch/optim/, and `losses.append(loss)` (line 14) keeping each step's loss and its graph."""
    user = str(tmp_path / "train.py")
    autograd = "/usr/lib/python3/site-packages/torch/autograd/graph.py"
    optim = "/usr/lib/python3/site-packages/torch/optim/adam.py"
    trace, address = [], [0]

    def alloc(size, filename, line):
        address[0] += 1 << 20
        trace.append({"action": "alloc", "addr": address[0], "size": size, "stream": 0,
                      "frames": [{"filename": filename, "line": line, "name": "f"}]})
        return address[0], size

    def free(block):
        trace.append({"action": "free_completed", "addr": block[0], "size": block[1], "stream": 0, "frames": []})

    alloc(4000, user, 5)  # the model's parameters
    for step in range(3):
        activation = alloc(300, user, 12)
        alloc(20, user, 14)  # the loss, kept in a list with its graph
        gradient = alloc(50, autograd, 744)
        if step == 2:
            alloc(700, autograd, 744)  # the last backward's temporaries: the peak
            return trace
        free(activation)
        free(gradient)
        if step == 0:
            alloc(8000, optim, 90)  # exp_avg and exp_avg_sq, made at the first step
    return trace


def test_the_peak_s_bytes_are_grouped_by_what_holds_them(tmp_path):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [_training_snapshot(tmp_path)]}))
    result = console.run(["explain", str(path), "--format", "json"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["peak_allocated_bytes"] == 4000 + 3 * 20 + 8000 + 300 + 50 + 700
    held = {group["holder"]: (group["bytes"], group["blocks"]) for group in data["held_by"]}
    assert held == {
        "the optimizer (its state)": (8000, 1),
        "before the first backward (model, inputs, the first forward)": (4000 + 20, 2),
        "kept across iterations (allocated in an earlier step, still live)": (20, 1),
        "this step's forward (the autograd graph, temporaries)": (300 + 20, 2),
        "gradients (made by the backward)": (50 + 700, 2),
    }
    text = console.run(["explain", str(path)], tmp_path).stdout
    assert "held at the peak by" in text and "kept across iterations" in text


def test_the_failed_allocation_is_shown_with_what_was_live_then(tmp_path):
    path = _snapshot(tmp_path)
    data = pickle.loads(path.read_bytes())
    data["device_traces"][0].append({"action": "oom", "addr": 1 << 20, "size": 3 << 30, "stream": 0, "frames": []})
    path.write_bytes(pickle.dumps(data))
    text = console.run(["explain", str(path)], tmp_path)
    assert text.returncode == 0, text.stderr
    assert "the allocation that failed: 3.00 GiB requested, 1.00 MiB free on the device; 5.50 KiB live then" in text.stdout
    assert "4.00 KiB  train.py:5  (1 block)" in text.stdout.split("the allocation that failed")[1]
    result = console.run(["explain", str(path), "--format", "json"], tmp_path)
    failed = json.loads(result.stdout)["failed_allocation"]
    assert (failed["requested_bytes"], failed["live_bytes"]) == (3 << 30, 4096 + 1024 + 512)
