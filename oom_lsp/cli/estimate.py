"""`oom-lsp estimate`: predict a training step's peak GPU memory without a GPU.

    oom-lsp estimate train.py [--device cuda|cpu] [--gpu NAME | --gpu-memory 24GiB]
        [--batch-size N] [--dtype bf16] [--python PATH] [--format text|json]
        [--find-max-batch] [--timeout S] [--world-size N|1,2,4,8 [--nproc-per-node M]]
        [--cuda-version X.Y] -- ARGS...

Exit codes: 0 the step fits (or no target was given), 1 it is predicted to run
out of memory at the script's batch size (or, with --find-max-batch, not even
batch size 1 fits; with several world sizes, at none of them), 2 the estimate failed.
No torch import here: the script runs under --python in a child process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from oom_lsp.cli.live import LiveLine
from oom_lsp.script_args import positive_seconds, running_line, split_script_arguments

if TYPE_CHECKING:
    from oom_lsp.estimate.results import EstimateResult, Prediction, Sweep
    from oom_lsp.usecases.estimate import Listener

EXIT_FITS, EXIT_OOM, EXIT_ERROR = 0, 1, 2
DTYPES = ("fp32", "bf16", "fp16")
_PHASE_WORDS = {"forward": "forward pass", "backward": "backward pass"}
_BOUNDS = {
    "memory": "memory: batch {batch:,}, checked too, does not keep that margin",
    "data": "the data: at batch {batch:,} the script does not reach two optimizer steps",
}


def add_parsers(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="predict a training step's peak GPU memory without a GPU",
        description="Run SCRIPT (unchanged) on fake tensors through two optimizer steps and predict the peak "
        "GPU memory of a training step, its breakdown, and whether it fits the target GPU.",
    )
    parser.add_argument("script", nargs="?", type=Path, help="the training script")
    # Everything after SCRIPT: estimate options, then `--` and the script's own arguments
    # (argparse alone cannot take options after a positional and more positionals after `--`).
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    _add_options(parser, defaults=True)
    parser.set_defaults(handler=run_estimate, takes_script_args=True)


def _add_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=default("cuda"),
        help="cuda (default): predict the GPU; cpu: the trace as a real CPU step measures it",
    )
    parser.add_argument(
        "--gpu",
        default=default(None),
        help='target GPU by name, e.g. "RTX 3090", "A100 80GB", "H100" (see --list-gpus)',
    )
    parser.add_argument(
        "--gpu-memory",
        default=default(None),
        help='target memory, e.g. "24GiB", "80 GB" (default: gpu-memory in [tool.oom-lsp])',
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=default(None),
        help="override the script's batch size (an argparse option, DataLoader batch_size, a module global "
        "batch_size, TrainingArguments per_device_train_batch_size, a Lightning batch_size parameter)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=default(None),
        help="trace the step under torch.autocast with this dtype",
    )
    parser.add_argument(
        "--python",
        default=default(sys.executable),
        help="the interpreter with your torch (default: this one)",
    )
    parser.add_argument("--format", choices=("text", "json"), default=default("text"))
    parser.add_argument(
        "--snapshot",
        type=Path,
        metavar="FILE.pickle",
        default=default(None),
        help="write the traced step in PyTorch's memory-snapshot format (open it with "
        "`python -m torch.cuda._memory_viz trace_plot FILE.pickle -o out.html` or pytorch.org/memory_viz)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE.html",
        default=default(None),
        help="write the memory timeline of the traced step as one self-contained page (opens offline)",
    )
    parser.add_argument(
        "--find-max-batch",
        action="store_true",
        default=default(False),
        help="the largest batch size that fits the target (two fake traces and a check)",
    )
    parser.add_argument(
        "--what-if",
        action="store_true",
        default=default(False),
        help="also trace the step once per change (each quick fix of the script's findings, bf16 autocast, "
        "checkpointing per block, half the micro-batch with accumulation, a fused optimizer, Adafactor) and "
        "print what each saves, largest first",
    )
    parser.add_argument(
        "--margin",
        type=_margin,
        default=default(None),
        help="share of the GPU kept free: the verdict is tight above it, --find-max-batch stays under it "
        "(default 10%%; 0.1 or 10%%)",
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, default=default(300.0), help="seconds before the run is killed (default 300)"
    )
    parser.add_argument(
        "--list-gpus", action="store_true", default=default(False), help="print the GPU catalogue and exit"
    )
    parser.add_argument(
        "--world-size",
        default=default(None),
        help="a torchrun-style script (DDP, FSDP2) traced as rank 0 of N GPUs; a list such as 1,2,4,8 "
        "estimates each size and finds the fewest GPUs that fit",
    )
    parser.add_argument(
        "--cuda-version",
        metavar="X.Y",
        default=default(None),
        help="the CUDA release of the target machine's PyTorch (the CUDA context depends on it; default: "
        "the --python torch's, else 12.x with lazy kernel loading)",
    )
    parser.add_argument(
        "--accelerate-config",
        type=Path,
        default=default(None),
        help="with --world-size: the variables `accelerate launch --config_file FILE` gives the script "
        "(DDP or FSDP2 from the config), read by the accelerate of --python",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=default(None),
        help="GPUs per node, as torchrun's --nproc-per-node (default: the world size, all on one node)",
    )


def _margin(text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 10% or 0.1, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"the margin must be from 0% to below 100%, got {text!r}")
    return value


def run_estimate(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    problem = split_script_arguments(args, "estimate", _add_options)
    if problem:
        err.write(f"oom-lsp estimate: {problem}\n")
        return EXIT_ERROR
    if args.gpu and args.gpu_memory:
        err.write("oom-lsp estimate: give --gpu or --gpu-memory, not both\n")
        return EXIT_ERROR
    if args.what_if and args.find_max_batch:
        err.write("oom-lsp estimate: give --what-if or --find-max-batch, not both\n")
        return EXIT_ERROR
    if (args.snapshot or args.html) and (args.find_max_batch or (args.world_size and "," in args.world_size)):
        err.write(
            "oom-lsp estimate: --snapshot and --html draw one trace: "
            "not with --find-max-batch or a list of world sizes\n"
        )
        return EXIT_ERROR
    if args.snapshot and args.what_if:
        err.write("oom-lsp estimate: --snapshot exports the script's own trace: give it without --what-if\n")
        return EXIT_ERROR
    for flag, path in (("--snapshot", args.snapshot), ("--html", args.html)):
        if path is not None and not path.resolve().parent.is_dir():
            # Said before a trace that can take minutes, not after it.
            err.write(f"oom-lsp estimate: {flag} {path}: no such folder {path.parent}\n")
            return EXIT_ERROR
    if args.what_if and args.world_size is not None and "," in args.world_size:
        err.write("oom-lsp estimate: --what-if traces one world size: give --world-size N, not a list\n")
        return EXIT_ERROR
    if args.list_gpus:
        from oom_lsp.estimate.gpus import CATALOGUE
        from oom_lsp.units import format_bytes

        for gpu in CATALOGUE:
            aliases = f"  ({', '.join(gpu.aliases)})" if gpu.aliases else ""
            out.write(f"{gpu.name:<34} {format_bytes(gpu.memory):>11}{aliases}\n")
        return EXIT_FITS
    if args.script is None:
        err.write("oom-lsp estimate: give the training script to estimate\n")
        return EXIT_ERROR
    if not args.script.is_file():
        problem = "a folder, not a script" if args.script.is_dir() else "no such file"
        err.write(f"oom-lsp estimate: {args.script}: {problem}\n")
        return EXIT_ERROR
    from oom_lsp.config import ConfigError, ConfigResolver
    from oom_lsp.notebooks import is_notebook_path
    from oom_lsp.usecases.estimate import EstimateInputError, resolve_target

    try:
        config = ConfigResolver().resolve(args.script)
        gpu = resolve_target(config, args.gpu, args.gpu_memory)
    except (ConfigError, EstimateInputError) as error:
        err.write(f"oom-lsp estimate: {error}\n")
        return EXIT_ERROR
    if (args.snapshot or args.html) and is_notebook_path(str(args.script)):
        # Its lines would name the notebook's generated script, not cells: not mapped yet.
        err.write(f"oom-lsp estimate: {args.script}: --snapshot and --html take a .py script, not a notebook (yet)\n")
        return EXIT_ERROR
    if args.what_if and is_notebook_path(str(args.script)):
        err.write(f"oom-lsp estimate: {args.script}: --what-if takes a .py script, not a notebook\n")
        return EXIT_ERROR
    try:
        request = _request(args, gpu, config.root)
    except ValueError as error:  # a world size or an option that needs one
        err.write(f"oom-lsp estimate: {error}\n")
        return EXIT_ERROR
    err.write(running_line("estimate", args.script, list(args.script_args), args.python) + "\n")
    if args.what_if:
        return run_what_if(args, request, config, out, err)
    return _estimate(args, request, out, err)


def _request(args: argparse.Namespace, gpu: Any, root: Path) -> Any:
    """The use case's request from the flags (raises ValueError for a flag that needs another)."""
    from oom_lsp.estimate import distributed
    from oom_lsp.estimate.estimator import DEFAULT_MARGIN
    from oom_lsp.usecases.estimate import EstimateRequest

    world_sizes = distributed.parse_world_sizes(args.world_size) if args.world_size is not None else None
    if args.nproc_per_node is not None and (world_sizes is None or args.nproc_per_node < 1):
        raise ValueError("--nproc-per-node needs --world-size, and at least 1 GPU per node")
    if args.accelerate_config is not None:
        if world_sizes is None:
            raise ValueError("--accelerate-config needs --world-size")
        if not args.accelerate_config.is_file():
            raise ValueError(f"--accelerate-config {args.accelerate_config}: no such file")
    return EstimateRequest(
        script=args.script,
        script_args=list(args.script_args),
        device=args.device,
        gpu=gpu,
        batch_size=args.batch_size,
        dtype=args.dtype,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        python=args.python,
        timeout=args.timeout,
        world_sizes=world_sizes,
        nproc_per_node=args.nproc_per_node,
        accelerate_config=args.accelerate_config,
        cuda_version=args.cuda_version,
        find_max_batch=args.find_max_batch,
        root=root,
        display=str(args.script),
        timeline=bool(args.snapshot or args.html),
    )


