"""Where the script is when a storage is made: the phase of the training step
(forward, backward, optimizer), the innermost module, the user's line."""

from __future__ import annotations

import os
import sys

import torch

from .common import is_harness_file
from .modules import ModuleScope


class Context:
    """Where the script is: phase (forward/backward/optimizer), module, line."""

    def __init__(self, user_dir: str):
        self.user_dir = user_dir + os.sep
        self.forward_depth = 0
        self.in_backward = 0
        self.in_optimizer = 0
        self.modules = ModuleScope()

    @property
    def in_step(self) -> bool:
        return self.forward_depth > 0 or self.in_backward > 0 or self.in_optimizer > 0

    def module(self) -> str:
        return self.modules.current()

    def user_line(self) -> tuple[str, int] | None:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(self.user_dir) and not is_harness_file(filename):
                return filename, frame.f_lineno
            frame = frame.f_back
        return None

    def default_category(self) -> str:
        if self.in_optimizer:
            return "temporaries"
        if self.in_backward:
            return "temporaries"
        if self.forward_depth > 0:
            return "activations" if torch.is_grad_enabled() else "temporaries"
        return "other"

    def phase(self) -> str:
        if self.in_optimizer:
            return "optimizer step"
        if self.in_backward:
            return "backward"
        if self.forward_depth:
            return "forward"
        return "outside the step"
