"""Runs INSIDE the user's interpreter: profile their training script, unchanged, for N steps.

    python -m oom_lsp.profiling.harness --out DIR [--steps N] [--device auto|cpu|cuda]
                                        [--progress-fd FD] -- SCRIPT [ARGS...]

This module imports torch; the language server and `--check` never import it (the parent
side is oom_lsp.profiling.runner). What it does:

* runs SCRIPT as `__main__` the way `runpy.run_path(run_name="__main__")` does, with
  `sys.argv = [SCRIPT, *ARGS]` and the script's folder first on `sys.path`, like `python SCRIPT ARGS`;
* a global optimizer step post-hook ends a step each time the first optimizer that ever
  stepped steps again (so a GAN's two optimizers make one step, not two), records the step's
  peak, and after N steps raises a private BaseException that unwinds the script (an
  `except Exception:` in user code does not swallow it);
* the whole run is under `torch.profiler.profile(profile_memory=True, record_shapes=True,
  with_stack=True)`: the allocation events, replayed in time order, give the live bytes at
  every moment. On the CPU the per-step peaks are the maxima of that replay between step
  markers (the method of docs/memory-estimation §2); on CUDA they are
  `torch.cuda.max_memory_allocated()` / `max_memory_reserved()`, reset after each step. Either
  way the blocks live at the overall peak are attributed to the innermost user-code frame of
  the call that allocated them (per-line bytes), and to the innermost nn.Module forward;
* writes report.json (oom_lsp.profiling.report), trace.json (`export_chrome_trace`),
  stacks.txt (bytes live at the peak per call stack, flame graph format) and, on CUDA,
  snapshot.pickle (`_record_memory_history` +
  `_dump_snapshot`, for pytorch.org/memory_viz);
* an out-of-memory error (torch.OutOfMemoryError, or a RuntimeError with an OOM message)
  is parsed with oom_messages and recorded with the allocator state and the user line.

Progress goes to the parent as JSON lines on --progress-fd: {"event": "started"},
{"event": "step", "step": n, "peak_allocated": bytes, "elapsed": s}, {"event": "analysing"},
{"event": "done", "status": ...} or {"event": "error", "kind": "no-torch", "message": ...}.
"""

from __future__ import annotations

import argparse
import builtins
import json
import linecache
import os
import platform
import sys
import time
import traceback
import types
import warnings
import weakref
from pathlib import Path
from typing import Any

from oom_lsp import safe_files
from oom_lsp.profiling import watchdog
from oom_lsp.profiling.keepalive import KeepCodeAlive
from oom_lsp.profiling.oom_messages import Frame, from_exception, is_user_file
from oom_lsp.profiling.report import DeviceInfo, LineUsage, ModuleUsage, OomFailure, Report, StepStats
from oom_lsp.profiling.runner import NO_TORCH_EXIT

STEP_MARKER_PREFIX = "oom_lsp.step_end."
TOP_LINES = 20
TOP_MODULES = 10
_exec = builtins.exec  # the real one, not KeepCodeAlive's wrapper: no extra frame in tracebacks
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent) + os.sep


class StopProfiling(BaseException):
    """Raised from the optimizer hook after the last requested step; caught by the harness."""


class Progress:
    """JSON lines to the parent on an inherited file descriptor (or nowhere)."""

    def __init__(self, fd: int | None) -> None:
        self._stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8") if fd is not None else None
        self.started = time.perf_counter()

    def send(self, event: str, **fields: Any) -> None:
        if self._stream is None:
            return
        payload = {"event": event, "elapsed": round(time.perf_counter() - self.started, 3), **fields}
        try:
            self._stream.write(json.dumps(payload) + "\n")
        except OSError:  # the parent stopped listening, or the script closed our descriptor
            self._stream = None  # the run itself goes on: progress is a convenience


def is_profiled_user_file(path: str) -> bool:
    return is_user_file(path) and not path.startswith(_PACKAGE_ROOT)