def _estimate(args: argparse.Namespace, request: Any, out: TextIO, err: TextIO) -> int:
    from oom_lsp.estimate.results import Sweep, Verdict
    from oom_lsp.usecases.estimate import run_estimate

    display = EstimateDisplay(err, f"estimating {args.script.name}", quiet=args.format != "text")
    # Above the status line on a terminal; in every format (the JSON goes to stdout).
    listener = display.listener(
        on_warning=lambda warning: display.line(f"oom-lsp estimate: warning: {args.script}: {warning}")
    )
    outcome, code = _attempt(args, display, lambda: run_estimate(request, listener), out, err)
    if outcome is None:
        return code
    if args.format == "json":
        out.write(json.dumps(outcome.to_json(), indent=2) + "\n")
    elif isinstance(outcome, Sweep):
        write_sweep(outcome, out)
    else:
        write_text(outcome.prediction, out, outcome)
        if outcome.what_if_check is not None:
            from oom_lsp.estimate.wording import comparison_words

            out.write(f"  {comparison_words(outcome.what_if_check)}\n")
    # After the estimate is printed: a file that cannot be written loses nothing else.
    if not isinstance(outcome, Sweep) and not _write_pictures(args, outcome, None, err):
        return EXIT_ERROR
    if isinstance(outcome, Sweep):
        return EXIT_OOM if outcome.all_run_out else EXIT_FITS
    if outcome.prediction.verdict is Verdict.OOM or outcome.fits_nothing:
        return EXIT_OOM
    return EXIT_FITS


