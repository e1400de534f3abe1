"""The seven-section chain-of-thought prompt: context, error, profiling, diagnosis,
solutions, validation, documentation, each filled from what oom-lsp knows.

Pure: text and facts in, messages out. A section with nothing to say is left out.
The prompt stays under a token budget for local models with small context windows
(Ollama's default is 4k and it drops the overflow silently): profile tables shrink
first, then traceback frames, then the code shrinks to a window around the target
line. Tokens are estimated as ceil(characters / 4), the usual rule of thumb for
English and code with BPE tokenizers.

Secrets in the user message are replaced by placeholders (oom_lsp.llm.secrets); the
mapping travels with the prompt so edits can be restored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from oom_lsp import python_ast
from oom_lsp.analysis.engine import analyze
from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.registry import rule_for
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.edits import split_lines
from oom_lsp.estimate.results import Prediction
from oom_lsp.llm.context import CodeFacts, EnvironmentFacts, code_region, detect_code_facts
from oom_lsp.llm.edits import MAX_BLOCKS, Region
from oom_lsp.llm.secrets import redact
from oom_lsp.profiling.oom_messages import OomError, describe
from oom_lsp.profiling.report import Report
from oom_lsp.units import format_bytes

TOKEN_BUDGET = 3000
CHARS_PER_TOKEN = 4
MAX_MESSAGE_CHARS = 700
MAX_FINDINGS = 8
MIN_CODE_WINDOW = 12


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class PromptError(ValueError):
    """The request cannot become a prompt (the file does not parse, no line to fix)."""


@dataclass(frozen=True)
class FixRequest:
    """What a fix is asked for. `text` is the document as the editor (or the disk) has it."""

    path: str  # for display and for matching traceback frames
    text: str
    line: int | None = None  # 1-based; default: the finding's, the error's or the profile's top line
    finding: Finding | None = None
    oom: OomError | None = None  # from a log; a profile report's OOM is used when this is None
    report: Report | None = None  # a profile report (measured)
    estimate: Prediction | None = None  # an `oom-lsp estimate --format json` prediction
    environment: EnvironmentFacts | None = None
    gpu_memory: int | None = None  # [tool.oom-lsp] gpu-memory
    lint_settings: LintSettings | None = None  # for the static findings shown with the code
    version: int | None = None  # the editor's document version, echoed in the proposal
    # Figures measured in the process that failed (the in-script OOM guard), one line each.
    runtime_facts: tuple[str, ...] = ()

    @property
    def error(self) -> OomError | None:
        if self.oom is not None:
            return self.oom
        return self.report.oom.error if self.report is not None and self.report.oom else None

    def target_line(self) -> int:
        if self.line is not None:
            return self.line
        if self.finding is not None:
            return self.finding.line
        error = self.error
        frames = [frame for frame in (error.frames if error else ()) if _same_file(frame.file, self.path)]
        if frames:
            # The allocation fails deep inside the model; the fix is usually in the step that
            # called it (batch size, autocast, what is kept), so skip `forward` frames.
            outside_forward = [frame for frame in frames if frame.function != "forward"]
            return (outside_forward or frames)[-1].line
        for usage in self.report.top_lines if self.report else ():
            if _same_file(usage.file, self.path):
                return usage.line
        raise PromptError(
            "no line to fix: give one (--line N), or an error log or profile that points into this file"
        )

    @property
    def subject(self) -> str:
        """What is being fixed, for the fix log: a rule or an error."""
        if self.finding is not None:
            return f"{self.finding.code} {self.finding.name}"
        error = self.error
        if error is not None:
            return f"{error.backend.upper()} out of memory"
        return f"line {self.target_line()}"


def _same_file(frame_file: str, path: str) -> bool:
    # Logs and reports often come from another machine: the file name is what can be compared.
    return Path(frame_file).name == Path(path).name


@dataclass(frozen=True)
class Prompt:
    system: str
    user: str
    region: Region  # the code a SEARCH may match ...
    region_name: str
    target_line: int
    subject: str
    response_format: str
    import_lines: tuple[int, ...] = ()  # ... and the import lines shown above it
    secrets: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.system) + estimate_tokens(self.user)

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    def markdown(self, include_system: bool = False) -> str:
        if not include_system:
            return self.user
        return f"<!-- system message -->\n{self.system}\n\n<!-- user message -->\n{self.user}"


# --- System message ------------------------------------------------------------------------

_ROLE = (
    "You are a PyTorch GPU-memory expert. A training script uses too much GPU memory. "
    "From the facts and the code you are given, find the most likely causes and propose "
    "concrete code changes that lower the peak memory of a training step without changing "
    "what the model learns (apart from a smaller per-step batch kept equivalent with "
    "gradient accumulation, or mixed precision)."
)
_RULES = (
    "Rules:\n"
    "- Tie every cause to a line of the code shown or to a number in the facts.\n"
    "- Edit only the code shown under Solutions; SEARCH must copy whole lines of it exactly, "
    "with their indentation, and match only once: add context lines if needed.\n"
    f"- At most {MAX_BLOCKS} SEARCH/REPLACE blocks; small changes; keep the code runnable.\n"
    "- If the code shown cannot be fixed, give the diagnosis and no edit.\n"
    "- Do not invent line numbers in SEARCH, and do not use `...` to skip lines."
)
_TEXT_FORMAT = """Answer in exactly this format, with these four headings:

