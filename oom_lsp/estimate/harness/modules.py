"""Which module the script is in when a storage is made, for attribution
("top modules at the peak"), found without holding anything alive.

torch.utils.module_tracker.ModuleTracker, which the harness used before, hooks
every module's inputs and outputs with `register_multi_grad_hook`, whose hooks
hold the graph nodes they watch: the graph of a forward that is never
backpropagated (a sanity check, a logging probe, an auxiliary output that is
dropped) then stays alive, with every tensor it saved, and the trace (and a
real run under that tracker) holds memory a plain run frees.

Here the forward is followed by the global module hooks (a stack of names),
and the backward by the autograd engine itself: each graph node carries the
sequence number it was created with, the module hooks record at which
sequence number the innermost module changed, and during backward the node
being run (`torch._C._current_autograd_node()`) says which module created it.
Only names and integers are kept; modules are held weakly.
"""

from __future__ import annotations

import bisect
import weakref

import torch

# Both exist since torch 2.1; without them the backward is not attributed to modules.
_next_sequence_nr = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
_current_autograd_node = getattr(torch._C, "_current_autograd_node", None)
_NO_SEQUENCE_NR = 2**63  # AccumulateGrad nodes carry UINT64_MAX


class ModuleScope:
    def __init__(self):
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._named: weakref.WeakSet = weakref.WeakSet()
        self._stack: list[str] = []
        # From _starts[i] on, the graph nodes created belong to _inner[i] (sorted: sequence
        # numbers only grow within a thread, and the script's graph is built on one).
        self._starts: list[int] = [-1]
        self._inner: list[str] = [""]

    def name(self, module) -> str:
        """The module's qualified name: its type's name for a root, then the attribute path
        (as torch.utils.module_tracker names them, so names read the same)."""
        names = self._names
        if module not in names:
            names[module] = type(module).__name__
        name = names[module]
        if module not in self._named:
            for child_name, child in module.named_children():
                names[child] = f"{name}.{child_name}"
                self.name(child)
            self._named.add(module)
        return name

    def enter(self, module) -> None:
        self._stack.append(self.name(module))
        self._mark()

    def leave(self) -> None:
        if self._stack:
            self._stack.pop()
        self._mark()

    def _mark(self) -> None:
        if _next_sequence_nr is None:
            return
        start = _next_sequence_nr()
        inner = self._stack[-1] if self._stack else ""
        if self._starts[-1] == start:
            self._inner[-1] = inner
        elif self._inner[-1] != inner:
            self._starts.append(start)
            self._inner.append(inner)

    def current(self) -> str:
        """The innermost module running its forward; in backward, the module whose forward
        created the graph node being run; "" outside both."""
        if self._stack:
            return self._stack[-1]
        if _current_autograd_node is None:
            return ""
        node = _current_autograd_node()
        if node is None:
            return ""
        sequence_nr = node._sequence_nr()
        if sequence_nr >= _NO_SEQUENCE_NR:  # AccumulateGrad: a leaf's, created by no forward
            return ""
        return self._inner[bisect.bisect_right(self._starts, sequence_nr) - 1]
