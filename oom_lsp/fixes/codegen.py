"""Code for a replacement node, generated at the indentation it will sit at.

`Module.code_for_node` generates code as if the node started a line at
column 0: continuation lines inside brackets lose the indentation of the
statement around them. Generating with the statement's indentation keeps a
multi-line call or expression laid out as the user wrote it.
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.internal import CodegenState


def code_at_indent(node: cst.CSTNode, indent: str, module: cst.Module) -> str:
    """`node`'s code, for a node inside a statement indented by `indent`."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.indent_tokens = [indent] if indent else []
    node._codegen(state)
    return "".join(state.tokens)