class SetupPlaces:
    """Where the parameters and buffers registered before training were created (the user's
    line, the module), from torch's global registration hooks: the setup recording has no
    Python stacks, and parameters are most of what a script allocates before it trains.
    Settled into storage pointers when training starts (after `.to(device)` moved them)."""

    def __init__(self, torch: Any) -> None:
        self._created: list[tuple[Any, tuple[str, int, str], int]] = []
        self.by_pointer: dict[int, tuple[tuple[str, int, str], int]] = {}
        self.handles: list[Any] = []
        module = torch.nn.modules.module
        for name in ("register_module_parameter_registration_hook", "register_module_buffer_registration_hook"):
            register = getattr(module, name, None)  # torch >= 2.0
            if register is not None:
                self.handles.append(register(self.hook))

    def hook(self, module: Any, name: str, tensor: Any) -> None:
        if tensor is None:
            return
        frame = sys._getframe(1)
        while frame is not None and not is_profiled_user_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            where = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            self._created.append((weakref.ref(tensor), where, id(module)))

    def settle(self) -> None:
        for reference, where, module in self._created:
            tensor = reference()
            if tensor is None:
                continue
            try:
                pointer = int(tensor.untyped_storage().data_ptr())
            except (RuntimeError, AttributeError):
                continue
            self.by_pointer.setdefault(pointer, (where, module))
        self._created.clear()
        for handle in self.handles:
            handle.remove()


class Phases:
    """Two recordings, so that what a script does before it trains costs next to nothing.

    From the script's first line, `setup`: torch's allocation events only, no Python stacks
    (a million prints before training made a 271 MB trace and 1.9 GiB of memory when every
    Python call was recorded). From the moment training starts (an optimizer is created, or a
    module runs its first forward pass; else the end of the first optimizer step), `training`:
    shapes, Python stacks and, on CUDA, the allocator's history for the snapshot. The setup's
    live allocations still count in the peaks (analyse_allocations)."""

    def __init__(self, torch: Any, activities: list[Any], use_cuda: bool) -> None:
        self.torch = torch
        self.use_cuda = use_cuda
        self.places = SetupPlaces(torch)
        self.setup = torch.profiler.profile(activities=activities, profile_memory=True)
        self.training = torch.profiler.profile(
            activities=activities, profile_memory=True, record_shapes=True, with_stack=True
        )
        self.started = False
        self.stopped = False
        # The frames on the stack when training's recording starts are named by the line they
        # were at ("train.py(23): <module>"), the others by their def line ("train.py(0):
        # <module>"): the names of the first kind, renamed to the second (flame graph stacks).
        self.frame_names: dict[str, str] = {}

    def pre_hook(self, module: Any, args: Any) -> None:
        if not self.started:
            self.start_training()

    def watch_optimizers(self) -> Any:
        """Start training's recording when an optimizer is created; returns the undo."""
        optimizer = self.torch.optim.Optimizer
        original = optimizer.__init__
        phases = self

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            phases.start_training()

        optimizer.__init__ = init
        return lambda: setattr(optimizer, "__init__", original)

    def start_training(self) -> None:
        if self.started or self.stopped:
            return
        self.started = True
        self.setup.stop()
        self.places.settle()
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            first = 0 if code.co_name == "<module>" else code.co_firstlineno
            self.frame_names[f"{code.co_filename}({frame.f_lineno}): {code.co_name}"] = (
                f"{code.co_filename}({first}): {code.co_name}"
            )
            frame = frame.f_back
        if self.use_cuda:
            self.torch.cuda.memory._record_memory_history(max_entries=200_000)
        self.training.start()

    def stop(self) -> Any:
        """Stop the recording running; the profile of the training (the setup's when the
        training never started)."""
        self.stopped = True
        current = self.training if self.started else self.setup
        current.stop()
        return current


class StepRecorder:
    """The optimizer hook: counts steps, keeps per-step peaks, stops after `limit` steps."""

    def __init__(
        self, torch: Any, limit: int, use_cuda: bool, progress: Progress, phases: Phases | None = None
    ) -> None:
        self.phases = phases
        self.torch = torch
        self.limit = limit
        self.use_cuda = use_cuda
        self.progress = progress
        self.steps: list[StepStats] = []
        self._first_optimizer: weakref.ref[Any] | None = None
        self.step_started = time.perf_counter()
        # Held until the profile is read, as keepalive.py does for code objects: cheap insurance in
        # case the profiler refers to a marker's name instead of copying it.
        self._marker_names: list[str] = []
        self.stopping = False

    def hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.stopping:
            return
        if self._first_optimizer is None:
            self._first_optimizer = weakref.ref(optimizer)
        elif self._first_optimizer() is not optimizer:
            return
        self.end_step()
        if len(self.steps) >= self.limit:
            self.stopping = True
            raise StopProfiling()
        if self.phases is not None:
            self.phases.start_training()  # no module's forward pass came first: from the next step on

    def end_step(self) -> None:
        index = len(self.steps) + 1
        name = f"{STEP_MARKER_PREFIX}{index}"
        self._marker_names.append(name)
        with self.torch.autograd.profiler.record_function(name):
            pass
        now = time.perf_counter()
        step = StepStats(index=index, peak_allocated=0, wall_time=round(now - self.step_started, 6))
        if self.use_cuda:
            cuda = self.torch.cuda
            step.peak_allocated = int(cuda.max_memory_allocated())
            step.peak_reserved = int(cuda.max_memory_reserved())
            cuda.reset_peak_memory_stats()
        self.steps.append(step)
        self.step_started = now
        self.progress.send("step", step=index, peak_allocated=step.peak_allocated if self.use_cuda else None)


