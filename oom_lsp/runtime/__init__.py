"""In the training script itself: `oom_guard` records the evidence of an out-of-memory error
(report.json + the AI-fix prompt under `.oom_lsp/last_oom/`), `memory_monitor` logs the peak
memory per epoch and warns when it keeps growing. See docs/runtime.md.

Importing this package imports neither torch nor libcst.
"""

from oom_lsp.runtime.guard import OomGuard, oom_guard
from oom_lsp.runtime.monitor import MemoryMonitor, memory_monitor

__all__ = ["MemoryMonitor", "OomGuard", "memory_monitor", "oom_guard"]
