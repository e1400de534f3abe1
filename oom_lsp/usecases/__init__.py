"""The use-case layer: what a user asks of oom-lsp, once, for every face.

    estimate   a training step's peak memory without a GPU (one world size, a sweep, a notebook)
    what_if    the step traced once per change a user could make, with each change's saving
    budget     the memory budget gate of `oom-lsp check` (each listed script estimated)
    profile    a real run for a few optimizer steps, its peak and lines (the user's interpreter)
    explain    OOM errors found in a log or traceback, with what to do about them
    ai_fix     the whole AI fix: the prompt from what is known, the model's answer checked, the
               edit, and its entry in the fix log once applied
    validate   a fix measured again and compared with the measurement before it

Each takes a request the face resolved (its arguments over its settings) and returns a typed
result (oom_lsp.estimate.results, oom_lsp.profiling.report, ...). The CLI (oom_lsp.cli) renders
it as text or JSON; the language server (oom_lsp.server) as LSP types. Neither face writes a
use case's sequence again, so the two cannot disagree: tests/usecases/test_faces_agree.py runs
each use case through both faces on the same file and compares the figures.

Below this layer: the analysis core (analysis/, fixes/), the estimator (estimate/), the
profiler (profiling/), the LLM client (llm/). No torch import here; user code runs in
subprocesses under the user's interpreter. No face is imported here.
"""