def _write_pictures(args: argparse.Namespace, result: Any, what_if: Any, err: TextIO) -> bool:
    """--snapshot and --html: writes each file asked for and says where on stderr; False (said
    why) when the estimate has no trace to draw (real CPU steps) or a file cannot be written."""
    if not (args.snapshot or args.html):
        return True
    timeline = result.prediction.timeline
    if timeline is None:
        err.write(
            "oom-lsp estimate: no memory timeline: the script could not be traced on fake tensors "
            "(the estimate measured real CPU steps)\n"
        )
        return False
    from oom_lsp.estimate.timeline import write_snapshot

    try:
        if args.snapshot:
            write_snapshot(timeline, args.snapshot)
            err.write(
                f"oom-lsp estimate: wrote {args.snapshot} (PyTorch memory snapshot: "
                f"python -m torch.cuda._memory_viz trace_plot {args.snapshot} -o trace.html)\n"
            )
        if args.html:
            from oom_lsp.estimate.page import write_page

            write_page(result, what_if, args.html)
            err.write(f"oom-lsp estimate: wrote {args.html}\n")
    except OSError as error:
        err.write(f"oom-lsp estimate: cannot write {error.filename}: {error.strerror}\n")
        return False
    return True


def run_what_if(args: argparse.Namespace, request: Any, config: Any, out: TextIO, err: TextIO) -> int:
    from oom_lsp.checker import analyze_text
    from oom_lsp.cli.what_if import write_table
    from oom_lsp.config import ConfigError
    from oom_lsp.estimate.results import Verdict
    from oom_lsp.usecases import what_if
    from oom_lsp.usecases.estimate import EstimateInputError

    try:
        text, encoding = what_if.read_script(request.script)
        settings = config.settings_for(request.script)
    except (EstimateInputError, ConfigError) as error:
        err.write(f"oom-lsp estimate: {error}\n")
        return EXIT_ERROR
    findings = analyze_text(text, settings, str(request.script))
    display = EstimateDisplay(err, f"what if: {args.script.name}", quiet=args.format != "text")
    listener = display.listener()

    def work() -> Any:
        # With --html the changes' traces record their timelines: the page draws each against the
        # script's own step.
        timed = dataclasses.replace(request, timeline=bool(args.html))
        return what_if.run_what_if(timed, text, encoding, findings, settings, listener)

    table, code = _attempt(args, display, work, out, err)
    if table is None:
        return code
    if args.format == "json":
        out.write(json.dumps(table.to_json(), indent=2) + "\n")
    else:
        write_table(table, out)
    if args.html:
        # The page draws the script's own step (one more trace) with the what-if rows beside it.
        from oom_lsp.usecases.estimate import run_estimate as estimate_script

        result, code = _attempt(args, display, lambda: estimate_script(request, listener), out, err)
        if result is None:
            return code
        if not _write_pictures(args, result, table, err):
            return EXIT_ERROR
    return EXIT_OOM if table.baseline.verdict is Verdict.OOM else EXIT_FITS


