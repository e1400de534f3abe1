"""`oom-lsp estimate`: predict a training step's peak GPU memory without a GPU.

    oom-lsp estimate train.py [--device cuda|cpu] [--gpu NAME | --gpu-memory 24GiB]
        [--batch-size N] [--dtype bf16] [--python PATH] [--format text|json]
        [--find-max-batch] [--timeout S] [--world-size N|1,2,4,8 [--nproc-per-node M]] -- ARGS...

Exit codes: 0 the step fits (or no target was given), 1 it is predicted to run
out of memory at the script's batch size (or, with --find-max-batch, not even
batch size 1 fits; with several world sizes, at none of them), 2 the estimate failed.
No torch import here: the script runs under --python in a child process.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from oom_lsp.estimate.cuda_terms import verdict_words
from oom_lsp.profiling.commands import LiveLine
from oom_lsp.script_args import positive_seconds, running_line, split_script_arguments

if TYPE_CHECKING:
    from oom_lsp.notebooks.run import NotebookRun

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
    if args.what_if and args.world_size is not None and "," in args.world_size:
        err.write("oom-lsp estimate: --what-if traces one world size: give --world-size N, not a list\n")
        return EXIT_ERROR
    from oom_lsp.estimate.gpus import CATALOGUE, UnknownGpuError, custom_gpu, find_gpu, format_bytes

    if args.list_gpus:
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

    try:
        config = ConfigResolver().resolve(args.script)
        if args.gpu:
            gpu = find_gpu(args.gpu, config.gpus)
        elif args.gpu_memory:
            gpu = custom_gpu(args.gpu_memory)
        else:
            gpu = custom_gpu(config.gpu_memory) if config.gpu_memory else None
    except (ConfigError, UnknownGpuError, ValueError) as error:
        err.write(f"oom-lsp estimate: {error}\n")
        return EXIT_ERROR

    from oom_lsp.notebooks import is_notebook_path

    if not is_notebook_path(str(args.script)):
        return _estimate(args, gpu, args.script, None, out, err)
    if args.what_if:
        err.write(f"oom-lsp estimate: {args.script}: --what-if takes a .py script, not a notebook\n")
        return EXIT_ERROR
    from oom_lsp.notebooks.document import NotebookError
    from oom_lsp.notebooks.run import notebook_as_script

    try:
        with notebook_as_script(args.script) as run:
            warning = run.built.warning()
            if warning:
                err.write(f"oom-lsp estimate: warning: {args.script}: {warning}\n")
            return _estimate(args, gpu, run.script, run, out, err)
    except NotebookError as error:
        err.write(f"oom-lsp estimate: {args.script}: {error}\n")
        return EXIT_ERROR


def _estimate(
    args: argparse.Namespace, gpu: Any, script: Path, notebook: NotebookRun | None, out: TextIO, err: TextIO
) -> int:
    """`notebook`: when `script` runs a notebook's cells; what is printed names the
    script's lines as the notebook's cells."""
    from oom_lsp.estimate import distributed
    from oom_lsp.estimate.estimator import (
        DEFAULT_MARGIN,
        EstimateError,
        EstimateOptions,
        estimate,
        find_max_batch,
    )

    world_sizes = None
    if args.world_size is not None:
        try:
            world_sizes = distributed.parse_world_sizes(args.world_size)
        except distributed.WorldSizeError as error:
            err.write(f"oom-lsp estimate: {error}\n")
            return EXIT_ERROR
        deepspeed = distributed.deepspeed_call(script)
        if deepspeed:
            err.write(
                f"oom-lsp estimate: no estimate: {args.script.name}:{deepspeed[0]} calls {deepspeed[1]}: DeepSpeed "
                "(ZeRO) partitions through its own communication layer and CUDA kernels, out of reach of the fake "
                "process group; the distributed estimate covers DDP and FSDP2\n"
            )
            return EXIT_ERROR
    if args.nproc_per_node is not None and (world_sizes is None or args.nproc_per_node < 1):
        err.write("oom-lsp estimate: --nproc-per-node needs --world-size, and at least 1 GPU per node\n")
        return EXIT_ERROR
    launcher_environment = None
    if args.accelerate_config is not None:
        if world_sizes is None:
            err.write("oom-lsp estimate: --accelerate-config needs --world-size\n")
            return EXIT_ERROR
        if not args.accelerate_config.is_file():
            err.write(f"oom-lsp estimate: --accelerate-config {args.accelerate_config}: no such file\n")
            return EXIT_ERROR
        try:
            launcher_environment = distributed.accelerate_environment(
                args.python, args.accelerate_config, world_sizes[-1], args.nproc_per_node
            )
        except distributed.WorldSizeError as error:
            err.write(f"oom-lsp estimate: {error}\n")
            return EXIT_ERROR

    options = EstimateOptions(
        script=script,
        script_args=list(args.script_args),
        device=args.device,
        gpu=gpu,
        batch_size=args.batch_size,
        python=args.python,
        timeout=args.timeout,
        autocast_dtype=args.dtype,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        cwd=notebook.cwd if notebook is not None else None,
        world_size=world_sizes[0] if world_sizes and len(world_sizes) == 1 else None,
        nproc_per_node=args.nproc_per_node,
        launcher_environment=launcher_environment,
        cuda_version=args.cuda_version,
    )
    err.write(running_line("estimate", args.script, options.script_args, options.python) + "\n")
    if world_sizes and len(world_sizes) > 1:
        return _run_sweep(args, options, world_sizes, out, err)
    if args.what_if:
        from oom_lsp.estimate.whatif_report import run_what_if

        display = EstimateDisplay(err, f"what if: {args.script.name}", quiet=args.format != "text")
        options.on_event = display.on_event
        return run_what_if(args, options, display, out, err)

    display = EstimateDisplay(err, f"estimating {args.script.name}", quiet=args.format != "text")
    options.on_event = display.on_event
    named = notebook.places.text if notebook is not None else str

    def progress(text: str) -> None:
        display.message(named(text))

    try:
        with display:
            if args.find_max_batch:
                outcome = find_max_batch(options, progress)
                prediction, max_batch = outcome["estimate"], outcome["max_batch"]
            else:
                prediction, max_batch = estimate(options, progress), None
    except EstimateError as error:
        return failed(args, named(str(error)), out, err)
    prediction["max_batch"] = max_batch
    if notebook is not None:
        prediction = notebook.report(prediction)
    elif not args.find_max_batch:
        prediction["what_if_check"] = what_if_check(script, options, prediction)
    if args.format == "json":
        out.write(json.dumps(prediction, indent=2) + "\n")
    else:
        write_text(prediction, out)
        if prediction.get("what_if_check"):
            from oom_lsp.estimate.whatif_report import comparison_words

            out.write(f"  {comparison_words(prediction['what_if_check'])}\n")
    if prediction.get("verdict") == "will run out of memory":
        return EXIT_OOM
    if max_batch is not None and max_batch.get("max_batch") == 0:
        return EXIT_OOM
    return EXIT_FITS


def what_if_check(script: Path, options: Any, prediction: dict[str, Any]) -> dict[str, Any] | None:
    """How this estimate compares with a what-if's prediction for exactly this script text (decoded
    as the what-if decoded it: its line endings and without a byte-order mark)."""
    from oom_lsp.checker import decode_source
    from oom_lsp.config import ConfigError, ConfigResolver
    from oom_lsp.estimate.estimator import needed_bytes
    from oom_lsp.estimate.whatif import source_digest
    from oom_lsp.estimate.whatif_report import compare_with_record, load_record

    try:
        record = load_record(ConfigResolver().resolve(script).root, str(script))
        text = decode_source(script.read_bytes()).text
    except (ConfigError, OSError):
        return None
    if record is None or text is None:
        return None
    return compare_with_record(
        record,
        source_digest(text),
        options.batch_size,
        options.autocast_dtype,
        options.world_size,
        needed_bytes(prediction),
    )


def failed(args: argparse.Namespace, problem: str, out: TextIO, err: TextIO) -> int:
    """An estimate that could not be made: its reason as JSON (--format json) or one line on stderr."""
    if args.format == "json":
        out.write(json.dumps({"error": problem}) + "\n")
    else:
        err.write(f"oom-lsp estimate: {problem}\n")
    return EXIT_ERROR


def _run_sweep(
    args: argparse.Namespace, options: Any, world_sizes: list[int], out: TextIO, err: TextIO
) -> int:
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.estimate.sweep import sweep

    display = EstimateDisplay(err, f"estimating {args.script.name}", quiet=args.format != "text")
    options.on_event = display.on_event
    try:
        with display:
            outcome = sweep(options, world_sizes, args.find_max_batch, display.message)
    except EstimateError as error:
        return failed(args, str(error), out, err)
    for row in outcome["runs"]:
        row["estimate"]["max_batch"] = row["max_batch"]
    if args.format == "json":
        out.write(json.dumps(outcome, indent=2) + "\n")
    else:
        write_sweep(outcome, out)
    verdicts = [row["estimate"].get("verdict") for row in outcome["runs"]]
    if verdicts and all(verdict == "will run out of memory" for verdict in verdicts):
        return EXIT_OOM
    return EXIT_FITS


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


def _place(file: str, line: object, cell: int | None = None) -> str:
    """`train.py:12`, or for a notebook's cells `nb.ipynb, cell 4, line 3`."""
    return f"{_rel(file)}, cell {cell}, line {line}" if cell is not None else f"{_rel(file)}:{line}"


