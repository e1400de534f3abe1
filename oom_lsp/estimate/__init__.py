"""Peak-memory prediction of a training step without a GPU (`oom-lsp estimate`).

harness/ runs in the user's interpreter (torch), started by path and importing nothing of
oom_lsp; everything else here is torch-free: results (the typed trace, prediction, search,
sweep and what-if, with their JSON), estimator (runs the harness, the fallback to real CPU
steps), prediction (the prediction in named parts: the trace's notes, CUDA's terms, the
distributed terms; the verdict), search (the largest batch that fits), whatif and whatif_record (the changes, their rows, the record the
next estimate compares with), distributed and sweep (`--world-size`), gpus (the catalogue),
allocator (the caching-allocator model), wording (the words both faces print).

The use cases (oom_lsp.usecases) run these for the CLI and the editor; nothing here imports a
use case or a face.
"""
