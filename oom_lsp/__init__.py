"""oom-lsp: find GPU out-of-memory risks in PyTorch training code."""

__version__ = "0.1.0"
