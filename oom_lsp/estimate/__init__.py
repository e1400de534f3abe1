"""Peak-memory prediction of a training step without a GPU (`oom-lsp estimate`).

harness.py runs in the user's interpreter (torch); everything else here is
torch-free: gpus (catalogue), allocator (caching-allocator model), estimator
(runs the harness, applies CUDA terms, verdict, largest batch), commands (CLI).
"""
