"""Who calls whom, and the context each call runs in, merged over callers.

The grad mode, train/eval mode and "once per training step" of a line are
not written on that line: `evaluate()` runs without autograd when its caller
wraps it in `torch.no_grad()`, a closure runs with autograd when an optimizer
calls it, a Lightning `validation_step` runs under `no_grad` because Lightning
says so. This module resolves the calls of a file to its functions (PyCG's
idea, in the small) and computes, for every function, the set of contexts it
is entered in (`Grad`, `Mode` flags), as a fixed point over the call graph
(Pysa's): a function's entry context is the union over its call sites of the
context at each site, which is what the site's own scope imposes (a `with`, a
`set_grad_enabled` statement) or else what its scope was entered with.

A function that the file never calls, or that escapes as a value to code the
analysis cannot see, is entered in an UNKNOWN context, never in the default
one: unknown keeps rules silent.

Resolution covers: module and nested functions by name, `self.method(...)`
(the class, its bases of the file and the overrides of its subclasses),
`super().method(...)`, `Class(...)` (its `__init__`), methods of instances of
classes of the file (`meter.update(x)`, `self.helper.run(x)`), calls of module
instances (`self.encoder(x)` runs `Encoder.forward`), and functions passed to
calls whose receiver the library summaries know (`optimizer.step(closure)`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments
from oom_lsp.analysis.dataflow import assigned_names, facts_for, is_backward_call
from oom_lsp.analysis.facts import library
from oom_lsp.analysis.facts.library import Grad, HookContext, Mode
from oom_lsp.analysis.facts.program import (
    Binding,
    BindingKind,
    Call,
    Function,
    Klass,
    LocalGrad,
    Program,
    Reference,
    grad_effect,
    program_of,
)

_MODULE_BASES = frozenset(
    {
        "torch.nn.Module",
        "torch.nn.modules.module.Module",
        *library.LIGHTNING_BASES,
        "transformers.PreTrainedModel",
        "transformers.modeling_utils.PreTrainedModel",
        "diffusers.ModelMixin",
        "diffusers.models.modeling_utils.ModelMixin",
    }
)
_MODULE_RETURNING = frozenset(
    {"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double", "requires_grad_", "to_empty"}
)
_LOCAL_TO_GRAD = {
    LocalGrad.OFF: Grad.OFF,
    LocalGrad.ON: Grad.ON,
    LocalGrad.MAYBE: Grad.MAYBE,
}
# Containers of modules whose elements are what iterating or indexing them gives.
_MODULE_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.Sequential", "torch.nn.ModuleDict"})
# How far resolution follows names bound to names (`f = g`).
_MAX_ALIAS_DEPTH = 8


class CallGraph:
    """Resolved calls and entry contexts of one file."""

    def __init__(self, context: FileContext) -> None:
        self.context: FileContext = weakref.proxy(context)
        self.program: Program = program_of(context)
        self._flow_facts = facts_for(context)
        self.imports = context.imports
        self._callees: dict[int, tuple[Function, ...]] = {}
        self._module_classes: set[int] | None = None
        self._subclasses: dict[int, list[Klass]] | None = None
        self._callers: dict[int, list[Call]] | None = None
        self._calls_by_name: dict[str, list[Call]] | None = None
        self._escapes: dict[int, list[Reference]] | None = None
        self._grad: dict[int, Grad] | None = None
        self._backward: dict[int, bool] = {}
        self._opaque: list[Call] | None = None

    # --- classes -------------------------------------------------------------
    def is_module_class(self, klass: Klass) -> bool:
        """A subclass of `nn.Module` (through classes of the file or a known library base)."""
        if self._module_classes is None:
            self._module_classes = set()
            changed = True
            while changed:
                changed = False
                for candidate in self.program.classes:
                    if id(candidate) in self._module_classes:
                        continue
                    if any(self._is_module_base(base, candidate) for base in candidate.bases):
                        self._module_classes.add(id(candidate))
                        changed = True
        return id(klass) in self._module_classes

    def _is_module_base(self, base: cst.BaseExpression, klass: Klass) -> bool:
        qualified = self.imports.qualified_name(base)
        if qualified is not None:
            if qualified in _MODULE_BASES:
                return True
            head, _, last = qualified.rpartition(".")
            if head in ("torch.nn", "torch.nn.modules") and last[:1].isupper() and last not in (
                "Parameter",
                "ParameterList",
                "ParameterDict",
            ):
                return True
            return qualified.startswith(("transformers.", "diffusers.")) and last.endswith(
                ("PreTrainedModel", "Model", "ModelMixin")
            )
        for base_class in self.classes_named(dotted_name(base), klass.scope):
            if base_class is not klass and id(base_class) in (self._module_classes or ()):
                return True
        return False

    def classes_named(self, name: str | None, scope: Function) -> list[Klass]:
        if name is None or "." in name:
            return []
        classes = []
        for binding in self.program.lookup(name, scope):
            if binding.kind is BindingKind.CLASS:
                klass = self.program.klass(binding.node)
                if klass is not None:
                    classes.append(klass)
            else:
                return []  # also bound to something else: cannot tell
        return classes

    def base_classes(self, klass: Klass) -> list[Klass]:
        found = []
        for base in klass.bases:
            found.extend(self.classes_named(dotted_name(base), klass.scope))
        return [base for base in found if base is not klass]

    def subclasses(self, klass: Klass) -> list[Klass]:
        if self._subclasses is None:
            self._subclasses = {}
            for candidate in self.program.classes:
                for base in self.base_classes(candidate):
                    self._subclasses.setdefault(id(base), []).append(candidate)
        return self._subclasses.get(id(klass), [])

    def qualified_bases(self, klass: Klass, depth: int = 0) -> set[str]:
        """The qualified names of the library classes `klass` derives from."""
        found: set[str] = set()
        for base in klass.bases:
            qualified = self.imports.qualified_name(base)
            if qualified is not None:
                found.add(qualified)
        if depth < 5:
            for base_class in self.base_classes(klass):
                found |= self.qualified_bases(base_class, depth + 1)
        return found

    def method(self, klass: Klass, name: str, depth: int = 0) -> list[Function]:
        """`klass.name` as Python's attribute lookup finds it among the classes of the file."""
        if name in klass.methods:
            return klass.methods[name]
        if depth > 5:
            return []
        for base in self.base_classes(klass):
            found = self.method(base, name, depth + 1)
            if found:
                return found
        return []

    def dispatch(self, klass: Klass, name: str) -> list[Function]:
        """Every method that `instance.name(...)` may run for an instance of
        `klass` or of a subclass of the file (an override)."""
        found = list(self.method(klass, name))
        pending = list(self.subclasses(klass))
        seen = {id(klass)}
        while pending:
            subclass = pending.pop()
            if id(subclass) in seen:
                continue
            seen.add(id(subclass))
            found.extend(method for method in subclass.methods.get(name, ()) if method not in found)
            pending.extend(self.subclasses(subclass))
        return found

    # --- values that are instances -------------------------------------------
    def instance_class(self, expr: cst.BaseExpression, scope: Function, depth: int = 0) -> Klass | None:
        """The class of the file that `expr` is an instance of, when every
        binding of it says so: `Net(...)`, a name bound to one, `self.x`
        assigned one in a method, `x.to(device)` of one."""
        if depth > _MAX_ALIAS_DEPTH:
            return None
        expr_type = type(expr)
        if expr_type is cst.Call:
            func = expr.func
            if type(func) is cst.Name:
                classes = self.classes_named(func.value, scope)
                return classes[0] if len(classes) == 1 else None
            if type(func) is cst.Attribute and func.attr.value in _MODULE_RETURNING:
                return self.instance_class(func.value, scope, depth + 1)
            return None
        bound = self._bindings_of(expr, scope)
        if bound is not None:
            return self._class_of_bindings(bound[0], bound[1], depth)
        if expr_type is cst.Attribute:
            # `self.model.cell`, `detector.model`: an attribute its methods set
            # on an instance of a class of the file.
            holder = self.instance_class(expr.value, scope, depth + 1)
            if holder is not None:
                bindings = self.attribute_bindings(holder, expr.attr.value)
                return self._class_of_bindings(bindings, scope, depth) if bindings else None
        return None

    def _bindings_of(self, expr: cst.BaseExpression, scope: Function) -> tuple[list[Binding], Function] | None:
        """The bindings of a name, or of an attribute of `self` in a method
        (those its class's methods make), with the scope they are read from."""
        if type(expr) is cst.Name:
            return self.program.lookup(expr.value, scope), scope
        if type(expr) is cst.Attribute and type(expr.value) is cst.Name:
            method_scope = _method_scope(scope)
            if method_scope is not None and expr.value.value == method_scope.self_name:
                owner = method_scope.owner
                assert owner is not None
                return self.attribute_bindings(owner, expr.attr.value), method_scope
        return None

    def attribute_bindings(self, klass: Klass, name: str, depth: int = 0) -> list[Binding]:
        bindings = list(klass.attributes.get(name, ()))
        if depth < 5:
            for base in self.base_classes(klass):
                bindings.extend(self.attribute_bindings(base, name, depth + 1))
        return bindings

    def _class_of_bindings(self, bindings: list[Binding], scope: Function, depth: int) -> Klass | None:
        found: Klass | None = None
        for binding in bindings:
            if binding.kind is BindingKind.PARAM and binding.scope is not None:
                klass = self._parameter_class(binding.scope, binding.name, depth + 1)
            elif binding.kind is not BindingKind.ASSIGN or binding.value is None:
                return None
            else:
                klass = self.instance_class(binding.value, _binding_scope(self.program, binding, scope), depth + 1)
            if klass is None or (found is not None and klass is not found):
                return None
            found = klass
        return found

    def _parameter_class(self, function: Function, name: str, depth: int) -> Klass | None:
        """The class of the file a parameter's value is an instance of, when
        every call that names the function (or its class, for `__init__`)
        passes one of the same class: `Detector(model.to(device))` with
        `model = Forecaster(...)` makes `model` in `Detector.__init__` a
        Forecaster."""
        if depth > _MAX_ALIAS_DEPTH or function.is_lambda or function.is_module:
            return None
        calls = self._calls_naming(function)
        if not calls:
            return None
        params = list(function.params)
        if function.self_name is not None and params:
            params = params[1:]
        found: Klass | None = None
        for call in calls:
            argument = bound_arguments(call.node, params).get(name)
            if argument is None:
                return None
            klass = self.instance_class(argument, call.scope, depth + 1)
            if klass is None or (found is not None and klass is not found):
                return None
            found = klass
        return found

    def _calls_naming(self, function: Function) -> list[Call]:
        """The calls that name `function` directly (`train(model)`), or its
        class for `__init__` (`Detector(model)`). Read from the names alone,
        not from the call graph, so they can be asked while it is built."""
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for scope in self.program.functions:
                for call in scope.calls:
                    func = call.node.func
                    if type(func) is cst.Name:
                        self._calls_by_name.setdefault(func.value, []).append(call)
        owner = function.owner
        constructor = function.name == "__init__" and owner is not None
        if owner is not None and not constructor:
            return []  # a method is called through its instance
        name = owner.name if constructor else function.name  # type: ignore[union-attr]
        found = []
        for call in self._calls_by_name.get(name, ()):
            for binding in self.program.lookup(name, call.scope):
                if constructor and binding.kind is BindingKind.CLASS and self.program.klass(binding.node) is owner:
                    found.append(call)
                    break
                if not constructor and binding.kind is BindingKind.DEF and self.program.function(binding.node) is function:
                    found.append(call)
                    break
        return found

    # --- resolution ---------------------------------------------------------
    def callees(self, call: Call) -> tuple[Function, ...]:
        """The functions of the file this call may run (empty: unresolved, or a library call)."""
        known = self._callees.get(id(call.node))
        if known is None:
            known = self._callees[id(call.node)] = tuple(self._resolve(call.node.func, call.scope, 0))
        return known

    def _resolve(self, func: cst.BaseExpression, scope: Function, depth: int) -> list[Function]:
        if depth > _MAX_ALIAS_DEPTH:
            return []
        func_type = type(func)
        if func_type is cst.Name:
            return self._resolve_name(func.value, scope, depth)
        if func_type is cst.Attribute:
            return self._resolve_attribute(func, scope, depth)
        if func_type is cst.Call:
            # `super().m`, handled by the attribute; `Net()(x)`: a module called at once.
            klass = self.instance_class(func, scope)
            if klass is not None:
                return self.dispatch(klass, "__call__") or self.dispatch(klass, "forward")
        if func_type is cst.Subscript:
            # `self.blocks[i](x)`, `self.nets["g"](z)`: an element of a container of modules.
            return self._forwards(self._element_classes(func.value, scope, depth + 1))
        return []

    def _forwards(self, classes: Iterable[Klass]) -> list[Function]:
        found: list[Function] = []
        for klass in classes:
            found.extend(self.dispatch(klass, "forward") or self.dispatch(klass, "__call__"))
        return found

    def _element_classes(self, expr: cst.BaseExpression, scope: Function, depth: int) -> list[Klass]:
        """The classes of the file among the elements of a container of
        modules: `nn.ModuleList([Block() for _ in range(n)])`,
        `nn.Sequential(Conv(), nn.ReLU())`, `[Net(), Net()]`, `{"g": G()}`,
        or a name or attribute every binding of which is one. Iterating it
        binds those instances, subscripting it returns one, and calling an
        `nn.Sequential` runs each element's forward. Empty when unknown."""
        if depth > _MAX_ALIAS_DEPTH:
            return []
        expr_type = type(expr)
        values: list[cst.BaseExpression] = []
        # Elements given through an iterable: `ModuleList(blocks)`, `Sequential(*blocks)`.
        spread: list[Klass] = []
        if expr_type in (cst.List, cst.Tuple, cst.Set):
            for element in expr.elements:  # type: ignore[attr-defined]
                if type(element) is cst.StarredElement:
                    values.extend(self._element_values(element.value))
                else:
                    values.append(element.value)
        elif expr_type is cst.Dict:
            values = [element.value for element in expr.elements if type(element) is cst.DictElement]
        elif expr_type in (cst.ListComp, cst.GeneratorExp, cst.SetComp):
            values = [expr.elt]  # type: ignore[attr-defined]
        elif expr_type is cst.DictComp:
            values = [expr.value]  # type: ignore[attr-defined]
        elif expr_type is cst.Call:
            qualified = self.imports.qualified_name(expr.func)
            if qualified in _MODULE_CONTAINERS:
                for arg in expr.args:
                    if arg.keyword is not None:
                        continue
                    if arg.star == "*" or qualified != "torch.nn.Sequential":
                        spread += self._element_classes(arg.value, scope, depth + 1)
                    else:
                        values.append(arg.value)
            elif type(expr.func) is cst.Attribute and expr.func.attr.value in _MODULE_RETURNING:
                return self._element_classes(expr.func.value, scope, depth + 1)
            else:
                return []
        else:
            bound = self._bindings_of(expr, scope)
            return self._elements_of_bindings(bound[0], bound[1], depth) if bound is not None else []
        return _unique(spread + self._classes_of(values, scope, depth))

    @staticmethod
    def _element_values(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        if type(expr) in (cst.List, cst.Tuple):
            return [element.value for element in expr.elements]  # type: ignore[attr-defined]
        if type(expr) in (cst.ListComp, cst.GeneratorExp):
            return [expr.elt]  # type: ignore[attr-defined]
        return []

    def _classes_of(self, values: list[cst.BaseExpression], scope: Function, depth: int) -> list[Klass]:
        found: list[Klass] = []
        for value in values:
            klass = self.instance_class(value, scope, depth + 1)
            if klass is not None and klass not in found:
                found.append(klass)
        return found

    def _elements_of_bindings(self, bindings: list[Binding], scope: Function, depth: int) -> list[Klass]:
        found: list[Klass] = []
        for binding in bindings:
            if binding.kind is not BindingKind.ASSIGN or binding.value is None:
                continue  # `self.blocks.append(Block())` adds no binding; other kinds say nothing
            for klass in self._element_classes(binding.value, _binding_scope(self.program, binding, scope), depth + 1):
                if klass not in found:
                    found.append(klass)
        return found

    def _resolve_name(self, name: str, scope: Function, depth: int) -> list[Function]:
        bindings = self.program.lookup(name, scope)
        if not bindings:
            return []
        found: list[Function] = []
        for binding in bindings:
            if binding.kind is BindingKind.DEF:
                function = self.program.function(binding.node)
                if function is not None:
                    found.append(function)
            elif binding.kind is BindingKind.CLASS:
                klass = self.program.klass(binding.node)
                if klass is not None:
                    found.extend(self.method(klass, "__init__"))
            elif binding.kind is BindingKind.ASSIGN and binding.value is not None:
                value = binding.value
                if type(value) is cst.Lambda:
                    function = self.program.function(value)
                    if function is not None:
                        found.append(function)
                elif type(value) in (cst.Name, cst.Attribute):
                    found.extend(self._resolve(value, _binding_scope(self.program, binding, scope), depth + 1))
                else:
                    klass = self.instance_class(value, _binding_scope(self.program, binding, scope))
                    if klass is not None:
                        found.extend(self.dispatch(klass, "forward") or self.dispatch(klass, "__call__"))
            elif binding.kind is BindingKind.PARAM and binding.scope is not None:
                # `model(x)` in `def evaluate(model, loader)`: the module every
                # call of the function passes (a class of the file), else unknown.
                klass = self._parameter_class(binding.scope, name, depth + 1)
                if klass is not None:
                    found.extend(self.dispatch(klass, "forward") or self.dispatch(klass, "__call__"))
            elif binding.kind is BindingKind.LOOP and type(binding.node) is cst.For:
                # `for block in self.blocks: x = block(x)`: each element's forward.
                loop = binding.node
                if type(loop.target) is cst.Name and loop.target.value == name:
                    for klass in self._element_classes(loop.iter, _binding_scope(self.program, binding, scope), depth + 1):
                        found.extend(self.dispatch(klass, "forward") or self.dispatch(klass, "__call__"))
        return found

    def _resolve_attribute(self, func: cst.Attribute, scope: Function, depth: int) -> list[Function]:
        receiver = func.value
        name = func.attr.value
        method_scope = _method_scope(scope)
        if type(receiver) is cst.Name and method_scope is not None:
            owner = method_scope.owner
            assert owner is not None
            if receiver.value == method_scope.self_name:
                found = self.dispatch(owner, name)
                if found:
                    return found
                klass = self.instance_class(func, scope)
                if klass is not None:
                    return self.dispatch(klass, "forward") or self.dispatch(klass, "__call__")
                return self._sequential_forwards(func, scope, depth)
        if (
            type(receiver) is cst.Call
            and type(receiver.func) is cst.Name
            and receiver.func.value == "super"
            and method_scope is not None
        ):
            owner = method_scope.owner
            assert owner is not None
            for base in self.base_classes(owner):
                found = self.method(base, name)
                if found:
                    return found
            return []
        if name == "forward":
            klass = self.instance_class(receiver, scope)
            return self.dispatch(klass, "forward") if klass is not None else []
        klass = self.instance_class(receiver, scope)
        if klass is not None:
            found = self.dispatch(klass, name)
            if found:
                return found
        # `self.encoder(x)`: an attribute holding a module instance.
        klass = self.instance_class(func, scope)
        if klass is not None:
            return self.dispatch(klass, "forward") or self.dispatch(klass, "__call__")
        return self._sequential_forwards(func, scope, depth)

    def _sequential_forwards(self, func: cst.BaseExpression, scope: Function, depth: int) -> list[Function]:
        """Calling an `nn.Sequential` runs each element's forward in turn:
        `self.layers(x)` with `self.layers = nn.Sequential(Block(), nn.ReLU())`."""
        bound = self._bindings_of(func, scope)
        if bound is None:
            return []
        bindings, scope = bound
        found: list[Function] = []
        for binding in bindings:
            value = binding.value
            if binding.kind is not BindingKind.ASSIGN or type(value) is not cst.Call:
                return []
            if self.imports.qualified_name(value.func) != "torch.nn.Sequential":
                return []
            found.extend(
                self._forwards(self._element_classes(value, _binding_scope(self.program, binding, scope), depth + 1))
            )
        return found

    def callers(self, function: Function) -> list[Call]:
        """The call sites that may run `function`."""
        if self._callers is None:
            self._callers = {}
            for scope in self.program.functions:
                for call in scope.calls:
                    for callee in self.callees(call):
                        self._callers.setdefault(id(callee), []).append(call)
        return self._callers.get(id(function), [])

    def escapes(self, function: Function) -> list[Reference]:
        """Where `function` is used as a value rather than called."""
        if self._escapes is None:
            self._escapes = {}
            for reference in self.program.references:
                for target in self._resolve(reference.node, reference.scope, 0):
                    if target is reference.scope:
                        continue
                    self._escapes.setdefault(id(target), []).append(reference)
        return self._escapes.get(id(function), [])

    # --- grad mode ---------------------------------------------------------
    def grad_at(self, call: Call) -> Grad:
        """The grad modes the statement of `call` may run under."""
        if call.local_grad is not None:
            return _LOCAL_TO_GRAD[call.local_grad]
        return self.entry_grad(call.scope)

    def entry_grad(self, function: Function) -> Grad:
        """The grad modes `function` may be entered with (a fixed point over the file)."""
        if self._grad is None:
            self._grad = self._solve_grad()
        return self._grad.get(id(function), Grad.UNKNOWN)

    def _solve_grad(self) -> dict[int, Grad]:
        functions = self.program.functions
        fixed: dict[int, Grad] = {}
        for function in functions:
            decided = self._declared_grad(function)
            if decided is not None:
                fixed[id(function)] = decided
        state: dict[int, Grad] = {id(function): Grad.NONE for function in functions}
        state.update(fixed)
        for _ in range(len(functions) + 2):
            changed = False
            for function in functions:
                if id(function) in fixed:
                    continue
                value = self._from_callers(function, state)
                if value != state[id(function)]:
                    state[id(function)] = value
                    changed = True
            if not changed:
                break
        # Past the iteration cap (cannot happen on a finite lattice, but cheap to keep honest).
        return {key: value if value != Grad.NONE else Grad.UNKNOWN for key, value in state.items()}

    def external_grad(self, function: Function) -> Grad:
        """The grad modes other files of the project call `function` with."""
        project = self.context.project
        if project is None or function.is_module:
            return Grad.NONE
        return project.incoming.get(function.qualname, Grad.NONE)

    def declared_grad(self, function: Function) -> Grad | None:
        return self._declared_grad(function)

    def escape_grad(self, reference: Reference) -> Grad:
        """The grad mode a function used as a value runs under (UNKNOWN unless
        a library summary says how the receiving call runs it)."""
        if self._grad is None:
            self._grad = self._solve_grad()
        return self._grad_of_escape(reference, self._grad)

    def _declared_grad(self, function: Function) -> Grad | None:
        """What the function itself, or its framework, fixes for every call."""
        if function.is_module:
            return Grad.ON
        for decorator in function.decorators:
            effect = grad_effect(decorator, self.imports, self.program.local_grad_off)
            if effect is not None:
                return _LOCAL_TO_GRAD[effect]
        for decorator in function.decorators:
            target = decorator.func if type(decorator) is cst.Call else decorator
            if self.imports.qualified_name(target) in library.ENTRY_POINT_DECORATORS:
                return Grad.ON  # the program's entry point: autograd in its default mode
        hook = self.framework_hook(function)
        if hook is not None:
            return hook.grad
        return None

    def framework_hook(self, function: Function) -> HookContext | None:
        owner = function.owner
        if owner is None or function.is_lambda:
            return None
        bases = None
        for (framework_bases, method), context in library.FRAMEWORK_HOOKS.items():
            if method != function.name:
                continue
            if bases is None:
                bases = self.qualified_bases(owner)
            if bases & framework_bases:
                return context
        return None

    def _from_callers(self, function: Function, state: dict[int, Grad]) -> Grad:
        value = Grad.NONE
        for call in self.callers(function):
            if call.local_grad is not None:
                value |= _LOCAL_TO_GRAD[call.local_grad]
            else:
                value |= state.get(id(call.scope), Grad.UNKNOWN)
        for reference in self.escapes(function):
            value |= self._grad_of_escape(reference, state)
        value |= self.external_grad(function)
        if value == Grad.NONE:
            return Grad.UNKNOWN  # nothing in the file calls it: its callers are elsewhere
        if self._is_module_entry(function):
            if self._used_elsewhere(function.owner):  # type: ignore[arg-type]
                # Other files of the project make or use instances of the class:
                # they run its forward under modes this file cannot see.
                value |= Grad.UNKNOWN
            # A module is also run by calls the resolution could not type
            # (`model(x)` with `model` a parameter whose callers pass it through
            # too many hands): each such call may run this forward.
            for call in self._opaque_calls():
                if call.local_grad is not None:
                    value |= _LOCAL_TO_GRAD[call.local_grad]
                else:
                    value |= state.get(id(call.scope), Grad.UNKNOWN)
        return value

    def _is_module_entry(self, function: Function) -> bool:
        owner = function.owner
        return owner is not None and function.name in ("forward", "__call__") and self.is_module_class(owner)

    def _used_elsewhere(self, klass: Klass) -> bool:
        """Another file of the project calls the class or a method of its
        instances (`model = GPT(config)` in train.py)."""
        project = self.context.project
        if project is None:
            return False
        return any(name == klass.name or name.startswith(klass.name + ".") for name in project.incoming)

    def _opaque_calls(self) -> list[Call]:
        """Calls of a value the file cannot type, that may be a module of the
        file: a parameter or a loop variable called as a function
        (`model(x)`, `block(x)`), or an element of a container (`nets[i](x)`),
        that resolution left without a callee."""
        if self._opaque is None:
            self._opaque = []
            for scope in self.program.functions:
                for call in scope.calls:
                    if self.callees(call):
                        continue
                    func = call.node.func
                    if type(func) is cst.Subscript or (
                        type(func) is cst.Name
                        and any(
                            binding.kind in (BindingKind.PARAM, BindingKind.LOOP)
                            for binding in self.program.lookup(func.value, scope)
                        )
                    ):
                        self._opaque.append(call)
        return self._opaque

    def _grad_of_escape(self, reference: Reference, state: dict[int, Grad]) -> Grad:
        """The grad mode a function passed to a call runs under, when the
        receiving call is known to run it; UNKNOWN otherwise."""
        receiver = reference.passed_to
        if receiver is None:
            return Grad.UNKNOWN
        site = self.program.call(receiver)
        at_site = Grad.UNKNOWN
        if site is not None:
            at_site = _LOCAL_TO_GRAD[site.local_grad] if site.local_grad is not None else state.get(
                id(site.scope), Grad.UNKNOWN
            )
        func = receiver.func
        qualified = self.imports.qualified_name(func)
        if qualified is None and type(func) is cst.Name and not self.program.lookup(func.value, site.scope if site else self.program.module):
            qualified = func.value  # a builtin: map, filter, sorted
        if qualified in library.CALLBACK_RECEIVERS and reference.position == 0 or (
            qualified in ("sorted", "min", "max") and reference.keyword == "key"
        ):
            mode = library.CALLBACK_RECEIVERS.get(qualified or "")
            return mode if mode is not None else at_site
        if type(func) is cst.Attribute and func.attr.value in library.CALLBACK_METHODS and (
            reference.position == 0 or reference.keyword == "closure"
        ):
            return library.CALLBACK_METHODS[func.attr.value]
        if type(func) is cst.Call and self.imports.qualified_name(func.func) in library.WRAPPING_CONTEXTS:
            effect = grad_effect(func, self.imports)
            return _LOCAL_TO_GRAD[effect] if effect is not None else Grad.UNKNOWN
        return Grad.UNKNOWN

    # --- training -------------------------------------------------------------
    def runs_backward(self, function: Function) -> bool:
        """The function runs a backward pass, itself or in a function of the file it calls."""
        known = self._backward.get(id(function))
        if known is not None:
            return known
        self._backward[id(function)] = False  # while it is worked out: recursion
        answer = any(self._call_runs_backward(call) for call in function.calls)
        self._backward[id(function)] = answer
        return answer

    def call_runs_backward(self, call: Call) -> bool:
        """The call is a backward pass, or runs one in a function of the file."""
        return self._call_runs_backward(call)

    def _call_runs_backward(self, call: Call) -> bool:
        if is_backward_call(call.node, self.context):
            return True
        return any(self.runs_backward(callee) for callee in self.callees(call) if callee is not call.scope)

    def result_feeds_a_backward(self, function: Function, depth: int = 0) -> bool | None:
        """Whether what `function` returns may reach a backward pass in a caller
        (`loss = compute_loss(model, batch)` then `loss.backward()`, directly or
        through callers that return it on); None when no caller is known."""
        if function.is_module or depth > 2:
            return False
        facts = self._flow_facts
        if not facts.summary(None if function.is_module else function.node).returned:  # type: ignore[arg-type]
            return False
        callers = self.callers(function)
        if not callers:
            return None
        for caller in callers:
            if caller.scope.is_lambda:
                continue
            caller_summary = facts.summary(None if caller.scope.is_module else caller.scope.node)  # type: ignore[arg-type]
            if _assigned_from(caller) & caller_summary.feeds_backward:
                return True
            if _returned_directly(caller) and self.result_feeds_a_backward(caller.scope, depth + 1) is not False:
                return True
        return False

    def runs_within_forward(self, function: Function, depth: int = 0) -> bool:
        """Whether `function` runs inside a module's forward pass: it is a
        forward method of a module class, or every call site known to run it
        is in such a function (`forward` calling `self.fignn_layer(x)`). What
        it computes then feeds the step's loss: a graph kept across its loops
        is the model's own, freed by that step's backward."""
        if function.is_module or function.is_lambda or depth > 3:
            return False
        if function.owner is not None and function.name in FORWARD_METHODS:
            return True  # its class's base may be in another file: the name is the evidence
        callers = [call for call in self.callers(function) if call.scope is not function]
        return bool(callers) and all(self.runs_within_forward(call.scope, depth + 1) for call in callers)

    def trains_in(self, loop: cst.CSTNode, scope: Function) -> bool:
        """A backward pass runs in the body of `loop` (a loop of `scope`)."""
        return any(
            any(enclosing is loop for enclosing in call.loops) and self._call_runs_backward(call)
            for call in scope.calls
        )


# The methods a module's __call__ runs: the forward pass.
FORWARD_METHODS = frozenset({"forward", "__call__", "_forward", "forward_features"})


def _assigned_from(call: Call) -> set[str]:
    """The names the statement of `call` binds (`loss = compute(model, x)`)."""
    statement = call.statement
    names: set[str] = set()
    if type(statement) is cst.SimpleStatementLine:
        for small in statement.body:
            names.update(name for name, _ in assigned_names(small))
    return names


def _returned_directly(call: Call) -> bool:
    statement = call.statement
    return type(statement) is cst.SimpleStatementLine and any(
        type(small) is cst.Return for small in statement.body
    )


def _method_scope(scope: Function) -> Function | None:
    """The method whose `self` a scope sees: the scope itself, or the method
    a nested function or lambda is defined in."""
    current: Function | None = scope
    while current is not None and not current.is_module:
        if current.owner is not None:
            return current if current.self_name is not None else None
        current = current.parent
    return None


def _binding_scope(program: Program, binding: Binding, default: Function) -> Function:
    """The scope whose code a binding's value is evaluated in."""
    return binding.scope if binding.scope is not None else default


_GRAPHS: weakref.WeakKeyDictionary[FileContext, CallGraph] = weakref.WeakKeyDictionary()


def call_graph(context: FileContext) -> CallGraph:
    graph = _GRAPHS.get(context)
    if graph is None:
        graph = _GRAPHS[context] = CallGraph(context)
    return graph


def union(values: Iterable[Grad]) -> Grad:
    result = Grad.NONE
    for value in values:
        result |= value
    return result


def _unique(classes: list[Klass]) -> list[Klass]:
    found: list[Klass] = []
    for klass in classes:
        if klass not in found:
            found.append(klass)
    return found
