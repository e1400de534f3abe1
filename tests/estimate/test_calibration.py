"""`oom-lsp calibrate` and the CUDA terms it replaces (issue 31): the measuring script runs on the
CPU in its dry mode; a machine without a GPU gets one line and exit 2; a stored calibration (a file
in the format the measuring script writes, written by hand: no GPU here to record one) is read back
and used by estimates whose target is that GPU; the CUDA context table by CUDA release and loading;
the verdict judged by reserved memory plus the context."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from oom_lsp.estimate import calibration
from oom_lsp.estimate.cuda_terms import cuda_context, verdict_basis, verdict_words
from oom_lsp.estimate.estimator import EstimateOptions, _set_verdict, verdict
from oom_lsp.estimate.gpus import find_gpu
from tests.console import run

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "fixtures" / "estimate" / "calibration" / "a100_40gb.json"
MIB, GIB = 2**20, 2**30


def run_console(args: list[str]) -> tuple[int, str, str]:
    done = run(args, cwd=ROOT)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


def test_the_recorded_calibration_is_read_and_matched_by_name_or_by_kind(data_home):
    path = data_home / "oom-lsp" / "calibration.json"
    path.parent.mkdir(parents=True)
    shutil.copy(RECORDED, path)
    entries = calibration.load()
    assert [entry["device"]["name"] for entry in entries] == ["NVIDIA A100-SXM4-40GB"]
    assert calibration.matching(find_gpu("A100 40GB"), entries) is entries[0]  # by name
    assert calibration.matching(find_gpu("A30"), entries) is None  # sm 8.0, but 24 GiB
    assert calibration.matching(find_gpu("RTX 3090"), entries) is None


def test_store_replaces_the_same_gpu_and_release_and_keeps_others(data_home):
    entry = json.loads(RECORDED.read_text())["gpus"][0]
    path = calibration.store(entry)
    calibration.store({**entry, "context_bytes": 600 * MIB})
    calibration.store({**entry, "cuda": "12.4", "torch": "2.5.0+cu124"})
    stored = calibration.load(path)
    assert sorted((e["cuda"], e["context_bytes"]) for e in stored) == [("12.1", 600 * MIB), ("12.4", 536870912)]
    # the newest CUDA measured on the target is the one used
    assert calibration.matching(find_gpu("A100"), stored)["cuda"] == "12.4"


def test_a_broken_calibration_file_is_one_line_and_estimates_keep_the_table(data_home):
    path = data_home / "oom-lsp" / "calibration.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(calibration.CalibrationError, match="cannot be read"):
        calibration.load()
    options = EstimateOptions(script=Path("x.py"), gpu=find_gpu("A100 40GB"))
    size, detail = calibration.context_term(options, {"torch_cuda": None})
    assert size == 426 * MIB and "measured in public" in detail
    code, out, err = run_console(["calibrate", "--show"])
    assert code == 2 and err.count("\n") == 1 and "cannot be read" in err


def test_an_estimate_of_the_calibrated_gpu_uses_its_measurement(data_home, tmp_path):
    path = data_home / "oom-lsp" / "calibration.json"
    path.parent.mkdir(parents=True)
    shutil.copy(RECORDED, path)
    script = ROOT / "fixtures" / "estimate" / "mlp.py"
    code, out, _ = run_console(["estimate", str(script), "--gpu", "A100 40GB", "--format", "json"])
    assert code == 0
    prediction = json.loads(out)
    notes = {note["name"]: note for note in prediction["corrections"]}
    assert prediction["context_bytes"] == 536870912
    assert "measured by `oom-lsp calibrate`" in notes["cuda-context"]["detail"]
    assert notes["cublas-workspace"]["bytes"] == 12713984
    code, out, _ = run_console(["estimate", str(script), "--gpu", "RTX 3090", "--format", "json"])
    other = json.loads(out)
    assert other["context_bytes"] == 426 * MIB  # not calibrated: the table
    assert "measured in public" in {n["name"]: n for n in other["corrections"]}["cuda-context"]["detail"]


def test_calibrate_on_a_machine_without_a_gpu_says_so_in_one_line(data_home):
    code, out, err = run_console(["calibrate"])
    assert code == 2
    assert err.startswith("oom-lsp calibrate: needs a CUDA device:") and err.count("\n") == 1
    assert not (data_home / "oom-lsp" / "calibration.json").exists()


def test_the_measuring_script_runs_every_step_in_its_dry_mode(data_home):
    code, out, err = run_console(["calibrate", "--dry-run", "--format", "json"])
    assert code == 0, err
    result = json.loads(out)
    assert result["stored"] is None
    measured = result["calibration"]
    assert measured["dry_run"] is True and measured["context_bytes"] == 0
    assert set(measured["allocator"]) == {"small_segment", "medium_segment", "large_request_24mib"}
    assert set(measured["cublas_workspaces"]) == {"cublas", "cublaslt"}
    assert not (data_home / "oom-lsp" / "calibration.json").exists()


@pytest.mark.parametrize(
    "gpu, cuda, loading, expected",
    [
        ("V100 16GB", "11.2", None, 1343 * MIB),  # before lazy loading: every kernel loaded
        ("A100 40GB", "12.1", None, 426 * MIB),  # lazy by default
        ("A100 40GB", "12.1", "EAGER", 645_660_672),
        ("V100 16GB", "11.8", "LAZY", 266_076_160),
        ("A100 40GB", None, None, 426 * MIB),  # a CPU-only torch: the current release assumed
    ],
)
def test_the_cuda_context_by_release_loading_and_generation(gpu, cuda, loading, expected):
    size, detail = cuda_context(find_gpu(gpu), cuda, loading)
    assert size == expected
    assert ("lazily" in detail) == (expected in (426 * MIB, 266_076_160))


def test_the_verdict_judges_reserved_memory_plus_the_context_and_names_it():
    """lit-gpt's Llama 2 7B LoRA at micro-batch 4 ran out of memory on a 40 GB A100: its allocated
    peak and the context fit the card, its reserved memory and the context do not."""
    capacity = find_gpu("A100 40GB").memory
    prediction = {"peak_bytes": 37 * GIB, "reserved_bytes": int(41.8 * GIB), "context_bytes": int(1.3 * GIB)}
    _set_verdict(prediction, capacity, 0.1)
    assert prediction["verdict"] == "will run out of memory"
    assert prediction["verdict_basis"] == verdict_basis(prediction, capacity)
    assert prediction["verdict_basis"]["figure"] == "reserved + CUDA context"
    words = verdict_words(prediction)
    assert words.startswith("WILL RUN OUT OF MEMORY: reserved + CUDA context 43.10 GiB > 40.00 GiB")
    assert "allocated + context 38.30 GiB" in words
    assert verdict(30 * GIB, capacity) == "fits" and verdict(37 * GIB, capacity) == "tight"
