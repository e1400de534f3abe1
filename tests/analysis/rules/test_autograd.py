"""OOM301..OOM305 (autograd graphs kept alive), beyond their examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Applicability, Finding


def _findings(source: str, code: str, path: str = "train.py") -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code})), path)


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code})), unsafe=True).source


def _lines(source: str, code: str, path: str = "train.py") -> list[int]:
    return [finding.line for finding in _findings(source, code, path)]


# --- OOM301 loss-accumulated-with-graph ------------------------------------------

TRAIN_LOOP = """
import torch
import torch.nn.functional as F
def train(model, loader, opt):
    total = 0.0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total += loss
    {after}
"""


@pytest.mark.parametrize(
    ("after", "method"),
    [
        ('print(f"{total / len(loader):.3f}")', "item"),
        ("writer.add_scalar('loss', total, 0)", "item"),
        ("return total / len(loader)", "detach"),
        ("history.append(total)", "detach"),
        ("print(total.item())", "detach"),
        ("avg = total / len(loader)", "detach"),
    ],
)
def test_item_only_when_every_use_takes_a_float(after: str, method: str) -> None:
    source = TRAIN_LOOP.format(after=after)
    [finding] = _findings(source, "OOM301")
    assert finding.fix is not None and finding.fix.applicability is Applicability.SAFE
    assert f"total += loss.{method}()" in _fixed(source, "OOM301")
    assert "`total`" in finding.message


def test_a_periodic_reset_does_not_end_the_accumulation() -> None:
    source = """
        import torch
        total_loss = 0.0
        for batch, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            total_loss += loss
            if batch % 200 == 0:
                print(total_loss / 200)
                total_loss = 0
    """
    assert _lines(source, "OOM301") == [7]


@pytest.mark.parametrize(
    ("statement", "reported"),
    [
        ("total = total + loss", True),
        ("total = loss + total", True),
        ("total = total - loss", True),
        ("total = loss - total", False),
        ("total -= loss", True),
        ("total *= loss", False),
        ("stats['loss'] += loss", True),
        ("total = other + loss", False),
    ],
)
def test_accumulation_forms(statement: str, reported: bool) -> None:
    source = f"import torch\ntotal = 0\nstats = {{}}\nfor x, y in loader:\n    loss = criterion(model(x), y)\n    {statement}\n"
    assert bool(_findings(source, "OOM301")) is reported


def test_lightning_training_step_accumulates_across_batches() -> None:
    source = """
        import lightning as L
        import torch.nn.functional as F
        class Lit(L.LightningModule):
            def training_step(self, batch, batch_idx):
                loss = F.cross_entropy(self.model(batch["x"]), batch["y"])
                self.epoch_loss += loss
                local = 0
                local += loss
                return loss
    """
    assert _lines(source, "OOM301") == [7]


@pytest.mark.parametrize(
    "source",
    [
        # Under no_grad the sum records nothing.
        (
            "import torch\ntotal = 0\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    with torch.no_grad():\n        total += loss\n"
        ),
        # A loss summed on purpose and backpropagated after the loop.
        "import torch\ntotal = 0\nfor x, y in chunks:\n    total += criterion(model(x), y)\ntotal.backward()\n",
        (
            "import torch\ntotal = 0\nfor x, y in chunks:\n    total = total + criterion(model(x), y)\n"
            "accelerator.backward(total / 4)\n"
        ),
        # The loop variable is not known to be a loss.
        "import torch\ntotal = 0\nfor loss in losses:\n    total += loss\n",
        # Accumulated inside a nested function defined in the loop: not this loop's business.
        (
            "import torch\ntotal = 0\nfor x, y in loader:\n    def step():\n        global total\n"
            "        total += criterion(model(x), y)\n"
        ),
    ],
)
def test_loss_accumulation_not_reported(source: str) -> None:
    assert _findings(source, "OOM301") == []


# --- OOM302 tensor-kept-across-iterations -----------------------------------------


@pytest.mark.parametrize(
    ("stored", "fixed"),
    [
        ("out", "out.detach()"),
        ("out.cpu()", "out.detach().cpu()"),
        ("out.to('cpu')", "out.detach().to('cpu')"),
        ("out.float().cpu()", "out.float().detach().cpu()"),
        ("out * 2", "(out * 2).detach()"),
        ("(out + 1)", "((out + 1).detach())"),
        ("[out, y]", "[out.detach(), y]"),
        ("(out.cpu(), loss)", "(out.detach().cpu(), loss.detach())"),
        ("{'out': out, 'n': 1}", "{'out': out.detach(), 'n': 1}"),
    ],
)
def test_detach_is_inserted_where_the_graph_is(stored: str, fixed: str) -> None:
    source = (
        "import torch\nkept = []\nfor x, y in loader:\n    out = model(x)\n    loss = criterion(out, y)\n"
        f"    kept.append({stored})\n"
    )
    [finding] = _findings(source, "OOM302")
    assert finding.line == 6 and finding.fix is not None
    assert f"    kept.append({fixed})\n" in _fixed(source, "OOM302")


@pytest.mark.parametrize(
    ("binding", "reported"),
    [
        ("kept = []", True),
        ("kept = list()", True),
        ("kept = collections.deque(maxlen=100)", True),
        ("kept = defaultdict(list)", True),
        ("kept = {}", True),
        ("kept = make_buffer()", False),
        ("kept = []\nkept = make_buffer()", False),
    ],
)
def test_only_lists_and_dicts_are_containers(binding: str, reported: bool) -> None:
    source = f"import torch\nimport collections\n{binding}\nfor x in loader:\n    kept.append(model(x))\n"
    assert bool(_findings(source, "OOM302")) is reported


def test_a_container_reset_inside_an_if_still_outlives_iterations() -> None:
    source = (
        "import torch\nbuffer = []\nfor i, x in enumerate(loader):\n    if i % 10 == 0:\n        buffer = []\n"
        "    buffer.append(model(x))\n"
    )
    assert _lines(source, "OOM302") == [6]


def test_self_containers_need_a_container_binding_in_the_class() -> None:
    source = """
        import torch
        class Evaluator:
            def __init__(self):
                self.preds = []
            def run(self, loader):
                for x in loader:
                    self.preds.append(self.model(x))
                    self.other.append(self.model(x))
    """
    assert _lines(source, "OOM302") == [8]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nkept = []\nfor x in loader:\n    kept.append(*model(x))\n",
        "import torch\nkept = []\nfor x in loader:\n    kept.append(model(x).item())\n",
        "import torch\nkept = []\n@torch.no_grad()\ndef f():\n    for x in loader:\n        kept.append(model(x))\n",
        # validation_step runs under no_grad in Lightning, and is no loop.
        (
            "import lightning as L\nclass Lit(L.LightningModule):\n    def __init__(self):\n        self.outs = []\n"
            "    def validation_step(self, batch, i):\n        self.outs.append(self.model(batch))\n"
        ),
    ],
)
def test_storing_not_reported(source: str) -> None:
    assert _findings(source, "OOM302") == []


# --- OOM303 eval-without-no-grad ---------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "decorator", "added_import"),
    [
        ("import torch", "@torch.inference_mode()", False),
        ("import torch as T", "@T.inference_mode()", False),
        ("from torch import inference_mode, nn", "@inference_mode()", False),
        ("import torch.nn as nn", "@torch.inference_mode()", True),
    ],
)
def test_the_decorator_respects_the_files_imports(imports: str, decorator: str, added_import: bool) -> None:
    source = f"{imports}\n\ndef predict(model, x):\n    return model(x)\n"
    [finding] = _findings(source, "OOM303")
    assert finding.line == 4 and finding.fix is not None and finding.fix.applicability is Applicability.SAFE
    fixed = _fixed(source, "OOM303")
    assert f"{decorator}\ndef predict(model, x):" in fixed
    assert ("\nimport torch\n" in fixed) is added_import


def test_the_mnist_test_function_is_evaluation_code() -> None:
    source = """
        import torch
        import torch.nn.functional as F
        def test(model, device, test_loader):
            model.eval()
            test_loss = 0
            for data, target in test_loader:
                output = model(data.to(device))
                test_loss += F.nll_loss(output, target.to(device), reduction="sum").item()
            return test_loss
    """
    assert _lines(source, "OOM303") == [8]
    assert "@torch.inference_mode()\ndef test(model, device, test_loader):" in _fixed(source, "OOM303")


@pytest.mark.parametrize(
    ("source", "path"),
    [
        (
            "import torch\ndef test_forward(model):\n    assert model(x).shape == (1,)\n",
            "tests/test_model.py",
        ),
        ("import torch\ndef test_forward(model):\n    assert model(x).shape == (1,)\n", "model_test.py"),
        (
            (
                "import torch\nimport unittest\nclass TestNet(unittest.TestCase):\n    def test_forward(self, model=None):\n"
                "        model(x)\n"
            ),
            "checks.py",
        ),
        (
            "import torch\ndef evaluate(model, x):\n    return [f(x) for f in (lambda t: model(t),)]\n",
            "train.py",
        ),
        ("import torch\ndef evaluate(model, x):\n    return model.generate(x)\n", "train.py"),
        ("import torch\ndef eval_step(model, x):\n    return model(x)\n", "train.py"),
        (
            "import torch\ndef run(model, x):\n    model.eval()\n    return criterion(model.logits, x)\n",
            "train.py",
        ),
        # eval() in one function does not carry into another.
        (
            "import torch\ndef a(model):\n    model.eval()\ndef b(model, x):\n    return model(x)\n",
            "train.py",
        ),
        (
            "import torch\ndef run(model, x):\n    model.eval()\n    model.train(True)\n    return model(x)\n",
            "train.py",
        ),
        (
            "import torch\ndef run(model, x, mode):\n    model.eval()\n    model.train(mode)\n    return model(x)\n",
            "train.py",
        ),
    ],
)
def test_eval_not_reported(source: str, path: str) -> None:
    assert _findings(source, "OOM303", path) == []


def test_train_false_is_eval_mode() -> None:
    source = "import torch\ndef run(net, x):\n    net.train(False)\n    return net(x)\n"
    assert _lines(source, "OOM303") == [4]


def test_a_loop_that_switches_modes_is_not_wrapped() -> None:
    source = """
        import torch
        for epoch in range(3):
            model.train()
            model.eval()
            out = model(x)  # check
    """
    assert _fixed(source, "OOM303") == textwrap.dedent(
        """
        import torch
        for epoch in range(3):
            model.train()
            model.eval()
            with torch.inference_mode():
                out = model(x)  # check
        """
    )


def test_a_wrapped_loop_keeps_its_multiline_strings_and_comments() -> None:
    source = '''
        import torch
        def main(model, loader):
            train(model)
            model.eval()
            for x in loader:
                out = model(x)
                report = """
        a table
        """
                # trailing comment of the block
            done()
    '''
    assert _fixed(source, "OOM303") == textwrap.dedent(
        '''
        import torch
        def main(model, loader):
            train(model)
            model.eval()
            with torch.inference_mode():
                for x in loader:
                    out = model(x)
                    report = """
        a table
        """
                # trailing comment of the block
            done()
        '''
    )


# --- OOM304 retain-graph-in-loop -----------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "loss.backward(None, True)",
        "torch.autograd.backward(loss, None, True)",
        "torch.autograd.backward([loss], retain_graph=True)",
        "scaler.scale(loss).backward(retain_graph=True)",
    ],
)
def test_retain_graph_spellings(call: str) -> None:
    source = f"import torch\nfor x in loader:\n    loss = model(x).sum()\n    {call}\n    opt.step()\n"
    [finding] = _findings(source, "OOM304")
    assert finding.line == 4
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE


@pytest.mark.parametrize(
    "call",
    [
        "loss.backward(retain_graph=True, **options)",
        "loss.backward(retain_graph=True, create_graph=True)",
        "accelerator.backward(loss, None, True)",
        "loss.backward(gradient=None, retain_graph=False)",
    ],
)
def test_retain_graph_not_reported(call: str) -> None:
    source = f"import torch\nfor x in loader:\n    loss = model(x).sum()\n    {call}\n    opt.step()\n"
    assert _findings(source, "OOM304") == []


def test_a_second_backward_through_the_graph_gets_no_drop_fix() -> None:
    source = """
        import torch
        for x in loader:
            loss_a, loss_b = heads(model(x))
            loss_a.backward(retain_graph=True)
            log(loss_a)
            loss_b.backward()
            opt.step()
    """
    [finding] = _findings(source, "OOM304")
    assert finding.fix is None
    assert "Sum the losses" in finding.message


# --- OOM305 hidden-state-carried-across-batches ---------------------------------------


@pytest.mark.parametrize(
    ("constructor", "line"),
    [
        ("nn.GRU(4, 8)", "hidden = hidden.detach()"),
        ("nn.RNN(4, 8)", "hidden = hidden.detach()"),
        ("nn.LSTM(4, 8)", "hidden = tuple(h.detach() for h in hidden)"),
        (
            "build()",
            "hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()",
        ),
    ],
)
def test_the_detach_fits_the_module(constructor: str, line: str) -> None:
    source = (
        f"import torch.nn as nn\nrnn = {constructor}\nhidden = init()\nfor x in loader:\n"
        "    out, hidden = rnn(x, hidden)\n    out.sum().backward()\n"
    )
    assert _lines(source, "OOM305") == [5]
    assert f"for x in loader:\n    {line}\n    out, hidden = rnn(x, hidden)" in _fixed(source, "OOM305")


def test_a_model_class_with_one_kind_of_recurrent_layer() -> None:
    source = """
        import torch.nn as nn
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.GRU(4, 8)
        lm = LM()
        hidden = None
        for x in loader:
            out, hidden = lm(x, hidden)
            out.sum().backward()
    """
    assert "    if hidden is not None:\n        hidden = hidden.detach()\n    out, hidden" in _fixed(
        source, "OOM305"
    )


def test_a_state_defaulting_to_none_is_guarded() -> None:
    source = """
        import torch
        def fit(model, loader, state=None):
            for x in loader:
                out, state = model(x, state)
                out.sum().backward()
    """
    assert "        if state is not None:\n" in _fixed(source, "OOM305")


def test_a_one_line_loop_body_is_reported_without_a_fix() -> None:
    source = (
        "import torch\nhidden = init()\nwhile True: out, hidden = model(x, hidden); out.sum().backward()\n"
    )
    [finding] = _findings(source, "OOM305")
    assert finding.fix is None
    assert "`hidden`" in finding.message


@pytest.mark.parametrize(
    "source",
    [
        # The state is not fed back.
        "import torch\nfor x in loader:\n    out, hidden = model(x)\n    out.sum().backward()\n",
        "import torch\nfor x in loader:\n    out, hidden = model(x, other)\n    out.sum().backward()\n",
        # Detached in the loop, even conditionally.
        (
            "import torch\nfor x in loader:\n    if hidden is not None:\n        hidden = hidden.detach()\n"
            "    out, hidden = model(x, hidden)\n    out.sum().backward()\n"
        ),
        # A nested time-step loop inside a training loop.
        (
            "import torch\nfor x in loader:\n    h = None\n    for t in x:\n        out, h = model(t, h)\n"
            "    out.sum().backward()\n"
        ),
    ],
)
def test_hidden_state_not_reported(source: str) -> None:
    assert _findings(source, "OOM305") == []


# --- false positives found on torch's own sources ---------------------------------------


@pytest.mark.parametrize(
    ("source", "code"),
    [
        # z3's `solver.model()` is no forward pass.
        ("import torch\ndef validate(solver):\n    return solver.model()\n", "OOM303"),
        # Rebinding forgets the eval mode: a frozen TorchScript warm-up.
        (
            "import torch\ndef compile_it(f, inps):\n    f = torch.jit.freeze(f.eval())\n    f(*inps)\n",
            "OOM303",
        ),
        # An unrolled forward pass keeps its outputs on purpose.
        (
            (
                "import torch\nimport torch.nn as nn\nclass Seq(nn.Module):\n    def forward(self, x, hidden=None):\n"
                "        result = []\n        for step in x:\n            hidden = self.cell(step, hidden)\n"
                "            result.append(hidden[0])\n        return torch.stack(result)\n"
            ),
            "OOM302",
        ),
        # What the function returns, through an assignment, is kept on purpose.
        (
            (
                "import torch\ndef heads(model, x):\n    outs = []\n    for head in range(3):\n"
                "        outs.append(model(x))\n    stacked = torch.stack(outs)\n    return stacked\n"
            ),
            "OOM302",
        ),
    ],
)
def test_torch_sources_false_positives(source: str, code: str) -> None:
    assert _findings(source, code) == []


def test_a_model_rebound_to_itself_keeps_its_mode() -> None:
    source = "import torch\ndef run(model, x):\n    model = model.eval().to('cuda')\n    return model(x)\n"
    assert _lines(source, "OOM303") == [4]


def test_eval_code_in_test_files_is_not_reported() -> None:
    source = "import torch\ndef check(model, x):\n    model.eval()\n    return model(x)\n"
    assert _lines(source, "OOM303", "train.py") == [4]
    assert _lines(source, "OOM303", "pkg/distributed_test.py") == []


@pytest.mark.parametrize(
    "context",
    ["torch.set_grad_enabled(train)", "torch.no_grad() if not train else contextlib.nullcontext()"],
)
def test_a_grad_mode_that_depends_on_a_value_is_not_judged(context: str) -> None:
    source = (
        "import torch\nimport contextlib\ndef evaluate_or_train(model, loader, train):\n    total = 0\n"
        f"    for x, y in loader:\n        with {context}:\n            loss = criterion(model(x), y)\n"
        "            total += loss\n"
    )
    for code in ("OOM301", "OOM303"):
        assert _findings(source, code) == []


def test_an_async_evaluation_function_is_reported_without_a_fix() -> None:
    [finding] = _findings("import torch\nasync def predict(model, x):\n    return model(x)\n", "OOM303")
    assert finding.fix is None


def test_an_evaluation_function_that_enables_grad_is_not_reported() -> None:
    assert (
        _findings(
            "import torch\n@torch.enable_grad()\ndef evaluate(model, x):\n    return model(x)\n", "OOM303"
        )
        == []
    )


def test_an_explicit_forward_call_is_a_forward_pass() -> None:
    source = "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def predict(self, x):\n        self.eval()\n        return self.forward(x)\n"
    assert _lines(source, "OOM303") == [6]


def test_a_model_wrapping_helper_is_not_an_evaluation_forward() -> None:
    # Seen on transformers' Trainer.evaluation_loop: `self._wrap_model(...)`
    # returns a model; it is not a forward pass.
    source = (
        "import torch\n"
        "class Trainer:\n"
        "    def evaluation_loop(self, loader):\n"
        "        model = self._wrap_model(self.model, training=False)\n"
        "        model.eval()\n"
        "        return model\n"
    )
    from oom_lsp.analysis import LintSettings, analyze

    assert [f.code for f in analyze(source, LintSettings(enabled=frozenset({"OOM303"})))] == []


def test_set_grad_enabled_as_a_statement_turns_gradients_off_for_what_follows() -> None:
    # Seen in real validation loops: the statement form, not the `with` form.
    from oom_lsp.analysis import LintSettings, analyze

    source = (
        "import torch\n"
        "def validate(model, loader):\n"
        "    torch.set_grad_enabled(False)\n"
        "    total = 0.0\n"
        "    for x, y in loader:\n"
        "        out = model(x)\n"
        "        total += out.sum()\n"
        "    torch.set_grad_enabled(True)\n"
        "    return total\n"
    )
    enabled = frozenset({"OOM301", "OOM303"})
    assert analyze(source, LintSettings(enabled=enabled)) == []
    # Turned back on before the forward: the evaluation forward is reported again.
    switched_back = source.replace(
        "    total = 0.0\n", "    torch.set_grad_enabled(True)\n    total = 0.0\n"
    )
    assert "OOM303" in [f.code for f in analyze(switched_back, LintSettings(enabled=enabled))]