def _shapes_words(shapes: dict[str, list[int]]) -> str:
    return ", ".join(
        f"{path + ' ' if path else ''}{'x'.join(str(size) for size in shape) or 'scalar'}"
        for path, shape in shapes.items()
    )


def _batch_words(batch: dict[str, Any], traced: int | None) -> str:
    """Which batch the peak happened with, e.g. "step 2, micro-batch 3 (input_ids 2x138), batch 11
    of the DataLoader at train.py:40 (24 batches traced, each as the loader gave it)"."""
    loader = batch["loader"]
    when = f"step {batch['step']}, micro-batch {batch['micro_batch']}" if batch.get("step") else "a batch"
    counted = f"; {traced} batches traced, each as the loader gave it" if traced else ""
    return (
        f"{when} ({_shapes_words(batch['shapes'])}), batch {batch['index']} of the DataLoader at "
        f"{_place(loader['file'], loader['line'])}{counted}"
    )


def _worst_case_words(worst: dict[str, Any]) -> str:
    """The longest batch the data can produce, and the peak with it for every batch."""
    from oom_lsp.estimate.gpus import format_bytes

    longest = []
    for batch in worst.get("batches", []):
        scanned = (
            f"the {batch['batch_size']} largest of {batch['samples']:,} samples"
            if batch["scanned"] >= batch["samples"]
            else f"the {batch['batch_size']} largest of the first {batch['scanned']:,} of {batch['samples']:,} "
            "samples (the rest not read, for time)"
        )
        longest.append(
            f"{_shapes_words(batch['shapes'])} ({scanned}, DataLoader at "
            f"{_place(batch['loader']['file'], batch['loader']['line'])})"
        )
    verdict = f", {worst['verdict'].upper()}" if worst.get("verdict") else ""
    held = (
        f", {format_bytes(worst['process_bytes'])} process total"
        if worst.get("process_bytes") is not None
        else ""
    )
    return (
        f"{format_bytes(worst['peak_bytes'])} allocated{held}{verdict} with the longest batch the data can "
        f"produce at every step: {'; '.join(longest)}"
    )