class ModuleNames:
    """Qualified names of modules (by id) and the batch size, from a global forward pre-hook.

    The first time a module that is not yet known runs, it is a root: all its submodules get
    names under it ("Net.encoder.0"). The first root's first tensor argument gives the batch
    size (its first dimension) and the input shape.
    """

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.names: dict[int, tuple[str, str]] = {}
        self.batch_size: int | None = None
        self.input_shape: list[int] | None = None
        self._keep_alive: list[Any] = []  # ids stay valid only while the module lives

    def pre_hook(self, module: Any, args: Any) -> None:
        if id(module) in self.names:
            return
        root = type(module).__name__
        for name, sub in module.named_modules():
            self.names.setdefault(id(sub), (f"{root}.{name}" if name else root, type(sub).__name__))
            self._keep_alive.append(sub)
        if self.input_shape is None:
            tensor = next((a for a in args if isinstance(a, self.torch.Tensor)), None)
            if tensor is not None and tensor.dim() > 0:
                self.input_shape = list(tensor.shape)
                self.batch_size = int(tensor.shape[0])


def _frames_of(tb: Any) -> list[Frame]:
    frames = []
    for summary in traceback.extract_tb(tb):
        frames.append(Frame(summary.filename, summary.lineno or 0, summary.name, summary.line or None))
    return frames


def _source_line(file: str, line: int) -> str | None:
    text = linecache.getline(file, line).strip()
    return text or None


def _allocation_events(prof: Any, device_type: str, event_type: Any) -> tuple[list[Any], dict[int, int]]:
    """The profile's allocations on `device_type`, in time order (a free and a reuse of the same
    address can share a timestamp: frees first), and its step markers' times."""
    allocations = []
    markers: dict[int, int] = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == event_type.Allocation:
            if node.extra_fields.device.type == device_type:
                allocations.append(node)
        elif node.tag == event_type.TorchOp:
            name = node.name
            if name.startswith(STEP_MARKER_PREFIX):
                markers[int(name[len(STEP_MARKER_PREFIX):])] = node.start_time_ns
    allocations.sort(key=lambda n: (n.start_time_ns, n.extra_fields.alloc_size > 0))
    return allocations, markers


