"""`oom-lsp calibrate`: the CUDA terms of this machine's GPU, measured once and kept for later
estimates (parent side, no torch).

On a machine with a GPU, `calibrate_probe.py` (run by path in the user's interpreter, like the
estimate's harness) runs a tiny training step on the GPU and measures what the estimate otherwise
takes from tables: the CUDA context (the process's memory in nvidia-smi less what PyTorch reserved),
the cuBLAS workspace (what the first matrix product allocates beyond its output) and the caching
allocator's segment sizes. The result is written to a per-user file,
`$XDG_DATA_HOME/oom-lsp/calibration.json` (`~/.local/share/...`), one entry per GPU model, CUDA release
and PyTorch release. An estimate whose target is a calibrated GPU (same name, or same memory and
compute capability) uses the entry of the newest CUDA/PyTorch measured on it, and says so.
A CPU-only machine has nothing to measure: `calibrate` says so in one line (exit 2), and its
estimates keep the tables (cuda_terms.py, estimator.cublas_workspaces).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from oom_lsp.estimate.cuda_terms import cuda_context
from oom_lsp.estimate.gpus import Gpu, format_bytes

PROBE = Path(__file__).resolve().parent / "calibrate_probe.py"
FILE_VERSION = 1
# The probe's own exit code when its interpreter sees no CUDA device (and no --dry-run).
NO_DEVICE_EXIT = 4
NO_TORCH_EXIT = 3


class CalibrationError(RuntimeError):
    """Calibration could not be made or read; the message says why, in one line."""


def calibration_file() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "oom-lsp" / "calibration.json"


def load(path: Path | None = None) -> list[dict[str, Any]]:
    """The calibrations stored for this user (none when the file does not exist)."""
    path = path or calibration_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise CalibrationError(f"{path}: cannot be read as a calibration file ({error})") from None
    if not isinstance(data, dict) or data.get("version") != FILE_VERSION or not isinstance(data.get("gpus"), list):
        raise CalibrationError(f"{path}: not an oom-lsp calibration file of version {FILE_VERSION}")
    return [entry for entry in data["gpus"] if isinstance(entry, dict) and _valid(entry)]


def _valid(entry: dict[str, Any]) -> bool:
    device = entry.get("device")
    return (
        isinstance(device, dict)
        and isinstance(device.get("name"), str)
        and isinstance(device.get("total_memory"), int)
        and isinstance(entry.get("context_bytes"), int)
    )


def store(entry: dict[str, Any], path: Path | None = None) -> Path:
    """Adds `entry`, replacing the one of the same GPU, CUDA and PyTorch release; written atomically."""
    path = path or calibration_file()
    try:
        entries = load(path)
    except CalibrationError:
        entries = []  # an unreadable file is replaced, not merged
    key = _key(entry)
    entries = [known for known in entries if _key(known) != key] + [entry]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".calibration-", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump({"version": FILE_VERSION, "gpus": entries}, out, indent=1)
    os.replace(temporary, path)
    return path


def _key(entry: dict[str, Any]) -> tuple:
    return (entry["device"]["name"], entry.get("cuda"), entry.get("torch"))


def matching(gpu: Gpu | None, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The calibration of the target GPU: the same model name (case, spaces and 'NVIDIA' ignored), or
    the same compute capability and memory within 3 % (a catalogue size against the driver's); the
    newest CUDA and PyTorch measured on it."""
    if gpu is None:
        return None
    found = []
    for entry in entries:
        device = entry["device"]
        same_name = _plain(device["name"]).endswith(_plain(gpu.name)) or _plain(gpu.name).endswith(
            _plain(device["name"])
        )
        capability = tuple(device.get("capability") or ()) or None
        same_kind = (
            gpu.arch is not None
            and capability == tuple(gpu.arch)
            and abs(device["total_memory"] - gpu.memory) <= 0.03 * gpu.memory
        )
        if same_name or same_kind:
            found.append(entry)
    if not found:
        return None
    return max(found, key=lambda entry: (_release(entry.get("cuda")), _release(entry.get("torch"))))


def _plain(name: str) -> str:
    return "".join(name.lower().replace("nvidia", "").replace("tesla", "").split())


