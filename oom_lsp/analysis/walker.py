"""A fast pre-order traversal of a libcst tree for batched read-only visitors.

libcst's own `visit_batched` goes through `_visit_and_replace_children`,
which rebuilds every node and visits every whitespace token: on real files it
cost more than the parse itself. Rules only read nodes, so this walker reads
each node's dataclass fields directly and skips the ones that hold only
whitespace, brackets and punctuation. Dispatch is by class name, as in libcst
(`visit_Call`, `leave_For`); attribute hooks (`visit_Call_func`) are not
supported.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import libcst as cst

# Fields that never hold a node a rule inspects through a visit.
_SKIPPED_FIELDS = frozenset(
    {
        "leading_lines",
        "lines_after_decorators",
        "header",
        "footer",
        "trailing_whitespace",
        "lpar",
        "rpar",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "comma",
        "semicolon",
        "equal",
        "colon",
        "star",
        "asynchronous",
        "encoding",
        "default_indent",
        "default_newline",
        "has_trailing_newline",
        "indent",
        "operator",
        "dot",
        "whitespace",
        "newline",
        "lbracket",
        "first_line",
    }
)
# Source order where the dataclass field order differs from it.
_ORDER = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.Parameters: ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
}

Hook = Callable[[cst.CSTNode], object]

# isinstance() against libcst's classes goes through ABCMeta.__instancecheck__
# (CSTNode is an ABC): answering it once per concrete type halves a walk.
_IS_NODE_TYPE: dict[type, bool] = {}


def is_node(value: object) -> bool:
    """isinstance(value, cst.CSTNode), cached per type."""
    value_type = type(value)
    known = _IS_NODE_TYPE.get(value_type)
    if known is None:
        known = _IS_NODE_TYPE[value_type] = isinstance(value, cst.CSTNode)
    return known


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(node_class: type) -> tuple[str, ...]:
    """The fields of a node class that can hold nodes a rule inspects, in source order
    (computed once per class: the program index asks it for every expression)."""
    fields = _CHILD_FIELDS.get(node_class)
    if fields is None:
        if node_class in _ORDER:
            fields = _ORDER[node_class]
        else:
            fields = tuple(
                field.name
                for field in dataclasses.fields(node_class)
                if field.name not in _SKIPPED_FIELDS and not field.name.startswith("whitespace")
            )
        _CHILD_FIELDS[node_class] = fields
    return fields


_HOOK_NAMES: dict[type, tuple[str, ...]] = {}


def _hook_names(visitor_class: type) -> tuple[str, ...]:
    """The visit_/leave_ method names of a visitor class, computed once per
    class: libcst's `get_visitors` inspects every member of every instance."""
    names = _HOOK_NAMES.get(visitor_class)
    if names is None:
        names = tuple(
            name
            for name in dir(visitor_class)
            if (name.startswith("visit_") or name.startswith("leave_"))
            and callable(getattr(visitor_class, name))
            # libcst's typed base class defines every hook as a marked no-op.
            and not getattr(getattr(visitor_class, name), "_is_no_op", False)
        )
        for name in names:
            if "_" in name.partition("_")[2]:
                raise TypeError(f"{visitor_class.__name__}.{name}: attribute hooks are not supported")
        _HOOK_NAMES[visitor_class] = names
    return names


def walk(
    root: cst.CSTNode,
    visitors: Iterable[cst.BatchableCSTVisitor],
    *,
    before_visit: Hook,
    after_leave: Hook,
    hooked_types: tuple[type, ...],
) -> None:
    """Visit `root` and its descendants with every visitor's visit_/leave_
    methods; `before_visit`/`after_leave` run around them for `hooked_types`."""
    visit_methods: dict[str, list[Hook]] = {}
    leave_methods: dict[str, list[Hook]] = {}
    for visitor in visitors:
        for name in _hook_names(type(visitor)):
            kind, _, type_name = name.partition("_")
            method = getattr(visitor, name)
            (visit_methods if kind == "visit" else leave_methods).setdefault(type_name, []).append(method)

    plans: dict[type, tuple[tuple[str, ...], list[Hook], list[Hook], bool]] = {}

    def plan_for(node_class: type) -> tuple[tuple[str, ...], list[Hook], list[Hook], bool]:
        plan = (
            child_fields(node_class),
            visit_methods.get(node_class.__name__, []),
            leave_methods.get(node_class.__name__, []),
            issubclass(node_class, hooked_types),
        )
        plans[node_class] = plan
        return plan

    def visit(node: cst.CSTNode) -> None:
        node_class = type(node)
        fields, visits, leaves, hooked = plans.get(node_class) or plan_for(node_class)
        if hooked:
            before_visit(node)
        for method in visits:
            method(node)
        for field_name in fields:
            value = getattr(node, field_name)
            if value is None:
                continue
            if type(value) is tuple or type(value) is list:
                for child in value:
                    if is_node(child):
                        visit(child)
            elif is_node(value):
                visit(value)
        for method in leaves:
            method(node)
        if hooked:
            after_leave(node)

    try:
        visit(root)
    finally:
        # `visit` refers to itself through its closure: a cycle that held the visitors (the
        # rules and the file's whole analysis state) until the cyclic collector ran.
        visit = None