def write_text(prediction: dict[str, Any], out: TextIO) -> None:
    from oom_lsp.estimate.gpus import format_bytes

    def row(label: str, value: str, note: str = "") -> None:
        out.write(f"  {label:<18} {value:>11}{'   ' + note if note else ''}\n")

    batch = prediction.get("batch_size")
    launch = prediction.get("distributed")
    out.write(
        f"{_rel(prediction['script'])}: batch size {batch if batch else 'as in the script'}"
        + (" per rank" if launch else "")
        + f", device {prediction['device']}, torch {prediction.get('torch')}"
        + (f", rank 0 of {launch['world_size']} ({launch['nproc_per_node']} per node)" if launch else "")
        + "\n"
    )
    out.write(f"  method: {prediction['method']}\n")
    if prediction.get("fallback"):
        out.write(
            f"  why: {prediction['fallback']['reason']}\n  uncertainty: {prediction['fallback']['uncertainty']}\n"
        )
    cuda = prediction["device"] == "cuda"
    row(
        "peak allocated",
        format_bytes(prediction["peak_bytes"]),
        "what torch.cuda.max_memory_allocated() would show"
        if cuda
        else "live tensor storage, as a CPU step holds it",
    )
    if prediction.get("breakdown_batch_size"):
        out.write(f"    breakdown measured at batch {prediction['breakdown_batch_size']}:\n")
    from oom_lsp.estimate.distributed import LABELS, ORDER

    breakdown = prediction["breakdown"]
    for category in sorted(breakdown, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER)):
        size = breakdown[category]
        if size > 0:
            row("  " + LABELS.get(category, category.replace("_", " ")), format_bytes(size))
    if prediction.get("reserved_bytes") is not None:
        row("reserved", format_bytes(prediction["reserved_bytes"]), "caching allocator segments (modelled)")
        nccl = any(note["name"] == "nccl-buffers" for note in prediction["corrections"])
        row(
            "+ context, NCCL" if nccl else "+ CUDA context",
            format_bytes(prediction["context_bytes"]),
            f"= {format_bytes(prediction['process_bytes'])} process total (nvidia-smi)",
        )
    where = prediction["peak_at"]
    if where.get("op"):
        phase = where.get("phase")
        when = (
            " outside the forward pass, backward pass and optimizer step"
            if phase == "outside the step"
            else f" during the {_PHASE_WORDS.get(phase, phase)}"
            if phase
            else ""
        )
        module = f", in module {where['module']}" if where.get("module") else ""
        location = f", {_place(where['file'], where['line'], where.get('cell'))}" if where.get("file") else ""
        out.write(f"  peak at: {where['op']}{when}{module}{location}\n")
    if prediction.get("peak_batch"):
        out.write(
            f"  peak batch: {_batch_words(prediction['peak_batch'], prediction.get('batches_traced'))}\n"
        )
    modules = [(name, size) for name, size in prediction.get("top_modules", []) if name]
    if modules:
        out.write("  top modules at the peak (memory they allocated that is still live):\n")
        for name, size in modules[:5]:
            out.write(f"    {format_bytes(size):>11}  {name}\n")
    lines = prediction.get("top_lines", [])
    if lines:
        out.write("  top lines at the peak:\n")
        for place, size in lines[:5]:
            file, _, line = place.rpartition(":")
            cell = _CELL_PLACE_RE.match(file)  # a notebook's "nb.ipynb:cell 4:3"
            shown = _place(cell[1], line, int(cell[2])) if cell else _place(file, line)
            out.write(f"    {format_bytes(size):>11}  {shown}\n")
    gpu = prediction.get("gpu")
    if gpu:
        named = not gpu["name"].startswith("GPU with ")  # --gpu-memory: the name is the size already
        out.write(f"  target: {gpu['name']}" + (f", {format_bytes(gpu['memory'])}" if named else "") + "\n")
        per_gpu = " on each GPU" if launch else ""
        if prediction.get("verdict_basis"):
            out.write(f"  verdict{per_gpu}: {verdict_words(prediction)}\n")
    else:
        out.write(
            "  target: none (pass --gpu NAME or --gpu-memory SIZE, or set gpu-memory in [tool.oom-lsp])\n"
        )
    if prediction.get("worst_case"):
        out.write(f"  worst case: {_worst_case_words(prediction['worst_case'])}\n")
    if prediction.get("warning"):
        out.write(f"  warning: {prediction['warning']}\n")
    if prediction["corrections"]:
        out.write("  applied:\n")
        for note in prediction["corrections"]:
            size = f" [{format_bytes(note['bytes'])}]" if note.get("bytes") else ""
            out.write(f"    - {note['detail']}{size}\n")
    max_batch = prediction.get("max_batch")
    if max_batch is not None:
        fit = max_batch["fit"]
        out.write(
            f"  fit: peak = {format_bytes(fit['intercept_bytes'])} + {format_bytes(fit['bytes_per_sample'])} "
            f"x batch (traced at {fit['batch_sizes'][0]} and {fit['batch_sizes'][1]})\n"
        )
        if max_batch.get("max_batch"):
            verified = max_batch["verified"]
            held = (
                f"{format_bytes(verified['reserved_bytes'])} reserved + "
                f"{format_bytes(verified['context_bytes'])} context, "
                f"{format_bytes(verified['peak_bytes'])} allocated"
                if verified.get("reserved_bytes") is not None
                else f"{format_bytes(verified['peak_bytes'])} allocated"
            )
            out.write(
                f"  largest batch that fits: {max_batch['max_batch']:,} (checked by a fake run: {held})\n"
            )
            out.write(f"    keeps {max_batch['limit']}\n")
            if max_batch.get("next_checked"):
                bound = _BOUNDS[max_batch["bound"]].format(batch=max_batch["next_checked"])
                out.write(f"    bound by {bound}\n")
            elif max_batch.get("bound") == "search limit":
                out.write(
                    f"    bound by the search, which stops at {max_batch['search_limit']:,}: the memory line "
                    f"alone gives {max_batch['line_max_batch']:,} (estimate a larger one with --batch-size N)\n"
                )
            else:
                out.write("    bound by memory: the line's answer, checked by a fake run\n")
            if max_batch.get("explanation"):
                out.write(f"    why not the line's answer: {max_batch['explanation']}\n")
        else:
            out.write(f"  largest batch that fits: none ({max_batch.get('reason')})\n")
        accumulation = max_batch.get("gradient_accumulation")
        if accumulation:
            out.write(
                f"  the script's batch {max_batch['script_batch_size']} does not fit: use batch "
                f"{accumulation['micro_batch']} with {accumulation['steps']} gradient accumulation steps "
                f"(effective batch {accumulation['effective_batch']})\n"
            )


