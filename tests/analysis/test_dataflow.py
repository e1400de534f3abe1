"""The graph-attachment data flow behind OOM301..OOM305.

`_probes(source)` returns the kind of the argument of every `probe(...)`
call, in source order, as the flow of the enclosing function sees it there.
"""

from __future__ import annotations

import gc
import textwrap
import weakref

import libcst as cst
import pytest

from oom_lsp.analysis import dataflow
from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.dataflow import (
    Kind,
    Role,
    facts_for,
    merge,
    model_name_heuristic,
    rebinds_every_iteration,
)
from oom_lsp.analysis.settings import default_settings

G, S, D, N, U = Kind.GRAPH, Kind.GRAPH_SCALAR, Kind.DETACHED, Kind.NUMBER, Kind.UNKNOWN


def _context(source: str, path: str = "train.py") -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path=path)


class _ProbeFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.functions: list[cst.FunctionDef | None] = [None]
        self.found: list[tuple[cst.FunctionDef | None, cst.BaseExpression]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "probe":
            self.found.append((self.functions[-1], node.args[0].value))


def _probes(source: str) -> list[Kind]:
    context = _context(source)
    finder = _ProbeFinder()
    context.module.visit(finder)
    facts = facts_for(context)
    return [facts.flow(function).kind_of(expr) for function, expr in finder.found]


# --- where graphs come from ---------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch.nn as nn\nlayer = nn.Linear(4, 2)\nprobe(layer(x))\n", G),
        (
            "from torch import nn\nlstm = nn.LSTM(4, 8).cuda()\nout, state = lstm(x)\nprobe(out)\nprobe(state)\n",
            [G, G],
        ),
        (
            (
                "import torch.nn as nn\nclass Net(nn.Module):\n    pass\nclass Deeper(Net):\n    pass\n"
                "net2 = Deeper().to('cuda')\nprobe(net2(x))\n"
            ),
            G,
        ),
        (
            (
                "from transformers import AutoModelForCausalLM\nlm = AutoModelForCausalLM.from_pretrained('gpt2')\n"
                "probe(lm(**batch))\n"
            ),
            G,
        ),
        # Model-like names, when the file uses torch.
        ("import torch\nprobe(model(x))\nprobe(self_attention(x))\n", [G, U]),
        ("import torch\ndef f(encoder, x):\n    probe(encoder(x))\n    probe(encoder.forward(x))\n", [G, G]),
        ("import numpy\nprobe(model(x))\n", U),
        # A local def, a lambda, an import: not modules.
        ("import torch\ndef model(x):\n    return x\nprobe(model(x))\n", U),
        ("import torch\nmodel = lambda x: x\nprobe(model(x))\n", U),
        ("import torch\nfrom mylib import model\nprobe(model(x))\n", U),
        # Conflicting bindings: cannot tell.
        (
            "import torch\nimport torch.nn as nn\nnet = nn.Linear(2, 2)\nnet = nn.MSELoss()\nprobe(net(x))\n",
            U,
        ),
        (
            (
                "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
                "        self.rnn = nn.GRU(2, 2)\n    def forward(self, x):\n        probe(self.rnn(x))\n"
                "        probe(self(x))\n"
            ),
            [G, G],
        ),
        # `self` of a class that is not a module.
        ("import torch\nclass Trainer:\n    def step(self, x):\n        probe(self(x))\n", U),
    ],
)
def test_module_calls(source: str, expected: Kind | list[Kind]) -> None:
    assert _probes(source) == (expected if isinstance(expected, list) else [expected])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch.nn as nn\ncrit = nn.CrossEntropyLoss()\nprobe(crit(model(x), y))\n", S),
        (
            "import torch.nn as nn\ncrit = nn.CrossEntropyLoss(reduction='none')\nprobe(crit(model(x), y))\n",
            G,
        ),
        ("import torch.nn.functional as F\nprobe(F.mse_loss(model(x), y))\n", S),
        ("from torch.nn.functional import cross_entropy as ce\nprobe(ce(model(x), y))\n", S),
        ("import torch.nn.functional as F\nprobe(F.l1_loss(model(x), y, reduction='none'))\n", G),
        ("import torch.nn.functional as F\nprobe(F.mse_loss(input=model(x), target=y))\n", S),
        # A loss of detached values, or of values the analysis does not know.
        ("import torch.nn.functional as F\nprobe(F.mse_loss(model(x).detach(), y.detach()))\n", D),
        ("import torch.nn.functional as F\nprobe(F.mse_loss(pred, target))\n", U),
        ("import torch\nprobe(criterion(model(x), y))\nprobe(loss_fn(z, y))\n", [S, U]),
        (
            "import torch\nout = model(**batch)\nprobe(out.loss)\nprobe(out['loss'])\nprobe(out.logits)\n",
            [S, S, G],
        ),
    ],
)
def test_losses(source: str, expected: Kind | list[Kind]) -> None:
    assert _probes(source) == (expected if isinstance(expected, list) else [expected])


