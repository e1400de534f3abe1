"""Small questions rules ask of libcst nodes."""

from __future__ import annotations

import enum

import libcst as cst

from oom_lsp import python_ast


class _Unknown(enum.Enum):
    UNKNOWN = "unknown"


# An argument lookup answers UNKNOWN when `*args` / `**kwargs` could supply the
# argument: rules stay silent then (TorchFix's false positives came from this).
UNKNOWN = _Unknown.UNKNOWN


def has_splat(call: cst.Call) -> bool:
    return any(arg.star in ("*", "**") for arg in call.args)


def get_arg(call: cst.Call, name: str, position: int | None = None) -> cst.Arg | None | _Unknown:
    """The argument passed as keyword `name` or at `position`.

    None when it is certainly absent, UNKNOWN when a splat may carry it.
    """
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    if position is not None:
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if len(positional) > position and not any(
            arg.star == "*" for arg in call.args[: call.args.index(positional[position])]
        ):
            return positional[position]
    if has_splat(call):
        return UNKNOWN
    return None


def bound_arguments(call: cst.Call, params: list[str]) -> dict[str, cst.BaseExpression]:
    """The argument `call` passes for each parameter of the callee (`params` its
    parameter names in order, `self` left out for a method call): positional
    ones by position, keyword ones by name. A splat binds nothing certain:
    {} then."""
    if has_splat(call):
        return {}
    bound: dict[str, cst.BaseExpression] = {}
    position = 0
    for arg in call.args:
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
            continue
        if position < len(params):
            bound[params[position]] = arg.value
        position += 1
    return bound


def target_names(target: cst.BaseExpression) -> set[str]:
    """The plain names an assignment or loop target binds: `x`, `a, (b, c)`."""
    if type(target) is cst.Name:
        return {target.value}
    if type(target) in (cst.Tuple, cst.List):
        return {name for element in target.elements for name in target_names(element.value)}
    return set()


def int_value(expr: cst.BaseExpression | None) -> int | None:
    """The value of an integer literal (`256`, `1_024`, `2**10` is not one)."""
    if isinstance(expr, cst.Integer):
        try:
            return int(expr.value.replace("_", ""), 0)
        except ValueError:
            return None
    return None


def method_call(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, str] | None:
    """(receiver, method) for `receiver.method(...)`."""
    # Exact type tests (libcst has no subclasses of Call and Attribute): every rule asks
    # this of every call, and isinstance() on libcst's classes goes through ABCMeta.
    if type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Attribute:
            return func.value, func.attr.value
    return None


def name_of(expr: cst.BaseExpression) -> str | None:
    return expr.value if isinstance(expr, cst.Name) else None


def is_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


def is_false(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def string_value(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        raw = expr.value
        # libcst's evaluated_value compiles the literal (ast.literal_eval):
        # most strings in training code have no prefix and no escape.
        quote = raw[:3] if raw[:3] in ('"""', "'''") else raw[:1]
        if quote in ('"', "'", '"""', "'''") and "\\" not in raw:
            return raw[len(quote) : -len(quote)]
        value = python_ast.evaluated_value(expr)
        return value if isinstance(value, str) else None
    return None