def write_sweep(outcome: dict[str, Any], out: TextIO) -> None:
    """The per-rank peak at each world size, the fewest GPUs that fit, then the details of that size."""
    from oom_lsp.estimate.gpus import format_bytes

    runs = outcome["runs"]
    first = runs[0]["estimate"]
    batch = first.get("batch_size")
    sizes = ", ".join(str(row["world_size"]) for row in runs)
    out.write(
        f"{_rel(first['script'])}: batch size {batch if batch else 'as in the script'} per rank, "
        f"device {first['device']}, torch {first.get('torch')}, world sizes {sizes}\n"
    )
    out.write(f"  method: {first['method'].split(' as rank 0 of ')[0]} as rank 0 of each world size\n")
    gpu = first.get("gpu")
    cuda = first["device"] == "cuda"
    searched = any(row["max_batch"] is not None for row in runs)
    header = f"  {'GPUs':>5}  {'peak per rank':>14}"
    if cuda:
        header += f"  {'reserved + context, NCCL':>25}"
    if gpu:
        header += f"  {'verdict':<22}"
    if searched:
        header += "  largest batch per rank"
    out.write(header.rstrip() + "\n")
    for row in runs:
        estimate = row["estimate"]
        line = f"  {row['world_size']:>5}  {format_bytes(estimate['peak_bytes']):>14}"
        if cuda:
            line += f"  {format_bytes(estimate.get('process_bytes') or 0):>25}"
        if gpu:
            line += f"  {estimate.get('verdict') or '-':<22}"
        if searched:
            found = (row["max_batch"] or {}).get("max_batch")
            line += f"  {found:,}" if found else "  none"
        out.write(line.rstrip() + "\n")
    if gpu:
        named = not gpu["name"].startswith("GPU with ")
        each = f"{gpu['name']}" + (f", {format_bytes(gpu['memory'])}" if named else "")
        fewest = outcome["fewest_gpus"]
        if fewest is not None:
            out.write(f"  fewest GPUs that fit: {fewest} x {each}\n")
        else:
            out.write(f"  fewest GPUs that fit: none of {sizes} x {each} fits with the margin\n")
        shown = next((row for row in runs if row["world_size"] == fewest), runs[-1])
    else:
        out.write("  target: none (pass --gpu NAME or --gpu-memory SIZE for the fewest GPUs that fit)\n")
        shown = runs[-1]
    out.write(f"\ndetails at {shown['world_size']} GPU{'s' if shown['world_size'] > 1 else ''}:\n")
    write_text(shown["estimate"], out)
