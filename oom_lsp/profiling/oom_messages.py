"""Find out-of-memory errors in logs and tracebacks and pull out their facts.

Pure text parsing: no torch import, no I/O. The same parser serves
`oom-lsp explain`, the profiling harness (which parses the exception it
caught) and the in-script OOM guard.

Formats understood (each appears verbatim in tests/profiling/test_oom_messages.py):

* CUDA, torch 1.0-1.3: ``CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total
  capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)``
* CUDA, torch 1.4-2.0: ``... (GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated;
  3.03 GiB free; 1.24 GiB reserved in total by PyTorch)``, from 1.10 followed by the
  ``max_split_size_mb`` hint.
* CUDA and HIP, torch 2.1+: ``Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB
  of which 1.06 GiB is free. Process 12345 has 22.58 GiB memory in use. Of the allocated memory
  21.80 GiB is allocated by PyTorch, and 344.56 MiB is reserved by PyTorch but unallocated. ...``
  (2.1 spells it "capacty"), with "Including non-PyTorch memory, this process has ...",
  "N allowed;" (a memory fraction), "with N allocated in private pools (e.g., CUDA Graphs)",
  and the ``expandable_segments`` or ``max_split_size_mb`` hint.
* MPS: ``MPS backend out of memory (MPS allocated: 18.12 GB, other allocations: 384.00 KB,
  max allowed: 18.13 GB). Tried to allocate 4.00 MB on private pool. Use
  PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 ...``
* CPU: ``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes`` and
  ``DefaultCPUAllocator: not enough memory: you tried to allocate N bytes``.

Sizes are returned in bytes. PyTorch prints them with binary units (its
``format_size`` divides by 1024); the MPS allocator writes "KB/MB/GB" for the
same binary units, so those are read as powers of 1024 too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from oom_lsp.units import format_bytes

_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}

_SIZE = r"(\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes?|B)\b)"


def parse_size(text: str) -> int:
    """'20.00 MiB' -> 20971520. Raises ValueError on anything else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a memory size: {text!r}")
    return round(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Frame:
    """One traceback frame: `code` is the source line the traceback printed, if any."""

    file: str
    line: int
    function: str
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Frame:
        return cls(data["file"], int(data["line"]), data["function"], data.get("code"))


@dataclass(frozen=True)
class ProcessUsage:
    """A process using device memory; `pid` is None for "this process"."""

    pid: int | None
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessUsage:
        return cls(data.get("pid"), int(data["bytes"]))


@dataclass(frozen=True)
class OomError:
    """The facts of one out-of-memory error. A field is None when the message does not say.

    `allocated` is memory held by PyTorch tensors ("already allocated" in torch 1.x,
    "allocated by PyTorch" in 2.x); `reserved` is everything the caching allocator holds
    ("reserved in total by PyTorch" / "cached" in 1.x; allocated + "reserved by PyTorch but
    unallocated" in 2.x). `frames` are the user-code frames of the traceback (library and
    standard-library frames removed), outermost first: the last one is where it failed.
    """

    backend: str  # "cuda", "hip", "mps" or "cpu"
    message: str  # the error line as it appeared, without the exception type
    exception_type: str | None = None  # "torch.OutOfMemoryError", "RuntimeError", ...
    device: str | None = None  # "cuda:0", "hip:0", "mps", "cpu"
    tried_to_allocate: int | None = None
    total_capacity: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    reserved_unallocated: int | None = None
    private_pools: int | None = None
    allowed: int | None = None  # a memory-fraction or MPS high-watermark limit
    other_allocations: int | None = None  # MPS: memory the process holds outside the allocator
    processes: tuple[ProcessUsage, ...] = ()
    hint: str | None = None
    hint_setting: str | None = None  # "expandable_segments", "max_split_size_mb", "mps_high_watermark_ratio"
    frames: tuple[Frame, ...] = ()
    log_line: int | None = None  # 1-based line of the message in the parsed text

    @property
    def failing_frame(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "message": self.message,
            "exception_type": self.exception_type,
            "device": self.device,
            "tried_to_allocate": self.tried_to_allocate,
            "total_capacity": self.total_capacity,
            "free": self.free,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "reserved_unallocated": self.reserved_unallocated,
            "private_pools": self.private_pools,
            "allowed": self.allowed,
            "other_allocations": self.other_allocations,
            "processes": [p.to_dict() for p in self.processes],
            "hint": self.hint,
            "hint_setting": self.hint_setting,
            "frames": [f.to_dict() for f in self.frames],
            "failing_frame": self.failing_frame.to_dict() if self.failing_frame else None,
            "log_line": self.log_line,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OomError:
        return cls(
            backend=data["backend"],
            message=data["message"],
            exception_type=data.get("exception_type"),
            device=data.get("device"),
            tried_to_allocate=data.get("tried_to_allocate"),
            total_capacity=data.get("total_capacity"),
            free=data.get("free"),
            allocated=data.get("allocated"),
            reserved=data.get("reserved"),
            reserved_unallocated=data.get("reserved_unallocated"),
            private_pools=data.get("private_pools"),
            allowed=data.get("allowed"),
            other_allocations=data.get("other_allocations"),
            processes=tuple(ProcessUsage.from_dict(p) for p in data.get("processes", ())),
            hint=data.get("hint"),
            hint_setting=data.get("hint_setting"),
            frames=tuple(Frame.from_dict(f) for f in data.get("frames", ())),
            log_line=data.get("log_line"),
        )


# --- message recognition ---------------------------------------------------------------

_GPU_START = re.compile(r"\b(CUDA|HIP) out of memory\.")
_MPS_START = re.compile(r"\bMPS backend out of memory\b")
_CPU_START = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate")
_EXCEPTION_PREFIX = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)):\s")