def _attempt(
    args: argparse.Namespace, display: EstimateDisplay, work: Callable[[], Any], out: TextIO, err: TextIO
) -> tuple[Any, int]:
    """`work()` under the status line: (its result, 0), or (None, the exit code) once said why:
    a request no run can answer in one line, an estimate that failed as --format asks."""
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.usecases.estimate import EstimateInputError

    try:
        with display:
            return work(), EXIT_FITS
    except EstimateInputError as error:
        err.write(f"oom-lsp estimate: {error}\n")
        return None, EXIT_ERROR
    except EstimateError as error:
        return None, failed(args, str(error), out, err)


def failed(args: argparse.Namespace, problem: str, out: TextIO, err: TextIO) -> int:
    """An estimate that could not be made: its reason as JSON (--format json) or one line on stderr."""
    if args.format == "json":
        out.write(json.dumps({"error": problem}) + "\n")
    else:
        err.write(f"oom-lsp estimate: {problem}\n")
    return EXIT_ERROR


class EstimateDisplay(LiveLine):
    """On a terminal, one redrawn line: which trace (and its batch size), the phase, the
    optimizer steps it reached, the time. Elsewhere (a pipe, CI, --format json) no line; the
    search's messages are printed as lines either way (not with --format json)."""

    STEPS = 2  # what the harness traces

    def __init__(self, stream: TextIO, label: str, quiet: bool) -> None:
        super().__init__(stream, label, live=not quiet)
        self.quiet = quiet
        self.trace = 0
        self.batch: int | None = None
        self.steps = 0
        self.phase = "starting Python and importing torch"
        self.search: str | None = None  # --find-max-batch's check under way

    def listener(self, **more: Any) -> Listener:
        """What the use case tells this display while it runs."""
        from oom_lsp.usecases.estimate import Listener

        return Listener(on_event=self.on_event, on_message=self.message, **more)

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "starting":
            self.phase = "starting Python and importing torch"
        elif kind == "ready":
            self.phase = "torch imported"
        elif kind == "run-start":
            self.trace += 1
            self.batch, self.steps = event.get("batch_size"), 0
            self.phase = "running the script"
        elif kind == "step":
            self.steps = int(event.get("step", self.steps))
            self.phase = "tracing" if self.steps < self.STEPS else "traced"
        elif kind == "run":
            self.phase = "reading the trace"
        elif kind == "search-check":
            self.search = f"search: check {event['check']} of at most {event['of']}"
        if self.tty:
            self.draw()

    def message(self, text: str) -> None:
        if not self.quiet:
            self.line(f"oom-lsp estimate: {text}")

    def render(self) -> str:
        parts = [self.phase, f"{self.steps}/{self.STEPS} optimizer steps", f"{self.elapsed:.1f} s"]
        if self.trace:
            parts.insert(0, f"trace {self.trace}" + (f" (batch {self.batch:,})" if self.batch else ""))
        if self.search:
            parts.insert(0, self.search)
        return f"{self.label}: {' · '.join(parts)}"