def analyse_allocations(
    prof: Any,
    device_type: str,
    names: ModuleNames,
    script: str,
    before: Any = None,
    setup_places: dict[int, tuple[tuple[str, int, str], int]] | None = None,
    frame_names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Replay the profiler's allocation events: peaks per step window and the live set at the peak.
    `before`: the profile of what ran before `prof` started (Phases.setup), whose allocations
    still live when it ended count from the start; `setup_places`: where the parameters and
    buffers among them were created (SetupPlaces.by_pointer)."""
    from torch._C._profiler import _EventType  # private, present since torch 1.13

    # One timeline: the setup's events, then the training's (each recording in its own time
    # order), with the step markers where they fell. Window k is the k-th step: a marker ends it.
    timeline: list[tuple[str, Any]] = []
    setup_nodes: set[int] = set()
    for recording in ([before] if before is not None else []) + [prof]:
        allocations, markers = _allocation_events(recording, device_type, _EventType)
        if recording is before:
            setup_nodes = {id(node) for node in allocations}
        ends = sorted(markers.values())
        merged: list[tuple[int, int, str, Any]] = [(node.start_time_ns, 0, "alloc", node) for node in allocations]
        merged += [(time, 1, "step end", None) for time in ends]  # an allocation at the marker's time first
        timeline += [(kind, node) for _, _, kind, node in sorted(merged, key=lambda item: item[:2])]
    steps_marked = sum(1 for kind, _ in timeline if kind == "step end")

    live: dict[int, int] = {}
    total = peak = 0
    before_training = 0
    peak_position = -1
    peak_in_setup = False
    step_peaks = [0] * (steps_marked + 1)  # the last window is a step cut short (OOM, exit)
    window = 0
    for position, (kind, node) in enumerate(timeline):
        if kind == "step end":
            window += 1
            step_peaks[window] = total  # what is live when a step starts counts toward its peak
            continue
        fields = node.extra_fields
        if fields.alloc_size > 0:
            live[fields.ptr] = fields.alloc_size
            total += fields.alloc_size
        elif fields.ptr in live:  # frees of blocks allocated before profiling started are unknown
            total -= live.pop(fields.ptr)
        if id(node) in setup_nodes:
            before_training = total
        step_peaks[window] = max(step_peaks[window], total)
        # The same peak again in training is the one to attribute: the setup has no stacks.
        if total > peak or (total == peak and peak_in_setup and id(node) not in setup_nodes):
            peak, peak_position, peak_in_setup = total, position, id(node) in setup_nodes

    live_nodes: dict[int, Any] = {}
    for kind, node in timeline[: peak_position + 1]:
        if kind != "alloc":
            continue
        fields = node.extra_fields
        if fields.alloc_size > 0:
            live_nodes[fields.ptr] = node
        else:
            live_nodes.pop(fields.ptr, None)

    lines: dict[tuple[str, int], LineUsage] = {}
    modules: dict[str, ModuleUsage] = {}
    stacks: dict[str, int] = {}
    unplaced_setup = 0  # bytes allocated before training, live at the peak, with no line
    for pointer, node in live_nodes.items():
        size = node.extra_fields.alloc_size
        stack = _folded_stack(node, _EventType, script, frame_names)
        stacks[stack] = stacks.get(stack, 0) + size
        where, module = _attribute(node, _EventType)
        if id(node) in setup_nodes:  # recorded without stacks: a parameter's or buffer's place, if known
            where, module = (setup_places or {}).get(pointer, (None, None))
            if where is None:
                unplaced_setup += size
        if where is not None:
            usage = lines.get(where[:2])
            if usage is None:
                usage = lines[where[:2]] = LineUsage(where[0], where[1], 0, where[2], _source_line(*where[:2]))
            usage.bytes += size
            usage.allocations += 1
        if module is not None and module in names.names:
            qualified, kind = names.names[module]
            entry = modules.setdefault(qualified, ModuleUsage(qualified, kind, 0))
            entry.bytes += size
    return {
        "peak": peak,
        "before_training": before_training,
        "step_peaks": step_peaks,
        "completed_windows": steps_marked,
        "top_lines": sorted(lines.values(), key=lambda u: (-u.bytes, u.file, u.line))[:TOP_LINES],
        "top_modules": sorted(modules.values(), key=lambda m: (-m.bytes, m.name))[:TOP_MODULES],
        # Beside what was allocated before training with no known place (noted on its own).
        "unattributed": peak - sum(u.bytes for u in lines.values()) - unplaced_setup,
        "memory_stacks": stacks,
    }


def _event_name(node: Any) -> str:
    try:
        return node.name
    except UnicodeDecodeError:  # a code object that died outside KeepCodeAlive's reach (keepalive.py)
        return "[freed frame]"


def _folded_stack(node: Any, event_type: Any, script: str, renames: dict[str, str] | None = None) -> str:
    """'outer;...;inner' from the script's top level down to the op that allocated (flame graph format)."""
    names = []
    parent = node.parent
    while parent is not None:
        if parent.tag in (event_type.PyCall, event_type.PyCCall, event_type.TorchOp):
            name = _event_name(parent)
            names.append((renames or {}).get(name, name))
        parent = parent.parent
    names.reverse()
    top = f"{script}("  # the script's module frame: the harness's frames above it are dropped
    start = next((i for i, name in enumerate(names) if name.startswith(top)), 0)
    return ";".join(name.replace(";", "_").replace(" ", "_") for name in names[start:]) or "[no Python frame]"


def _attribute(node: Any, event_type: Any) -> tuple[tuple[str, int, str] | None, int | None]:
    """The innermost user-code call site above an allocation, and the innermost module."""
    where = None
    module = None
    parent = node.parent
    while parent is not None and (where is None or module is None):
        if parent.tag in (event_type.PyCall, event_type.PyCCall):
            fields = parent.extra_fields
            caller = fields.caller
            try:
                file = caller.file_name
                if where is None and is_profiled_user_file(file):
                    where = (file, caller.line_number, caller.function_name)
            except UnicodeDecodeError:
                pass  # a freed code object (see keepalive.py) cannot be the user's script: skip the frame
            if module is None and parent.tag == event_type.PyCall and fields.module is not None:
                module = fields.module.self_ptr
        parent = parent.parent
    return where, module


def _device_info(torch: Any, use_cuda: bool) -> DeviceInfo:
    if use_cuda:
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo("cuda", props.name, index, int(props.total_memory))
    return DeviceInfo("cpu", platform.processor() or platform.machine() or None)


def _memory_state(torch: Any, use_cuda: bool) -> dict[str, int]:
    if not use_cuda:
        return {}
    cuda = torch.cuda
    return {
        "allocated": int(cuda.memory_allocated()),
        "reserved": int(cuda.memory_reserved()),
        "max_allocated": int(cuda.max_memory_allocated()),
        "max_reserved": int(cuda.max_memory_reserved()),
    }


def run(script: Path, script_args: list[str], out: Path, steps: int, device: str, progress: Progress) -> Report:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise SystemExit(f"oom-lsp: --device cuda, but torch {torch.__version__} sees no CUDA device")
    notes: list[str] = []

    # Keep absolute file names in the profiler's Python frames (it shortens them by sys.path).
    import torch.profiler.python_tracer as python_tracer

    python_tracer._prefix_regex = lambda: []

    from torch.optim.optimizer import register_optimizer_step_post_hook  # torch >= 2.0

    activities = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.reset_peak_memory_stats()
    phases = Phases(torch, activities, use_cuda)
    recorder = StepRecorder(torch, steps, use_cuda, progress, phases)
    names = ModuleNames(torch)
    hooks = [
        register_optimizer_step_post_hook(recorder.hook),
        # An optimizer, or the first forward pass of a module, starts training: the full recording.
        types.SimpleNamespace(remove=phases.watch_optimizers()),
        torch.nn.modules.module.register_module_forward_pre_hook(phases.pre_hook),
        torch.nn.modules.module.register_module_forward_pre_hook(names.pre_hook),
    ]

    report = Report(
        script=str(script),
        argv=list(script_args),
        status="finished",
        device=_device_info(torch, use_cuda),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda if use_cuda else None,
        python_version=platform.python_version(),
        measured_with="cuda-allocator" if use_cuda else "cpu-profiler",
        steps_requested=steps,
    )
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *script_args]
    sys.path[0] = str(script.parent)  # as for `python SCRIPT`: the script's folder, not our working directory
    progress.send("started", device=report.device.type)
    started = time.perf_counter()
    code = compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__file__=str(script), __cached__=None, __loader__=None, __package__=None,
                                __spec__=None, __builtins__=builtins)
    saved_main = sys.modules["__main__"]
    sys.modules["__main__"] = main_module
    keep_code = KeepCodeAlive().__enter__()
    phases.setup.start()
    try:
        # runpy.run_path(run_name="__main__") does this too, but throws its code objects away when the
        # script ends; the profiler's Python events point at their names, so `code` must outlive the
        # analysis below (it holds every function's code object, nested ones included).
        _exec(code, main_module.__dict__)
    except StopProfiling:
        report.status = "completed"
    except SystemExit as exc:
        report.status = "exited"
        report.exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # the user's failure is the result: record it, print it like Python would
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the script's frame on
        frames = [f for f in _frames_of(exc.__traceback__) if not f.file.startswith(_PACKAGE_ROOT)]
        oom = from_exception(exc, frames)
        if oom is not None:
            report.status = "oom"
            report.oom = OomFailure(oom, _memory_state(torch, use_cuda), step=len(recorder.steps) + 1)
        else:
            report.status = "error"
            report.error = f"{type(exc).__qualname__}: {exc}"
    finally:
        recorder.stopping = True
        profiler = phases.stop()
        keep_code.__exit__(None, None, None)
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main
        for handle in [*hooks, *phases.places.handles]:
            handle.remove()
    ended = time.perf_counter()
    report.wall_time = round(ended - started, 6)

    progress.send("analysing")
    # Written under a fresh name, then renamed: a link planted at the final name is replaced.
    trace = safe_files.temporary_file(out, "trace.json", root=out)
    profiler.export_chrome_trace(str(trace))
    report.artifacts.trace = safe_files.publish(trace, out / "trace.json", root=out).name
    analysis = analyse_allocations(
        profiler,
        "cuda" if use_cuda else "cpu",
        names,
        str(script),
        before=phases.setup if phases.started else None,
        setup_places=phases.places.by_pointer,
        frame_names=phases.frame_names,
    )
    report.top_lines = analysis["top_lines"]
    report.top_modules = analysis["top_modules"]
    report.batch_size, report.input_shape = names.batch_size, names.input_shape
    if not phases.started:
        notes.append(
            "no module's forward pass and no optimizer step ran: recorded without Python stacks (no lines)"
        )
    elif analysis["before_training"] > 0:
        notes.append(
            f"{analysis['before_training']} bytes live when training started were allocated before its "
            "first forward pass (the model, the data): counted in the peaks; lines and stacks are recorded "
            "from that forward pass on"
        )
    if analysis["unattributed"] > 0:
        notes.append(
            f"{analysis['unattributed']} bytes live at the peak were allocated with no user-code frame above them "
            "(e.g. before the script ran, or on another thread)"
        )
    cut_short = report.status != "completed"
    if use_cuda:
        if cut_short:
            recorder.steps.append(StepStats(
                len(recorder.steps) + 1, int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved()),
                round(ended - recorder.step_started, 6), complete=False,
            ))
        report.steps = recorder.steps
        report.peak_allocated = max([s.peak_allocated for s in recorder.steps] + [int(torch.cuda.max_memory_allocated())])
        report.peak_reserved = max(
            [s.peak_reserved or 0 for s in recorder.steps] + [int(torch.cuda.max_memory_reserved())]
        )
        report.memory_summary = torch.cuda.memory_summary()
        if report.peak_allocated == 0:
            notes.append("no CUDA memory was allocated: the script ran on the CPU (profile it with --device cpu)")
        snapshot = safe_files.temporary_file(out, "snapshot.pickle", root=out)
        torch.cuda.memory._dump_snapshot(str(snapshot))
        if phases.started:
            torch.cuda.memory._record_memory_history(enabled=None)
        report.artifacts.snapshot = safe_files.publish(snapshot, out / "snapshot.pickle", root=out).name
    else:
        for step, peak in zip(recorder.steps, analysis["step_peaks"]):
            step.peak_allocated = peak
        if cut_short and analysis["step_peaks"][-1] > 0:
            recorder.steps.append(StepStats(
                len(recorder.steps) + 1, analysis["step_peaks"][-1],
                wall_time=round(ended - recorder.step_started, 6), complete=False,
            ))
        report.steps = recorder.steps
        report.peak_allocated = analysis["peak"]
        notes.append("CPU run: peaks are the c10 CPU allocator's live bytes (no caching, no 512 B rounding)")
    if report.status == "finished" and len(report.steps) < steps:
        notes.append(f"the script ended after {len(report.steps)} of {steps} optimizer steps")

    # torch's export_stacks knows only time metrics (and writes nothing unless the profiler ran in
    # verbose mode, which makes the trace ~4x bigger): the memory flame graph is written here.
    stacks = safe_files.write_file(
        out / "stacks.txt",
        "".join(f"{stack} {size}\n" for stack, size in sorted(analysis["memory_stacks"].items())),
        root=out,
    )
    report.artifacts.stacks = stacks.name
    report.notes = notes
    report.write(out / "report.json", root=out)
    del keep_code, code  # the profile has been read: its code objects may go now
    progress.send("done", status=report.status)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oom_lsp.profiling.harness")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--progress-fd", type=int)
    parser.add_argument("script", type=Path)
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    watchdog.arm_from_environment()
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    progress = Progress(args.progress_fd)
    # torch warns at import when NumPy is not installed; that is the environment, not the script.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch  # noqa: F401  (only to fail early and clearly)
    except ImportError as exc:
        progress.send("error", kind="no-torch", message=f"{sys.executable} has no torch: {exc}")
        print(f"oom-lsp: {sys.executable} has no torch: {exc}", file=sys.stderr)
        return NO_TORCH_EXIT
    report = run(args.script.resolve(), script_args, args.out.resolve(), args.steps, args.device, progress)
    return 0 if report.status in ("completed", "finished", "exited") else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once: a user thread that never ends or an atexit handler must not keep the
    # process (and the parent waiting on it) alive once the report is written.
    os._exit(code)
