"""Peak-memory prediction of a training step without a GPU (`oom-lsp estimate`).

harness/ runs in the user's interpreter (torch), started by path; everything else here is
torch-free: gpus (catalogue), allocator (caching-allocator model), estimator
(runs the harness, applies CUDA terms, verdict, largest batch), commands (CLI).
"""
