"""`ast.parse` and libcst's `evaluated_value` (an `ast.literal_eval`), one thread at a time.

CPython 3.11 before 3.11.8 and 3.12 before 3.12.2 count the depth of the conversion from
its C syntax tree to Python objects in state shared by every thread (python/cpython#106905,
fixed by #113035): a garbage collection that runs a finalizer in the middle of one
conversion lets another thread convert, and one of them fails with `SystemError: AST
constructor recursion depth mismatch (before=27, after=22)`. The language server analyses
a big document in a worker of its own while the others go on, and builds prompts and
checks AI edits in threads, so its parses do meet: a document then got no diagnostics at
all. `ast.parse` is a small part of an analysis (libcst's parser, which is not affected,
and the rules take most of it), so holding the lock over the whole call costs little.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_CONVERSION = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """`ast.parse(source, filename, mode)`."""
    with _CONVERSION:
        return ast.parse(source, filename, mode)


def parse_only(source: str, filename: str) -> Any:
    """`compile(source, filename, "exec", PyCF_ONLY_AST)`: what `compile` says about the text."""
    with _CONVERSION:
        return compile(source, filename, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)


def evaluated_value(node: Any) -> Any:
    """A libcst string or number node's `evaluated_value`."""
    with _CONVERSION:
        return node.evaluated_value