_TRIED = re.compile(r"Tried to allocate " + _SIZE, re.IGNORECASE)
# torch 1.x: "(GPU 0; 10.76 GiB total capacity; 9.59 GiB already allocated; 13.56 MiB free;
#             9.80 GiB reserved in total by PyTorch)"
_V1_DEVICE = re.compile(r"\(GPU (\d+);")
_V1_TOTAL = re.compile(_SIZE + r" total capacity")
_V1_ALLOCATED = re.compile(_SIZE + r" already allocated")
_V1_FREE = re.compile(_SIZE + r" free[;)]")
_V1_RESERVED = re.compile(_SIZE + r" (?:reserved in total by PyTorch|cached)")
# torch 2.x
_V2_DEVICE_TOTAL = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + " is free")
_V2_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_V2_THIS_PROCESS = re.compile(r"Including non-PyTorch memory, this process has " + _SIZE + r" memory in use")
_V2_ALLOWED = re.compile(_SIZE + r" allowed;")
_V2_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_V2_PRIVATE = re.compile(r"with " + _SIZE + r" allocated in private pools")
_V2_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
# MPS
_MPS_ALLOCATED = re.compile(r"MPS allocated: " + _SIZE)
_MPS_OTHER = re.compile(r"other allocations: " + _SIZE)
_MPS_MAX = re.compile(r"max allowed: " + _SIZE)
# CPU
_CPU_BYTES = re.compile(r"you tried to allocate (\d+) bytes")

_HINTS = (
    (re.compile(r"If reserved but unallocated memory is large try setting [^.]*?expandable_segments:True[^.]*\."),
     "expandable_segments"),
    (re.compile(r"If reserved (?:but unallocated )?memory is (?:>> allocated memory|large) try setting "
                r"max_split_size_mb[^.]*\."), "max_split_size_mb"),
    (re.compile(r"Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0\.0[^.]*\.(?:\d[^.]*\.)?"
                r"(?:[^.]*\(may cause system failure\)\.?)?"), "mps_high_watermark_ratio"),
)


def _size(pattern: re.Pattern[str], text: str, group: int = 1) -> int | None:
    match = pattern.search(text)
    return parse_size(match.group(group)) if match else None


def _hint(text: str) -> tuple[str | None, str | None]:
    for pattern, setting in _HINTS:
        match = pattern.search(text)
        if match:
            return match.group(0).strip(), setting
    return None, None