## Diagnosis
1. <cause> (high|medium|low): <evidence: a line or a number from the facts>
2. ...
## Edits
<<<<<<< SEARCH
<lines copied exactly from the code>
=======
<the new lines>
>>>>>>> REPLACE
## Validation
<what the measured peak should do after the change, and why>
## Changelog
<one line in the imperative mood>"""
_JSON_FORMAT = (
    "Answer with one JSON object with these fields, in this order:\n"
    '- "causes": 1 to 3 objects {"title", "evidence" (a line or a number from the facts), '
    '"likelihood": "high" | "medium" | "low"}, most likely first;\n'
    '- "edits": 0 to 5 objects {"search" (whole lines copied exactly from the code), '
    '"replace" (the new lines), "why"};\n'
    '- "validation": {"step": what to measure, "expected": what the peak should do};\n'
    '- "changelog": one line in the imperative mood.'
)


def system_message(response_format: str) -> str:
    contract = _JSON_FORMAT if response_format == "json_schema" else _TEXT_FORMAT
    return f"{_ROLE}\n\n{_RULES}\n\n{contract}"


# --- User message: the seven sections ------------------------------------------------------


@dataclass(frozen=True)
class _Limits:
    table_rows: int = 8
    frames: int = 6
    findings: int = MAX_FINDINGS
    code_window: int | None = None  # lines each side of the target line; None: the whole region


def _shrinking_limits() -> list[_Limits]:
    """From the fullest prompt to the smallest: tables first, then frames, then code."""
    steps = [_Limits(), _Limits(table_rows=5), _Limits(table_rows=3), _Limits(table_rows=3, frames=3)]
    steps.append(_Limits(table_rows=2, frames=2, findings=4))
    base = steps[-1]
    steps.extend(replace(base, code_window=window) for window in (60, 40, 25, MIN_CODE_WINDOW))
    return steps


def build_prompt(request: FixRequest, response_format: str = "text", budget: int = TOKEN_BUDGET) -> Prompt:
    """The prompt for `request`, within `budget` tokens if it can be made to fit."""
    try:
        module = python_ast.parse_module(request.text)
    except cst.ParserSyntaxError as error:
        raise PromptError(
            f"{request.path} does not parse (line {error.raw_line}): fix the syntax first"
        ) from None
    line = request.target_line()
    total_lines = len(split_lines(request.text)) or 1
    if not 1 <= line <= total_lines:
        raise PromptError(f"line {line} is outside {request.path} ({total_lines} lines)")
    located = code_region(module, line)
    facts = detect_code_facts(module)
    findings = _findings(request)
    system = system_message(response_format)
    prompt: Prompt | None = None
    for limits in _shrinking_limits():
        region = located.region
        if limits.code_window is not None:
            region = Region(
                max(region.start_line, line - limits.code_window),
                min(region.end_line, line + limits.code_window),
            )
        user = _user_message(
            request, facts, findings, region, located.name, located.import_lines, line, limits
        )
        redaction = redact(user)
        prompt = Prompt(
            system=system,
            user=redaction.text,
            region=region,
            region_name=located.name if region == located.region else f"part of the {located.name}",
            target_line=line,
            subject=request.subject,
            response_format=response_format,
            import_lines=tuple(number for number in located.import_lines if number < region.start_line),
            secrets=redaction.secrets,
        )
        if prompt.tokens <= budget:
            break
    assert prompt is not None
    return prompt


def _findings(request: FixRequest) -> list[Finding]:
    if request.lint_settings is None:
        return [request.finding] if request.finding is not None else []
    found = [f for f in analyze(request.text, request.lint_settings, request.path) if f.code != "OOM000"]
    if request.finding is not None and request.finding not in found:
        found.insert(0, request.finding)
    return found


def _user_message(
    request: FixRequest,
    facts: CodeFacts,
    findings: list[Finding],
    region: Region,
    region_name: str,
    import_lines: tuple[int, ...],
    line: int,
    limits: _Limits,
) -> str:
    sections = [
        ("Context", _context(request, facts, region_name, line)),
        ("Error", _error(request, limits)),
        ("Profiling", _profiling(request, limits)),
        ("Diagnosis", _diagnosis(request)),
        ("Solutions", _solutions(request, findings, region, import_lines, line, limits)),
        ("Validation", _validation(request)),
        ("Documentation", _DOCUMENTATION),
    ]
    return "\n\n".join(f"## {title}\n{body}" for title, body in sections if body) + "\n"


def _fact_list(found: list[Any]) -> str:
    return "; ".join(f"{fact.value} (line {fact.line})" for fact in found)


def _context(request: FixRequest, facts: CodeFacts, region_name: str, line: int) -> str:
    rows = [f"- File: `{Path(request.path).name}`, line {line} ({region_name})"]
    env = request.environment
    report = request.report
    torch_version = (
        (env.torch if env else None)
        or (report.torch_version if report else None)
        or (request.estimate.torch if request.estimate else None)
    )
    if torch_version:
        cuda = (env.cuda if env else None) or (report.cuda_version if report else None)
        hip = env.hip if env else None
        accelerator = f", CUDA {cuda}" if cuda else (f", ROCm/HIP {hip}" if hip else "")
        python = (env.python if env else None) or (report.python_version if report else None)
        rows.append(
            f"- Framework: PyTorch {torch_version}{accelerator}" + (f"; Python {python}" if python else "")
        )
    elif env and env.python:
        rows.append(f"- Python {env.python}; PyTorch not importable there ({env.problem or 'not installed'})")
    gpu = _gpu(request)
    if gpu:
        rows.append(f"- GPU: {gpu}")
    rows.append(f"- Mixed precision (AMP) in the code: {_fact_list(facts.amp) or 'none found'}")
    rows.append(f"- torch.compile: {_fact_list(facts.compile) or 'not used'}")
    rows.append(f"- Data/model parallelism: {_fact_list(facts.distributed) or 'none found'}")
    if facts.batch_size:
        rows.append(f"- Batch size in the code: {_fact_list(facts.batch_size)}")
    if facts.sequence_length:
        rows.append(f"- Sequence length in the code: {_fact_list(facts.sequence_length)}")
    if facts.dtype:
        rows.append(f"- dtypes in the code: {_fact_list(facts.dtype)}")
    return "\n".join(rows)


def _gpu(request: FixRequest) -> str | None:
    report, env, error = request.report, request.environment, request.error
    if report is not None and report.device.type == "cuda" and report.device.total_memory:
        name = report.device.name or "CUDA device"
        return f"{name}, {format_bytes(report.device.total_memory)} (from the profile)"
    if env is not None and env.gpu_name and env.gpu_memory:
        return f"{env.gpu_name}, {format_bytes(env.gpu_memory)} (from the interpreter)"
    if error is not None and error.total_capacity:
        return f"{error.device or 'GPU'}, {format_bytes(error.total_capacity)} total (from the error message)"
    if request.estimate and request.estimate.gpu:
        gpu = request.estimate.gpu
        return f"{gpu.name}, {format_bytes(gpu.memory)} (the estimate's target)"
    if request.gpu_memory:
        return f"{format_bytes(request.gpu_memory)} (gpu-memory setting)"
    return None


def _error(request: FixRequest, limits: _Limits) -> str:
    error = request.error
    if error is None:
        if request.report is not None and request.report.error:
            return f"The profiled run failed: `{request.report.error[:MAX_MESSAGE_CHARS]}`"
        return ""
    message = (
        error.message if len(error.message) <= MAX_MESSAGE_CHARS else error.message[:MAX_MESSAGE_CHARS] + " …"
    )
    kind = error.exception_type or "Error"
    rows = ["```text", f"{kind}: {message}", "```"]
    facts = [
        f"{label}: {value}" for label, value in describe(error)[1:] if label not in ("hint", "failed at")
    ]
    if facts:
        rows.append("Facts: " + "; ".join(facts) + ".")
    frames = error.frames[-limits.frames :] if limits.frames else ()
    if frames:
        rows.append("User-code frames, outermost first (the last one failed):")
        for frame in frames:
            code = f": `{frame.code}`" if frame.code else ""
            rows.append(f"- {Path(frame.file).name}:{frame.line} in {frame.function}{code}")
    elif error.log_line is not None:
        rows.append("The traceback has no user-code frame.")
    return "\n".join(rows)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)
    return lines


def _profiling(request: FixRequest, limits: _Limits) -> str:
    parts = []
    if request.report is not None:
        parts.append(_measured(request.report, limits))
    elif request.estimate is not None:
        parts.append(_estimated(request.estimate, limits))
    if request.runtime_facts:
        parts.append(
            "Measured in the failing process by `oom_guard` when the error was raised:\n"
            + "\n".join(f"- {fact}" for fact in request.runtime_facts)
        )
    return "\n\n".join(parts)


def _measured(report: Report, limits: _Limits) -> str:
    device = report.device.name or report.device.type
    rows = [
        f"Measured by `oom-lsp profile` ({report.measured_with or 'profiler'}) on {device}: run status "
        f"`{report.status}`, {len(report.steps)} of {report.steps_requested or '?'} steps recorded."
    ]
    if report.peak_allocated is not None:
        reserved = (
            f", reserved {format_bytes(report.peak_reserved)}" if report.peak_reserved is not None else ""
        )
        rows.append(f"- Peak allocated: {format_bytes(report.peak_allocated)} (measured){reserved}")
    if report.oom is not None and report.oom.step is not None:
        rows.append(f"- Out of memory during step {report.oom.step}")
    if report.batch_size is not None:
        shape = f", first input shape {report.input_shape}" if report.input_shape else ""
        rows.append(f"- Batch size seen by the model: {report.batch_size} (measured{shape})")
    if report.steps and limits.table_rows:
        rows.append("")
        rows.extend(
            _table(
                ("step", "peak allocated", "complete"),
                [
                    (str(step.index), format_bytes(step.peak_allocated), "yes" if step.complete else "no")
                    for step in report.steps[: limits.table_rows]
                ],
            )
        )
    if report.top_lines and limits.table_rows:
        rows.append("\nTop lines by memory live at the peak (measured):")
        rows.extend(
            _table(
                ("memory", "line", "code"),
                [
                    (
                        format_bytes(usage.bytes),
                        f"{Path(usage.file).name}:{usage.line}",
                        f"`{usage.code}`" if usage.code else "",
                    )
                    for usage in report.top_lines[: limits.table_rows]
                ],
            )
        )
    if report.top_modules and limits.table_rows:
        rows.append("\nTop modules by memory live at the peak (measured):")
        rows.extend(
            _table(
                ("memory", "module", "type"),
                [
                    (format_bytes(module.bytes), module.name, module.type)
                    for module in report.top_modules[: limits.table_rows]
                ],
            )
        )
    return "\n".join(rows)


def _estimated(prediction: Prediction, limits: _Limits) -> str:
    target = prediction.gpu
    rows = [f"Estimated by `oom-lsp estimate` ({prediction.method or 'estimate'}), not measured."]
    rows.append(f"- Peak allocated: {format_bytes(prediction.peak_bytes)} (estimated)")
    if prediction.batch_size:
        rows.append(f"- Batch size: {prediction.batch_size} (estimated run)")
    if target:
        verdict = prediction.verdict.value if prediction.verdict else "?"
        rows.append(f"- Target {target.name} ({format_bytes(target.memory)}): {verdict}")
    breakdown = [(category, size) for category, size in prediction.breakdown.items() if size]
    if breakdown and limits.table_rows:
        rows.append(
            "- Breakdown at the peak: "
            + ", ".join(
                f"{category.value.replace('_', ' ')} {format_bytes(size)}" for category, size in breakdown
            )
        )
    lines = prediction.top_lines
    if lines and limits.table_rows:
        rows.append("\nTop lines at the peak (estimated):")
        rows.extend(
            _table(
                ("memory", "line"),
                [
                    (format_bytes(size), f"{Path(place.rpartition(':')[0]).name}:{place.rpartition(':')[2]}")
                    for place, size in lines[: limits.table_rows]
                ],
            )
        )
    modules = [(name, size) for name, size in prediction.top_modules if name]
    if modules and limits.table_rows:
        rows.append("\nTop modules at the peak (estimated):")
        rows.extend(
            _table(
                ("memory", "module"),
                [(format_bytes(size), name) for name, size in modules[: limits.table_rows]],
            )
        )
    return "\n".join(rows)


def _diagnosis(request: FixRequest) -> str:
    focus = ""
    if request.finding is not None:
        focus = f" Start from the finding {request.finding.code} below, but say so if something else matters more."
    return (
        "List the 3 most likely causes of this memory use, most likely first. Tie each one to a line "
        "of the code under Solutions or to a number above, and give its likelihood (high, medium or low)."
        + focus
    )


def _solutions(
    request: FixRequest,
    findings: list[Finding],
    region: Region,
    import_lines: tuple[int, ...],
    line: int,
    limits: _Limits,
) -> str:
    lines = split_lines(request.text)
    shown_imports = [number for number in import_lines if number < region.start_line]
    code: list[str] = [lines[number - 1] for number in shown_imports]
    if shown_imports and shown_imports[-1] + 1 < region.start_line:
        code.append(f"# ... (lines {shown_imports[-1] + 1}-{region.start_line - 1} not shown)")
    code.extend(lines[region.start_line - 1 : region.end_line])
    rows = [
        f"The code that may change: `{Path(request.path).name}` lines {region.start_line}-{region.end_line}"
        + (", after the file's imports" if shown_imports else "")
        + f". Line {line} is `{lines[line - 1].strip()}`.",
        "```python",
        *code,
        "```",
    ]
    inside = [f for f in findings if region.start_line <= f.line <= region.end_line][: limits.findings]
    if inside:
        rows.append("Static findings of oom-lsp on this code:")
        for finding in inside:
            rows.append(
                f"- line {finding.line} `{lines[finding.line - 1].strip()}`: {finding.code} {finding.name}: "
                + _finding_with_why(finding)
            )
    rows.append(
        "For each cause that this code can fix, give one concrete change (for example a smaller batch with "
        "gradient accumulation, mixed precision, in-place operations, torch.no_grad, .detach()/.item(), "
        "activation checkpointing) as a SEARCH/REPLACE edit on the code above."
    )
    return "\n".join(rows)


def _finding_with_why(finding: Finding) -> str:
    """The message says what is wrong in a few words (written for an editor's Problems panel);
    the model also needs why it costs memory."""
    why = getattr(rule_for(finding.code), "why", None)
    return f"{finding.message}. {why}" if why else finding.message


def _validation(request: FixRequest) -> str:
    how, before = "the estimate (`oom-lsp estimate`)", None
    if request.report is not None:
        how, before = "the profile (`oom-lsp profile`)", request.report.peak_allocated
    elif request.estimate is not None:
        before = request.estimate.peak_bytes
    figure = f" Before the change: {format_bytes(before)}." if before is not None else ""
    return (
        f"After the change oom-lsp re-runs {how} and compares the peak memory of one training step "
        f"(`torch.cuda.max_memory_allocated()` after `torch.cuda.reset_peak_memory_stats()`).{figure} "
        "Say what that peak should do after your change, and why."
    )


_DOCUMENTATION = (
    "End with a one-line changelog entry in the imperative mood, under 200 characters, "
    "of the form `<Verb> <what changed> so <what it does to memory>`."
)