# --- how graphs propagate and end -------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("loss_a + 0.1 * loss_b", S),
        ("loss_a * out", G),
        ("-loss_a", S),
        ("loss_a / len(batch)", S),
        ("loss_a * x.size(0)", S),
        ("loss_a * x.shape[0]", S),
        ("out[0]", G),
        ("out.cpu()", G),
        ("out.to('cpu', non_blocking=True)", G),
        ("out.mean()", S),
        ("out.mean(dim=0)", G),
        ("out.softmax(-1).view(-1)", G),
        ("torch.stack([loss_a, loss_b])", G),
        ("[out, 1]", Kind.GRAPH_CONTAINER),
        ("{'loss': loss_a}", Kind.GRAPH_CONTAINER),
        ("out.detach()", D),
        ("out.detach().cpu()", D),
        ("out.data", D),
        ("out.shape", D),
        ("out.argmax(-1)", D),
        ("loss_a.item()", N),
        ("float(loss_a)", N),
        ("out.tolist()", D),
        ("out.cpu().numpy()", D),
        ("torch.zeros_like(out)", D),
        ("out > 0", D),
        ("loss_a if flag else loss_b", S),
        ("loss_a if flag else loss_a.item()", U),
    ],
)
def test_propagation(expression: str, expected: Kind) -> None:
    source = f"""
        import torch
        import torch.nn.functional as F
        out = model(x)
        loss_a = F.cross_entropy(out, y)
        loss_b = out.pow(2).mean()
        probe({expression})
    """
    assert _probes(source) == [expected]


def test_a_local_float_shadows_the_builtin() -> None:
    # Not a number: the file's own `float` returns what it is given, the model's output.
    assert _probes("import torch\ndef float(x):\n    return x\nprobe(float(model(x)))\n") == [G]


def test_a_helper_returns_what_it_computes_from_a_graph_attached_argument() -> None:
    source = """
        import torch
        import torch.nn.functional as F

        def vae_loss(recon_x, x, mu, logvar):
            recon = F.binary_cross_entropy(recon_x, x, reduction="sum")
            kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
            return recon + kld, recon, kld.item()

        def scale(value, factor):
            return value * factor

        out, mu, logvar = model(x)
        loss, recon, kld = vae_loss(out, x, mu, logvar)
        probe(recon)
        probe(kld)
        probe(scale(out, 2))
        probe(scale(1.0, 2))
        with torch.no_grad():
            probe(scale(out, 2))
    """
    assert _probes(source) == [S, N, G, U, U]


# --- grad-disabled regions ----------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nwith torch.no_grad():\n    probe(model(x))\n",
        "import torch as T\nwith T.inference_mode():\n    probe(model(x))\n",
        "from torch import no_grad\nwith no_grad(), open('f') as handle:\n    probe(model(x))\n",
        "import torch\nwith torch.set_grad_enabled(False):\n    probe(model(x))\n",
        "import torch\n@torch.no_grad()\ndef f(x):\n    probe(model(x))\n",
        "from torch import inference_mode\n@inference_mode()\ndef f(x):\n    probe(model(x) + 1)\n",
        "import torch\nout = model(x)\nwith torch.no_grad():\n    probe(out.cpu())\n",
    ],
)
def test_no_grad_regions_detach(source: str) -> None:
    assert _probes(source) == [D]