def parse_message(text: str, exception_type: str | None = None) -> OomError | None:
    """Parse one OOM error message (the text after "SomeError: "); None if it is not one."""
    gpu = _GPU_START.search(text)
    if gpu:
        return _parse_gpu(text[gpu.start():], gpu.group(1).lower(), exception_type)
    mps = _MPS_START.search(text)
    if mps:
        return _parse_mps(text[mps.start():], exception_type)
    cpu = _CPU_START.search(text)
    if cpu:
        match = _CPU_BYTES.search(text, cpu.start())
        return OomError(
            backend="cpu",
            message=text.strip(),
            exception_type=exception_type,
            device="cpu",
            tried_to_allocate=int(match.group(1)) if match else None,
        )
    return None


def _parse_gpu(text: str, backend: str, exception_type: str | None) -> OomError:
    hint, setting = _hint(text)
    v2 = _V2_DEVICE_TOTAL.search(text)
    if v2:
        allocated = _size(_V2_ALLOCATED, text)
        unallocated = _size(_V2_UNALLOCATED, text)
        processes = [ProcessUsage(int(m.group(1)), parse_size(m.group(2))) for m in _V2_PROCESS.finditer(text)]
        this_process = _V2_THIS_PROCESS.search(text)
        if this_process:
            processes.append(ProcessUsage(None, parse_size(this_process.group(1))))
        return OomError(
            backend=backend,
            message=text.strip(),
            exception_type=exception_type,
            device=f"{backend}:{v2.group(1)}",
            tried_to_allocate=_size(_TRIED, text),
            total_capacity=parse_size(v2.group(2)),
            free=parse_size(v2.group(3)),
            allocated=allocated,
            reserved=allocated + unallocated if allocated is not None and unallocated is not None else None,
            reserved_unallocated=unallocated,
            private_pools=_size(_V2_PRIVATE, text),
            allowed=_size(_V2_ALLOWED, text),
            processes=tuple(processes),
            hint=hint,
            hint_setting=setting,
        )
    device = _V1_DEVICE.search(text)
    allocated = _size(_V1_ALLOCATED, text)
    reserved = _size(_V1_RESERVED, text)
    return OomError(
        backend=backend,
        message=text.strip(),
        exception_type=exception_type,
        device=f"{backend}:{device.group(1)}" if device else None,
        tried_to_allocate=_size(_TRIED, text),
        total_capacity=_size(_V1_TOTAL, text),
        free=_size(_V1_FREE, text),
        allocated=allocated,
        reserved=reserved,
        reserved_unallocated=reserved - allocated if reserved is not None and allocated is not None else None,
        hint=hint,
        hint_setting=setting,
    )


def _parse_mps(text: str, exception_type: str | None) -> OomError:
    hint, setting = _hint(text)
    return OomError(
        backend="mps",
        message=text.strip(),
        exception_type=exception_type,
        device="mps",
        tried_to_allocate=_size(_TRIED, text),
        allocated=_size(_MPS_ALLOCATED, text),
        other_allocations=_size(_MPS_OTHER, text),
        allowed=_size(_MPS_MAX, text),
        hint=hint,
        hint_setting=setting,
    )


# --- tracebacks --------------------------------------------------------------------------

_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
_TRACEBACK_START = "Traceback (most recent call last):"
_CARETS = re.compile(r"^\s*[\^~\s]+$")
_LIBRARY_PATH = re.compile(
    r"([\\/](site|dist)-packages[\\/])"
    r"|([\\/]lib[\\/]python\d+(\.\d+)?[\\/])"
    r"|([\\/]Lib[\\/])"
    r"|(^|[\\/])torch[\\/]"
)


def is_user_file(path: str) -> bool:
    """False for frames in installed packages, the standard library, torch, or synthetic code."""
    return not (path.startswith("<") or _LIBRARY_PATH.search(path))


def user_frames(frames: Iterable[Frame]) -> tuple[Frame, ...]:
    return tuple(frame for frame in frames if is_user_file(frame.file))