def _rel(path: str | None) -> str:
    if not path:
        return "-"
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


_CELL_PLACE_RE = re.compile(r"(.*):cell (\d+)\Z")


def _place(file: str | None, line: object, cell: int | None = None) -> str:
    """`train.py:12`, or for a notebook's cells `nb.ipynb, cell 4, line 3`."""
    return f"{_rel(file)}, cell {cell}, line {line}" if cell is not None else f"{_rel(file)}:{line}"


def _shapes_words(shapes: dict[str, list[int]]) -> str:
    return ", ".join(
        f"{path + ' ' if path else ''}{'x'.join(str(size) for size in shape) or 'scalar'}"
        for path, shape in shapes.items()
    )


def _batch_words(prediction: Prediction) -> str:
    """Which batch the peak happened with, e.g. "step 2, micro-batch 3 (input_ids 2x138), batch 11
    of the DataLoader at train.py:40 (24 batches traced, each as the loader gave it)"."""
    batch = prediction.peak_batch
    assert batch is not None
    traced = prediction.batches_traced
    when = f"step {batch.step}, micro-batch {batch.micro_batch}" if batch.step else "a batch"
    counted = f"; {traced} batches traced, each as the loader gave it" if traced else ""
    return (
        f"{when} ({_shapes_words(batch.shapes)}), batch {batch.index} of the DataLoader at "
        f"{_place(batch.loader.file, batch.loader.line)}{counted}"
    )


def _worst_case_words(prediction: Prediction) -> str:
    """The longest batch the data can produce, and the peak with it for every batch."""
    from oom_lsp.units import format_bytes

    worst = prediction.worst_case
    assert worst is not None
    longest = []
    for batch in worst.batches:
        scanned = (
            f"the {batch.batch_size} largest of {batch.samples:,} samples"
            if batch.scanned >= batch.samples
            else f"the {batch.batch_size} largest of the first {batch.scanned:,} of {batch.samples:,} "
            "samples (the rest not read, for time)"
        )
        longest.append(
            f"{_shapes_words(batch.shapes)} ({scanned}, DataLoader at "
            f"{_place(batch.loader.file, batch.loader.line)})"
        )
    verdict = f", {worst.verdict.value.upper()}" if worst.verdict else ""
    held = f", {format_bytes(worst.process_bytes)} process total" if worst.process_bytes is not None else ""
    return (
        f"{format_bytes(worst.peak_bytes)} allocated{held}{verdict} with the longest batch the data can "
        f"produce at every step: {'; '.join(longest)}"
    )