def test_enable_grad_inside_no_grad() -> None:
    source = "import torch\nwith torch.no_grad():\n    with torch.enable_grad():\n        probe(model(x))\n"
    assert _probes(source) == [G]


def test_values_made_before_no_grad_keep_their_graph() -> None:
    assert _probes("import torch\nout = model(x)\nwith torch.no_grad():\n    probe(out)\n") == [G]


# --- flow -----------------------------------------------------------------------


def test_statements_run_in_order() -> None:
    source = """
        import torch
        loss = criterion(model(x), y)
        probe(loss)
        loss = loss.item()
        probe(loss)
        del loss
        probe(loss)
    """
    assert _probes(source) == [S, N, U]


def test_branches_merge() -> None:
    source = """
        import torch
        out = model(x)
        if flag:
            value = out
        else:
            value = out.detach()
        probe(value)
        if flag:
            other = out
        probe(other)
        if flag:
            third = out.mean()
        elif other_flag:
            third = out.sum()
        else:
            third = out
        probe(third)
    """
    assert _probes(source) == [U, G, G]


def test_a_loop_carries_values_into_the_next_iteration() -> None:
    source = """
        import torch
        hidden = None
        for x in loader:
            probe(hidden)
            out, hidden = rnn(x, hidden)
        probe(hidden)
        state = model(x0)
        for x in loader:
            probe(state)
            state = model(x)
    """
    # `hidden` is None only before the first batch: from the second on it holds
    # the graph of the batch before (what OOM305 is about).
    assert _probes(source) == [G, G, G]


def test_a_loop_carries_a_graph() -> None:
    source = """
        import torch
        total = model(x0)
        for x in loader:
            probe(total)
            total = total + model(x)
        probe(total)
    """
    assert _probes(source) == [G, G]


def test_the_entries_of_a_graph_attached_container_are_graph_attached() -> None:
    source = """
        import torch
        loss_dict = model(images, targets)
        for name, value in loss_dict.items():
            probe(name)
            probe(value)
        for loss in loss_dict.values():
            probe(loss)
        for name in loss_dict:
            probe(name)
            total = loss_dict[name]
        for key, entry in config.items():
            probe(entry)
        with torch.no_grad():
            for name, value in loss_dict.items():
                probe(value)
    """
    assert _probes(source) == [U, G, G, U, U, U]


def test_a_list_is_what_was_appended_to_it() -> None:
    source = """
        import torch
        values, names, seen = [], [], []
        for x in loader:
            values.append(model(x))
            names.append(len(x))
            seen.append(lookup(x))
        probe(torch.stack(values))
        probe(values)
        probe(names)
        probe(seen)
        with torch.no_grad():
            kept = []
            kept.append(model(x))
        probe(kept)
    """
    assert _probes(source) == [G, Kind.GRAPH_CONTAINER, D, U, D]


def test_tuple_assignments_pair_up() -> None:
    source = (
        "import torch\na, b = model(x), 1\nprobe(a)\nprobe(b)\n(c, d), e = model(x)\nprobe(c)\nprobe(e)\n"
    )
    assert _probes(source) == [G, N, G, G]


def test_in_place_detach_and_walrus() -> None:
    source = """
        import torch
        hidden = model(x)
        hidden.detach_()
        probe(hidden)
        if (out := model(x)) is not None:
            probe(out)
    """
    assert _probes(source) == [D, G]


def test_attributes_of_self_are_tracked() -> None:
    source = """
        import torch
        class Trainer:
            def step(self, x):
                self.last = self.model(x)
                probe(self.last)
                self.last = self.last.detach()
                probe(self.last)
    """
    assert _probes(source) == [G, D]


def test_try_and_match() -> None:
    source = """
        import torch
        try:
            out = model(x)
        except RuntimeError:
            out = None
        probe(out)
        match mode:
            case "train":
                res = model(x)
            case _:
                res = model(x).detach()
        probe(res)
    """
    # `out` is None only where the forward pass failed: wherever it is a tensor, it holds the graph.
    assert _probes(source) == [G, U]


# --- lattice and helpers ----------------------------------------------------------


