"""OOM501 torch-load-without-map-location, beyond its examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Finding


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source



_CUDA = "import torch\nmodel = Net().cuda()\n"


@pytest.mark.parametrize(
    ("load", "fixed"),
    [
        (
            "model.load_state_dict(torch.load(path))",
            'model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))',
        ),
        (
            "sd = torch.load(path)\nmodel.load_state_dict(sd, strict=False)",
            'sd = torch.load(path, map_location="cpu", weights_only=True)\n'
            "model.load_state_dict(sd, strict=False)",
        ),
        (
            "model.load_state_dict(torch.load(path)['model'])",
            "model.load_state_dict(torch.load(path, map_location=\"cpu\")['model'])",
        ),
        (
            "sd = torch.load(path)\nprint(len(sd))\nmodel.load_state_dict(sd)",
            'sd = torch.load(path, map_location="cpu")\nprint(len(sd))\nmodel.load_state_dict(sd)',
        ),
        (
            "model.load_state_dict(torch.load(path, weights_only=False))",
            'model.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"))',
        ),
        (
            "model.load_state_dict(torch.load(path, pickle_module=dill))",
            'model.load_state_dict(torch.load(path, pickle_module=dill, map_location="cpu"))',
        ),
        (
            "set_peft_model_state_dict(model, torch.load(path))",
            'set_peft_model_state_dict(model, torch.load(path, map_location="cpu", weights_only=True))',
        ),
        (
            "ckpt = torch.load(path)\nnew = {}\nfor k, v in ckpt.items():\n    new[k[7:]] = v\n"
            "optimizer.load_state_dict(new)",
            'ckpt = torch.load(path, map_location="cpu")\nnew = {}\n'
            "for k, v in ckpt.items():\n    new[k[7:]] = v\noptimizer.load_state_dict(new)",
        ),
    ],
    ids=[
        "direct",
        "through-a-name",
        "item",
        "read-elsewhere",
        "weights-only-kept",
        "pickle-module",
        "function-sink",
        "renamed-keys",
    ],
)
def test_state_loads_are_fixed(load: str, fixed: str) -> None:
    assert _fixed(_CUDA + load + "\n", "OOM501") == _CUDA + fixed + "\n"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import torch\nmodel = Net()\nmodel.load_state_dict(torch.load(path))\n", "no CUDA in the file"),
        (_CUDA + "scheduler.load_state_dict(torch.load(path))\n", "a scheduler's state is numbers"),
        (_CUDA + "self.lr_sched.load_state_dict(torch.load(path))\n", "a scheduler's state is numbers"),
        (_CUDA + "train_sampler.load_state_dict(torch.load(path))\n", "a sampler's state is on the CPU"),
        (_CUDA + "feats = torch.load(path)\nknn(feats)\n", "not a model's state"),
        (_CUDA + "def load(path):\n    return torch.load(path)\n", "where it goes is not known here"),
        (
            _CUDA
            + "torch.save(model.state_dict(), 'w.pt')\ntorch.save(x.cpu(), 'x.pt')\nx = torch.load('x.pt')\n",
            "the file saved that path from the CPU",
        ),
        (
            _CUDA
            + "model.to('cpu')\ntorch.save(model.state_dict(), p)\nmodel.load_state_dict(torch.load(q))\n",
            "every checkpoint of the file is saved from the CPU",
        ),
        (
            _CUDA + "torch.save({'w': model.state_dict(), 'n': n}, CKPT)\nstats = torch.load(STATS)\n",
            "the saved state went to another path",
        ),
        (
            _CUDA + "sd = torch.load(path)\ndef later():\n    model.load_state_dict(sd)\n",
            "a function defined later is not followed",
        ),
    ],
)
def test_torch_load_not_reported(source: str, why: str) -> None:
    assert _findings(source, "OOM501") == [], why


@pytest.mark.parametrize(
    "gpu",
    [
        "model.cuda()",
        "model.to('cuda:0')",
        "torch.cuda.set_device(rank)",
        "model.to(torch.accelerator.current_accelerator())",
    ],
)
def test_gpu_use_is_recognised(gpu: str) -> None:
    source = f"import torch\n{gpu}\nmodel.load_state_dict(torch.load(path))\n"
    assert [finding.line for finding in _findings(source, "OOM501")] == [3]


def test_a_model_moved_back_to_the_gpu_before_saving_is_reported() -> None:
    source = (
        _CUDA + "model.cpu()\nmodel.cuda()\ntorch.save(model.state_dict(), p)\n"
        "model.load_state_dict(torch.load(p))\n"
    )
    assert [finding.line for finding in _findings(source, "OOM501")] == [6]


def test_weights_only_fix_loads_the_same_state_dict(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "net.pt"
    source = (
        "import torch\n"
        "if torch.cuda.is_available():\n    torch.cuda.synchronize()\n"
        "net = torch.nn.Linear(3, 2)\n"
        f"net.load_state_dict(torch.load({str(path)!r}))\n"
    )
    fixed = _fixed(source, "OOM501")
    assert "weights_only=True" in fixed
    torch.save(torch.nn.Linear(3, 2).state_dict(), path)
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    for name, value in before["net"].state_dict().items():
        assert torch.equal(value, after["net"].state_dict()[name])


@pytest.mark.parametrize(
    "location",
    ['"cuda"', '"cuda:1"', 'torch.device("cuda", 0)', "device", "self.device", "args.device"],
)
def test_a_map_location_naming_the_gpu_is_a_second_copy_beside_the_model(location: str) -> None:
    source = _CUDA + f"model.load_state_dict(torch.load(path, map_location={location}))\n"
    (finding,) = _findings(source, "OOM501")
    assert finding.line == 3 and f"map_location={location}" in finding.message
    assert "on the GPU beside the model" in finding.message
    assert _fixed(source, "OOM501") == _CUDA + 'model.load_state_dict(torch.load(path, map_location="cpu"))\n'


@pytest.mark.parametrize(
    "source",
    [
        # the CPU, or a device the file sets to the CPU
        _CUDA + 'model.load_state_dict(torch.load(path, map_location="cpu"))\n',
        _CUDA + 'device = "cpu"\nmodel.load_state_dict(torch.load(path, map_location=device))\n',
        # not copied into a model: the GPU is where the tensors are used
        _CUDA + 'embeddings = torch.load(path, map_location="cuda")\nscores = embeddings @ q\n',
        # no CUDA in the file: `device` is not known to be a GPU
        'import torch\nmodel.load_state_dict(torch.load(path, map_location=device))\n',
    ],
)
def test_a_map_location_not_known_to_be_the_gpu_or_a_load_not_copied_into_a_model_is_silent(source: str) -> None:
    assert _findings(source, "OOM501") == []


def test_a_checkpoint_dict_loaded_onto_the_gpu_is_reported_without_a_fix() -> None:
    source = _CUDA + 'ckpt = torch.load(path, map_location="cuda")\nmodel.load_state_dict(ckpt["model"])\nanchors = ckpt["anchors"]\n'
    (finding,) = _findings(source, "OOM501")
    assert finding.fix is None
    assert _fixed(source, "OOM501") == source


def test_a_long_gpu_map_location_is_not_copied_into_the_message() -> None:
    source = _CUDA + 'model.load_state_dict(torch.load(path, map_location=torch.device(\n    "cuda", args.local_rank_of_this_process)))\n'
    (finding,) = _findings(source, "OOM501")
    assert finding.message.startswith("torch.load builds the checkpoint on the GPU") and "\n" not in finding.message


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        # read for one field, then only handed to other calls: not copied into a model
        (_CUDA + 'run_id = torch.load(w, map_location=device).get("run")\nlog = Logger(run_id)\nnc = log.classes\n'
         'net = Model(nc).to(device)\nstate = intersect(pretrained, net.state_dict())\nnet.load_state_dict(state)\n', False),
        # a method chain and a key renaming from the checkpoint into load_state_dict
        (_CUDA + 'ckpt = torch.load(w, map_location=device)\nstate = ckpt["model"].float().state_dict()\n'
         'state = {k.removeprefix("module."): v for k, v in state.items()}\nmodel.load_state_dict(state)\n', True),
    ],
)
def test_a_gpu_map_location_counts_only_a_checkpoint_that_is_itself_copied_into_a_model(source: str, reported: bool) -> None:
    assert bool(_findings(source, "OOM501")) is reported


_RESUME = """
    import timm
    import torch

    def main():
        model = timm.create_model("vit_huge_patch14_224").cuda()
        optimizer = {optimizer}
        checkpoint = torch.load("last.pt")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
"""


@pytest.mark.parametrize(
    ("optimizer", "stake", "by_default"),
    [
        # Adam's two moments restored from the same checkpoint: three copies of the weights.
        ("torch.optim.AdamW(model.parameters(), lr=1e-4)", "≈ 7.0 GiB of weights and optimizer state", True),
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", "≈ 4.7 GiB of weights and optimizer state", True),
        # Plain SGD keeps nothing per parameter: the weights alone, under the default level's 4 GiB.
        ("torch.optim.SGD(model.parameters(), lr=0.1)", "≈ 2.3 GiB of weights (", False),
    ],
)
def test_the_stake_counts_the_optimizer_state_the_checkpoint_restores(optimizer: str, stake: str, by_default: bool) -> None:
    source = textwrap.dedent(_RESUME.format(optimizer=optimizer))
    [finding] = _findings(source, "OOM501")
    assert stake in finding.message
    shown = analyze(source, LintSettings(enabled=frozenset({"OOM501"})))
    assert bool(shown) is by_default