def write_text(prediction: Prediction, out: TextIO, result: EstimateResult | None = None) -> None:
    """The prediction as the CLI prints it; `result`: with its search's answer."""
    from oom_lsp.units import format_bytes

    def row(label: str, value: str, note: str = "") -> None:
        out.write(f"  {label:<18} {value:>11}{'   ' + note if note else ''}\n")

    batch = prediction.batch_size
    launch = prediction.distributed
    out.write(
        f"{_rel(prediction.script)}: batch size {batch if batch else 'as in the script'}"
        + (" per rank" if launch else "")
        + f", device {prediction.device}, torch {prediction.torch}"
        + (f", rank 0 of {launch.world_size} ({launch.nproc_per_node} per node)" if launch else "")
        + "\n"
    )
    out.write(f"  method: {prediction.method}\n")
    if prediction.fallback:
        out.write(f"  why: {prediction.fallback.reason}\n  uncertainty: {prediction.fallback.uncertainty}\n")
    cuda = prediction.device == "cuda"
    row(
        "peak allocated",
        format_bytes(prediction.peak_bytes),
        "what torch.cuda.max_memory_allocated() would show"
        if cuda
        else "live tensor storage, as a CPU step holds it",
    )
    if prediction.breakdown_batch_size:
        out.write(f"    breakdown measured at batch {prediction.breakdown_batch_size}:\n")
    for category, size in prediction.breakdown.printed():
        row("  " + category.label, format_bytes(size))
    if prediction.reserved_bytes is not None:
        row("reserved", format_bytes(prediction.reserved_bytes), "caching allocator segments (modelled)")
        nccl = any(note.name == "nccl-buffers" for note in prediction.corrections)
        row(
            "+ context, NCCL" if nccl else "+ CUDA context",
            format_bytes(prediction.context_bytes),
            f"= {format_bytes(prediction.process_bytes)} process total (nvidia-smi)",
        )
    where = prediction.peak_at
    if where.op:
        phase = where.phase
        when = (
            " outside the forward pass, backward pass and optimizer step"
            if phase == "outside the step"
            else f" during the {_PHASE_WORDS.get(phase, phase)}"
            if phase
            else ""
        )
        module = f", in module {where.module}" if where.module else ""
        location = f", {_place(where.file, where.line, where.cell)}" if where.file else ""
        out.write(f"  peak at: {where.op}{when}{module}{location}\n")
    if prediction.peak_batch:
        out.write(f"  peak batch: {_batch_words(prediction)}\n")
    modules = [(name, size) for name, size in prediction.top_modules if name]
    if modules:
        out.write("  top modules at the peak (memory they allocated that is still live):\n")
        for name, size in modules[:5]:
            out.write(f"    {format_bytes(size):>11}  {name}\n")
    if prediction.top_lines:
        out.write("  top lines at the peak:\n")
        for place, size in prediction.top_lines[:5]:
            file, _, line = place.rpartition(":")
            cell = _CELL_PLACE_RE.match(file)  # a notebook's "nb.ipynb:cell 4:3"
            shown = _place(cell[1], line, int(cell[2])) if cell else _place(file, line)
            out.write(f"    {format_bytes(size):>11}  {shown}\n")
    gpu = prediction.gpu
    if gpu:
        from oom_lsp.estimate.cuda_terms import verdict_words

        out.write(f"  target: {gpu.name}" + (f", {format_bytes(gpu.memory)}" if gpu.named else "") + "\n")
        per_gpu = " on each GPU" if launch else ""
        if prediction.verdict_basis is not None and prediction.verdict is not None:
            out.write(f"  verdict{per_gpu}: {verdict_words(prediction)}\n")
    else:
        out.write(
            "  target: none (pass --gpu NAME or --gpu-memory SIZE, or set gpu-memory in [tool.oom-lsp])\n"
        )
    if prediction.worst_case:
        out.write(f"  worst case: {_worst_case_words(prediction)}\n")
    if prediction.corrections:
        out.write("  applied:\n")
        for note in prediction.corrections:
            size = f" [{format_bytes(note.bytes)}]" if note.bytes else ""
            out.write(f"    - {note.detail}{size}\n")
    search = result.max_batch if result is not None else None
    if search is not None:
        _write_search(search, out)