def test_merge() -> None:
    assert merge(S, S) is S
    assert merge(S, G) is G
    assert merge(D, N) is D
    assert merge(G, D) is U
    assert merge(U, G) is U


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model", Role.MODULE),
        ("teacher_model", Role.MODULE),
        ("netD", Role.MODULE),
        ("criterion", Role.CRITERION),
        ("loss_fct", Role.CRITERION),
        ("criterion_mse", Role.CRITERION),
        ("metric", Role.UNKNOWN),
        ("models", Role.UNKNOWN),
        # Functions that act on a model are not one (transformers' Trainer).
        ("_wrap_model", Role.UNKNOWN),
        ("get_model", Role.UNKNOWN),
        ("unwrap_model", Role.UNKNOWN),
    ],
)
def test_model_name_heuristic(name: str, role: Role) -> None:
    assert model_name_heuristic(name) is role


def test_scope_summary_follows_values_into_backward() -> None:
    context = _context(
        """
        import torch
        def step(losses, extra):
            total = sum(losses)
            scaled = total / 4
            scaler.scale(scaled).backward()
            log = extra
            return log
        """
    )
    function = context.module.body[1]
    summary = facts_for(context).summary(function)
    assert {"scaled", "total", "losses", "scaler"} <= summary.feeds_backward
    assert "extra" not in summary.feeds_backward
    assert summary.returned == {"log", "extra"}
    assert len(summary.backward_calls) == 1


def test_rebinds_every_iteration_ignores_conditional_resets() -> None:
    loop = cst.parse_statement(
        "for x in y:\n    if i % 10 == 0:\n        total = 0\n    total += loss\n    acc = []\n"
    )
    assert isinstance(loop, cst.For)
    assert not rebinds_every_iteration(loop.body, "total")
    assert rebinds_every_iteration(loop.body, "acc")
    assert rebinds_every_iteration(loop.body, "acc.items")


def test_the_facts_cache_does_not_keep_files_alive() -> None:
    context = _context("import torch\nfor x in loader:\n    total += model(x)\n")
    facts_for(context).flow(None)
    assert context in dataflow._FACTS
    alive = weakref.ref(context)
    del context
    gc.collect()
    assert alive() is None


def test_the_module_wrapped_by_ddp_is_a_module() -> None:
    assert _probes(
        "import torch\ndef f(model, x):\n    probe(model.module(x))\n    probe(solver.module(x))\n"
    ) == [G, U]


# --- evidence from backward calls ----------------------------------------------

C = Kind.GRAPH_CONTAINER


@pytest.mark.parametrize(
    ("backward", "expected"),
    [
        ("loss.backward()", S),
        ("loss.backward(retain_graph=True)", S),
        ("loss.backward(torch.ones_like(loss))", G),
        ("(loss / accumulation).backward()", S),
        ("scaler.scale(loss).backward()", S),
        ("accelerator.backward(loss)", S),
        ("self.manual_backward(loss)", S),
        ("torch.autograd.backward(loss)", S),
        ("torch.autograd.grad(loss, params)", S),
        ("print(loss)", U),
    ],
)
def test_a_backward_call_proves_its_tensor_graph_attached(backward: str, expected: Kind) -> None:
    source = f"""
        import torch
        def step(crit, x, y, params):
            loss = crit(x, y)
            {backward}
            probe(loss)
    """
    assert _probes(source) == [expected]


def test_a_backward_call_later_in_the_block_proves_the_binding() -> None:
    source = """
        import torch
        def step(crit, x, y, total):
            loss = crit(x, y)
            probe(loss)
            total += loss
            loss.backward()
            other = crit(x, y)
            probe(other)
            other = other.item()
            other.backward()
    """
    assert _probes(source) == [S, U]


def test_evidence_under_no_grad_proves_nothing() -> None:
    source = """
        import torch
        def step(crit, x, y):
            with torch.no_grad():
                loss = crit(x, y)
                loss.backward()
                probe(loss)
    """
    assert _probes(source) == [U]


def test_a_container_holding_a_backpropagated_loss() -> None:
    source = """
        import torch
        def step(module, batch):
            output = module.training_step(batch)
            output["loss"].backward()
            probe(output)
            probe(output["loss"])
            output["loss"] = output["loss"].detach()
            probe(output)
            output = module.training_step(batch)
            probe(output)
    """
    assert _probes(source) == [C, S, U, U]