def _frames_before(lines: list[str], end: int) -> list[Frame]:
    """The frames of the traceback whose exception line is `lines[end]`, if one ends there."""
    start = end - 1
    while start >= 0 and lines[start].strip() != _TRACEBACK_START:
        # A traceback body is frame lines, their code lines, carets and "[Previous line repeated]".
        if not lines[start].startswith((" ", "\t")) and lines[start].strip():
            return []
        start -= 1
    if start < 0:
        return []
    frames: list[Frame] = []
    pending: dict[str, Any] | None = None
    for raw in lines[start + 1:end]:
        match = _FRAME_LINE.match(raw)
        if match:
            if pending:
                frames.append(Frame(**pending))
            pending = {"file": match["file"], "line": int(match["line"]), "function": match["function"], "code": None}
        elif pending and pending["code"] is None and raw.strip() and not _CARETS.match(raw):
            if not raw.strip().startswith("[Previous line repeated"):
                pending["code"] = raw.strip()
    if pending:
        frames.append(Frame(**pending))
    return frames


def find_ooms(text: str) -> list[OomError]:
    """Every OOM error in a log or traceback text, in order, each with its user-code frames."""
    lines = text.splitlines()
    found: list[OomError] = []
    for index, line in enumerate(lines):
        if not (_GPU_START.search(line) or _MPS_START.search(line) or _CPU_START.search(line)):
            continue
        prefix = _EXCEPTION_PREFIX.match(line)
        exception_type = prefix.group(1) if prefix else None
        # Some loggers wrap long messages: the facts may continue on the next lines.
        message = line
        follow = index + 1
        while follow < len(lines) and _continues_message(lines[follow]):
            message += " " + lines[follow].strip()
            follow += 1
        oom = parse_message(message, exception_type)
        if oom is None:
            continue
        frames = user_frames(_frames_before(lines, index)) if exception_type else ()
        found.append(_with(oom, frames=tuple(frames), log_line=index + 1))
    return found


def _continues_message(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and stripped.startswith(
        ("Process ", "Of the allocated", "Including non-PyTorch", "If reserved", "See documentation",
         "Tried to allocate", "GPU ")
    )


def _with(oom: OomError, **changes: Any) -> OomError:
    data = {name: getattr(oom, name) for name in oom.__dataclass_fields__}
    data.update(changes)
    return OomError(**data)


def from_exception(exc: BaseException, frames: Iterable[Frame]) -> OomError | None:
    """Parse a caught exception; `frames` are its traceback's frames (all of them, outermost first)."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    oom = parse_message(str(exc), name)
    if oom is None:
        return None
    return _with(oom, frames=user_frames(frames))


def describe(oom: OomError) -> list[tuple[str, str]]:
    """(label, value) rows for a human-readable summary; only the facts the message gave."""
    rows: list[tuple[str, str]] = [("error", f"{oom.exception_type or 'error'}: {oom.backend.upper()} out of memory")]
    if oom.device:
        rows.append(("device", oom.device))
    sizes = (
        ("tried to allocate", oom.tried_to_allocate),
        ("total capacity", oom.total_capacity),
        ("free", oom.free),
        ("allocated by PyTorch", oom.allocated),
        ("reserved by PyTorch", oom.reserved),
        ("reserved but unallocated", oom.reserved_unallocated),
        ("in private pools", oom.private_pools),
        ("allowed", oom.allowed),
        ("other allocations", oom.other_allocations),
    )
    rows.extend((label, format_bytes(value)) for label, value in sizes if value is not None)
    for process in oom.processes:
        who = f"process {process.pid}" if process.pid is not None else "this process (incl. non-PyTorch)"
        rows.append((who, f"{format_bytes(process.bytes)} in use"))
    if oom.hint:
        rows.append(("hint", oom.hint))
    failing = oom.failing_frame
    if failing:
        where = f"{failing.file}:{failing.line} in {failing.function}"
        rows.append(("failed at", where + (f": {failing.code}" if failing.code else "")))
    elif oom.log_line is not None:
        rows.append(("failed at", "no user-code frame in the traceback"))
    return rows