def _write_search(search: Any, out: TextIO) -> None:
    from oom_lsp.units import format_bytes

    fit = search.fit
    out.write(
        f"  fit: peak = {format_bytes(fit.intercept_bytes)} + {format_bytes(fit.bytes_per_sample)} "
        f"x batch (traced at {fit.batch_sizes[0]} and {fit.batch_sizes[1]})\n"
    )
    if search.max_batch:
        verified = search.verified
        held = (
            f"{format_bytes(verified.reserved_bytes)} reserved + "
            f"{format_bytes(verified.context_bytes)} context, "
            f"{format_bytes(verified.peak_bytes)} allocated"
            if verified.reserved_bytes is not None
            else f"{format_bytes(verified.peak_bytes)} allocated"
        )
        out.write(f"  largest batch that fits: {search.max_batch:,} (checked by a fake run: {held})\n")
        out.write(f"    keeps {search.limit}\n")
        if search.next_checked:
            bound = _BOUNDS[search.bound].format(batch=search.next_checked)
            out.write(f"    bound by {bound}\n")
        elif search.bound == "search limit":
            out.write(
                f"    bound by the search, which stops at {search.search_limit:,}: the memory line "
                f"alone gives {search.line_max_batch:,} (estimate a larger one with --batch-size N)\n"
            )
        else:
            out.write("    bound by memory: the line's answer, checked by a fake run\n")
        if search.explanation:
            out.write(f"    why not the line's answer: {search.explanation}\n")
    else:
        out.write(f"  largest batch that fits: none ({search.reason})\n")
    accumulation = search.gradient_accumulation
    if accumulation:
        out.write(
            f"  the script's batch {search.script_batch_size} does not fit: use batch "
            f"{accumulation.micro_batch} with {accumulation.steps} gradient accumulation steps "
            f"(effective batch {accumulation.effective_batch})\n"
        )


def write_sweep(outcome: Sweep, out: TextIO) -> None:
    """The per-rank peak at each world size, the fewest GPUs that fit, then the details of that size."""
    from oom_lsp.estimate.results import EstimateResult
    from oom_lsp.units import format_bytes

    runs = outcome.runs
    first = runs[0].estimate
    batch = first.batch_size
    sizes = ", ".join(str(row.world_size) for row in runs)
    out.write(
        f"{_rel(first.script)}: batch size {batch if batch else 'as in the script'} per rank, "
        f"device {first.device}, torch {first.torch}, world sizes {sizes}\n"
    )
    out.write(f"  method: {first.method.split(' as rank 0 of ')[0]} as rank 0 of each world size\n")
    gpu = first.gpu
    cuda = first.device == "cuda"
    searched = any(row.max_batch is not None for row in runs)
    header = f"  {'GPUs':>5}  {'peak per rank':>14}"
    if cuda:
        header += f"  {'reserved + context, NCCL':>25}"
    if gpu:
        header += f"  {'verdict':<22}"
    if searched:
        header += "  largest batch per rank"
    out.write(header.rstrip() + "\n")
    for row in runs:
        estimate = row.estimate
        line = f"  {row.world_size:>5}  {format_bytes(estimate.peak_bytes):>14}"
        if cuda:
            line += f"  {format_bytes(estimate.process_bytes or 0):>25}"
        if gpu:
            line += f"  {estimate.verdict.value if estimate.verdict else '-':<22}"
        if searched:
            found = row.max_batch.max_batch if row.max_batch is not None else None
            line += f"  {found:,}" if found else "  none"
        out.write(line.rstrip() + "\n")
    if gpu:
        each = f"{gpu.name}" + (f", {format_bytes(gpu.memory)}" if gpu.named else "")
        fewest = outcome.fewest_gpus
        if fewest is not None:
            out.write(f"  fewest GPUs that fit: {fewest} x {each}\n")
        else:
            out.write(f"  fewest GPUs that fit: none of {sizes} x {each} fits with the margin\n")
        shown = next((row for row in runs if row.world_size == fewest), runs[-1])
    else:
        out.write("  target: none (pass --gpu NAME or --gpu-memory SIZE for the fewest GPUs that fit)\n")
        shown = runs[-1]
    out.write(f"\ndetails at {shown.world_size} GPU{'s' if shown.world_size > 1 else ''}:\n")
    write_text(shown.estimate, out, EstimateResult(shown.estimate, shown.max_batch))