def test_inline_criterion_and_return_kinds_of_the_file() -> None:
    source = """
        import torch
        import torch.nn as nn

        def forward_loss(model, x, y):
            return nn.CrossEntropyLoss()(model(x), y)

        def detached_loss(model, x, y):
            return forward_loss(model, x, y).detach()

        def recursive(model, x):
            return recursive(model, x)

        def generator(model, xs):
            for x in xs:
                yield model(x)

        class Runner:
            def step(self, x, y):
                return forward_loss(self.model, x, y)

            def run(self, x, y):
                probe(self.step(x, y))
                with torch.no_grad():
                    probe(self.step(x, y))

        probe(forward_loss(net, x, y))
        probe(detached_loss(net, x, y))
        probe(recursive(net, x))
        probe(generator(net, xs))
    """
    assert _probes(source) == [S, D, S, D, U, U]


def test_methods_of_an_instance_of_a_class_of_the_file() -> None:
    source = """
        import torch
        class Base:
            def score(self, model, x):
                return model(x).mean()

        class Scorer(Base):
            pass

        scorer = Scorer()
        probe(scorer.score(net, x))
    """
    assert _probes(source) == [S]


def test_a_project_decorator_named_for_no_grad() -> None:
    source = """
        import torch
        from utils import smart_inference_mode

        @smart_inference_mode()
        def run(model, x):
            probe(model(x))

        def enabled(model, x):
            with torch.inference_mode(False):
                probe(model(x))
    """
    assert _probes(source) == [D, G]


def test_who_calls_a_function() -> None:
    source = """
        import torch
        def under_no_grad(model, x):
            return model(x)

        def callback(model, x):
            return model(x)

        def with_grad(model, x):
            return model(x)

        def unused(model, x):
            return model(x)

        def main(model, x, run):
            with torch.no_grad():
                under_no_grad(model, x)
            run(callback)
            with_grad(model, x)
    """
    context = _context(source)
    facts = facts_for(context)
    functions = {function.name.value: function for function in facts.functions()}
    answers = {name: facts.runs_without_grad_for_its_callers(function) for name, function in functions.items()}
    assert answers == {
        "under_no_grad": True,
        "callback": None,
        "with_grad": False,
        "unused": False,
        "main": False,
    }


WHO_CALLS = """
    import torch

    def helper(model, x):
        return model(x)

    class Runner:
        def predict(self, x):
            return self.model(x)

        def run(self, x):
            try:
                pass
            except ValueError:
                def inner(model, x):
                    return helper(model, x)
            else:
                with torch.no_grad():
                    return self.predict(x)
            finally:
                pass

    def main(model, x):
        match x:
            case 1:
                def nested(y):
                    return helper(model, y)
            case _:
                pass
        f = lambda y: helper(model, y)
        return nested(x), f
"""


def _every_source() -> list[tuple[str, str]]:
    from pathlib import Path

    import oom_lsp

    root = Path(__file__).resolve().parents[2]
    paths = sorted((root / "fixtures").rglob("*.py")) + sorted(Path(oom_lsp.__file__).parent.rglob("*.py"))
    return [("who_calls", textwrap.dedent(WHO_CALLS))] + [(str(path.name), path.read_text()) for path in paths]


@pytest.mark.parametrize(("name", "source"), _every_source(), ids=lambda value: value if len(value) < 60 else "")
def test_callers_are_looked_for_only_where_the_name_is_written(
    name: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who calls a function, searched in the scopes whose lines hold its name,
    is what a search of every scope finds; the stdlib tree's functions are
    libcst's, in the same order."""
    context = _context(source, path=name)  # the facts hold it weakly
    facts = facts_for(context)
    assert facts._function_spans() is not None
    narrowed = [facts.runs_without_grad_for_its_callers(function) for function in facts.functions()]
    monkeypatch.setattr(dataflow.FileFacts, "_scopes_whose_lines_mention", lambda self, name, scopes: scopes)
    context = _context(source, path=name)
    every_scope = facts_for(context)
    assert [every_scope.runs_without_grad_for_its_callers(function) for function in every_scope.functions()] == narrowed