def _release(text: str | None) -> tuple[int, ...]:
    parts = []
    for part in (text or "").split("+")[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _calibration_for(options: Any) -> dict[str, Any] | None:
    if options.device != "cuda":
        return None
    try:
        return matching(options.gpu, load())
    except CalibrationError:
        return None  # a broken file: the tables, as on a machine never calibrated


def _measured_on(entry: dict[str, Any]) -> str:
    return (
        f"measured by `oom-lsp calibrate` on this machine's {entry['device']['name']} "
        f"(driver {entry.get('driver') or '?'}, CUDA {entry.get('cuda') or '?'}, torch {entry.get('torch') or '?'}, "
        f"kernels loaded {'lazily' if entry.get('lazy_loading') else 'at once'}, {entry.get('measured_at', '?')})"
    )


def context_term(options: Any, trace: dict[str, Any]) -> tuple[int, str]:
    """The CUDA context of an estimate: the target's calibration, else the table."""
    entry = _calibration_for(options)
    if entry is not None:
        return entry["context_bytes"], (
            f"CUDA context {format_bytes(entry['context_bytes'])}, {_measured_on(entry)}: outside PyTorch's "
            "counters, in nvidia-smi's"
        )
    version = getattr(options, "cuda_version", None) or trace.get("torch_cuda")
    loading = trace.get("cuda_module_loading")
    size, detail = cuda_context(options.gpu, version, loading)
    if not getattr(options, "cuda_version", None) and trace.get("torch_cuda"):
        detail = detail.replace("given by --cuda-version", "the script's torch's")
    return size, detail


def workspace_term(options: Any, trace: dict[str, Any]) -> list[tuple[str, int]]:
    """cuBLAS workspaces: the target's calibration, else by architecture and torch release."""
    from oom_lsp.estimate.estimator import cublas_workspaces

    entry = _calibration_for(options)
    if entry is not None and isinstance(entry.get("cublas_workspace_bytes"), int):
        return [("cuBLAS (calibrated)", entry["cublas_workspace_bytes"])]
    return cublas_workspaces(options.gpu, trace.get("torch", ""))


def run_probe(python: str, dry_run: bool, timeout: float = 300.0) -> dict[str, Any]:
    """Runs calibrate_probe.py in `python`; its measurement, or CalibrationError."""
    with tempfile.TemporaryDirectory(prefix="oom-lsp-calibrate-") as folder:
        out = Path(folder) / "calibration.json"
        command = [python, str(PROBE), "--out", str(out)] + (["--dry-run"] if dry_run else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise CalibrationError(f"{python}: no such interpreter") from None
        except subprocess.TimeoutExpired:
            raise CalibrationError(f"the measuring script did not finish within {timeout:g} s") from None
        if done.returncode == NO_DEVICE_EXIT:
            reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no CUDA device"
            raise CalibrationError(
                f"needs a CUDA device: {reason}; on a CPU-only machine estimates keep the built-in tables "
                "(run `oom-lsp calibrate --dry-run` to check the measuring script here)"
            )
        if done.returncode == NO_TORCH_EXIT:
            raise CalibrationError(f"{python} cannot import torch: install torch there or pass --python")
        if done.returncode != 0 or not out.exists():
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            raise CalibrationError(f"the measuring script failed: {tail[0]}")
        return json.loads(out.read_text(encoding="utf-8"))


def describe(entry: dict[str, Any]) -> list[str]:
    """What a calibration holds, in lines for the terminal."""
    device = entry["device"]
    capability = device.get("capability")
    lines = [
        f"GPU: {device['name']}, {format_bytes(device['total_memory'])}"
        + (f", sm {capability[0]}.{capability[1]}" if capability else ""),
        f"driver {entry.get('driver') or '?'}, CUDA {entry.get('cuda') or '?'}, torch {entry.get('torch') or '?'}, "
        f"CUDA_MODULE_LOADING={entry.get('module_loading') or 'unset (PyTorch sets LAZY)'}",
        f"CUDA context: {format_bytes(entry['context_bytes'])} ({entry.get('context_method', '')})",
    ]
    if isinstance(entry.get("cublas_workspace_bytes"), int):
        lines.append(f"cuBLAS workspace: {format_bytes(entry['cublas_workspace_bytes'])}")
    segments = {name: size for name, size in (entry.get("allocator") or {}).items() if size}
    if segments:
        lines.append(
            "caching allocator: "
            + ", ".join(f"{name.replace('_', ' ')} {format_bytes(size)}" for name, size in segments.items())
        )
    return lines


def python_default() -> str:
    return sys.executable
