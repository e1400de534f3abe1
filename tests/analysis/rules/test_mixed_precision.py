"""OOM201 no-mixed-precision, beyond its examples."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.context import FileContext

OOM201 = LintSettings(enabled=frozenset({"OOM201"}), strict=True)
OOM202 = LintSettings(enabled=frozenset({"OOM202"}), strict=True)


def _lines(source: str, settings: LintSettings) -> list[int]:
    return [finding.line for finding in analyze(textwrap.dedent(source), settings)]


def _fixed(source: str, settings: LintSettings) -> str:
    return fix_source(textwrap.dedent(source), settings, unsafe=True).source


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=OOM201, path="t.py")


TRAIN = """\
import torch
device = "cuda"
for x, y in loader:
    out = model(x.to(device))
    loss = criterion(out, y.to(device))
    loss.backward()
"""


def test_one_report_per_loop_on_its_header() -> None:
    source = """\
    import torch
    device = "cuda"
    for x, y in loader:
        d_loss = criterion(netD(x), real)
        d_loss.backward()
        g_loss = criterion(netD(netG(z)), real)
        g_loss.backward()
    def finetune():
        while True:
            loss = model(batch).loss
            loss.backward()
    """
    findings = analyze(textwrap.dedent(source), OOM201)
    assert [f.line for f in findings] == [3, 9]
    assert findings[0].range.start.line == findings[0].range.end.line == 3
    assert findings[0].message == "CUDA training loop runs entirely in float32 (no autocast or bf16/fp16)"


@pytest.mark.parametrize(
    "marker",
    [
        "scaler = torch.amp.GradScaler('cuda')",
        "model = model.half()",
        "model = model.to(dtype=torch.bfloat16)",
        "trainer = pl.Trainer(precision='bf16-mixed')",
        "args = TrainingArguments('out', fp16=True)",
        "if args.amp:\n    pass",
        "from accelerate import Accelerator",
        "import deepspeed",
        "half_model = model.half()",
        "dtype = torch.float16",
    ],
)
def test_any_sign_of_reduced_precision_silences(marker: str) -> None:
    assert _lines(marker + "\n" + TRAIN, OOM201) == []


def test_autocast_is_looked_for_per_loop() -> None:
    source = """\
    import torch
    model.cuda()
    for x in warmup:
        with torch.cuda.amp.autocast(dtype=torch.float16):
            loss = model(x).mean()
        loss.backward()
    for x in loader:
        loss = model(x).mean()
        loss.backward()
    """
    assert _lines(source, OOM201) == [7]


@pytest.mark.parametrize(
    "source",
    [
        # nanoGPT: the autocast context lives in a variable.
        (
            "import torch\nctx = torch.amp.autocast(device_type='cuda')\nfor x in loader:\n"
            "    with ctx:\n        loss = model(x.cuda())\n    loss.backward()\n"
        ),
        # The whole function runs under autocast.
        (
            "import torch\n@torch.autocast('cuda')\ndef train():\n    for x in loader:\n"
            "        loss = model(x.cuda())\n        loss.backward()\n"
        ),
        # The loop runs inside an autocast region.
        (
            "from torch import autocast\nwith autocast('cuda'):\n    for x in loader:\n"
            "        loss = model(x.cuda())\n        loss.backward()\n"
        ),
    ],
)
def test_autocast_around_the_forward_silences(source: str) -> None:
    assert _lines(source, OOM201) == []


def test_an_unused_autocast_context_does_not_silence() -> None:
    assert _lines("import torch\nctx = torch.autocast(device_type='cuda')\n" + TRAIN, OOM201) == [5]


@pytest.mark.parametrize(
    "source",
    [
        # No backward: an evaluation loop.
        "import torch\nfor x in loader:\n    preds.append(model(x.cuda()))\n",
        # backward of something that is not a loss (a framework object's method).
        "import torch\nfor b in loader:\n    engine.backward(model(b.cuda()))\n",
        # A backward under no_grad cannot be training.
        "import torch\nfor b in loader:\n    with torch.no_grad():\n        loss = f(b.cuda())\n        loss.backward()\n",
        # A training step called from a loop elsewhere: no loop in its own body.
        "import torch\ndef step(b):\n    loss = crit(model(b.cuda()), y)\n    loss.backward()\n",
    ],
)
def test_not_a_cuda_training_loop(source: str) -> None:
    assert _lines(source, OOM201) == []


def test_a_cpu_loop_next_to_a_cuda_test_is_silent() -> None:
    source = """\
    import torch
    def test_forward_on_gpu():
        assert model.cuda()(x.cuda()).is_cuda
    def test_training_on_cpu():
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    def test_training_on_device(device):
        for x, y in loader:
            loss = criterion(model(x.to(device)), y.to(device))
            loss.backward()
    """
    assert _lines(source, OOM201) == [9]


def test_a_device_chosen_at_top_level_counts_for_every_function() -> None:
    source = """\
    import torch
    def train(model, loader):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    if __name__ == "__main__":
        model = Net().cuda()
        train(model, gpu_loader)
    """
    assert _lines(source, OOM201) == [3]


def test_loss_named_by_its_criterion_or_its_parts() -> None:
    source = """\
    import torch
    for x, y in loader:
        l = criterion(model(x.cuda()), y.cuda())
        l.backward()
    for x, y in loader:
        total = recon_loss(x.cuda()) + 0.1 * kl_loss
        total.backward()
    """
    assert _lines(source, OOM201) == [2, 5]


def test_fix_keeps_comments_blank_lines_and_two_space_indentation() -> None:
    source = """\
    import torch
    def train():
      model.cuda()
      for x, y in loader:
        x = x.cuda()  # move

        # forward
        out = model(x)

        # loss
        loss = criterion(out, y)  # mean
        opt.zero_grad()
        loss.backward()
    """
    expected = """\
    import torch
    def train():
      model.cuda()
      for x, y in loader:
        x = x.cuda()  # move

        # forward
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
          out = model(x)

          # loss
          loss = criterion(out, y)  # mean
        opt.zero_grad()
        loss.backward()
    """
    assert _fixed(source, OOM201) == textwrap.dedent(expected)


def test_fix_keeps_crlf_and_tabs() -> None:
    source = "import torch\r\nfor x in loader:\r\n\tout = model(x.cuda())\r\n\tloss = out.mean()\r\n\tloss.backward()\r\n"
    expected = (
        "import torch\r\nfor x in loader:\r\n"
        '\twith torch.autocast(device_type="cuda", dtype=torch.bfloat16):\r\n'
        "\t\tout = model(x.cuda())\r\n\t\tloss = out.mean()\r\n\tloss.backward()\r\n"
    )
    assert fix_source(source, OOM201, unsafe=True).source == expected


def test_fix_keeps_the_layout_of_a_multiline_call_in_a_nested_block() -> None:
    source = """\
    import torch
    class Trainer:
        def fit(self):
            for batch in self.loader:
                loss = self.criterion(
                    self.model(batch["x"].cuda()),
                    batch["y"].cuda(),
                )
                loss.backward()
    """
    expected = """\
    import torch
    class Trainer:
        def fit(self):
            for batch in self.loader:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = self.criterion(
                        self.model(batch["x"].cuda()),
                        batch["y"].cuda(),
                    )
                loss.backward()
    """
    assert _fixed(source, OOM201) == textwrap.dedent(expected)


@pytest.mark.parametrize(
    "body",
    [
        # The loss comes from a helper's statement that is not an assignment.
        "    losses.append(criterion(model(x.cuda()), y))\n    loss = losses[-1]\n    loss.backward()\n",
        # A compound statement between the loss and its backward.
        "    loss = criterion(model(x.cuda()), y)\n    if debug:\n        print(loss)\n    loss.backward()\n",
        # The backward is inside a branch, not in the loop body itself.
        "    loss = criterion(model(x.cuda()), y)\n    if step % 2 == 0:\n        loss.backward()\n",
        # Two backward passes (a GAN): wrapping the first forward alone would
        # be a partial fix.
        "    d_loss = crit(D(x.cuda()), real)\n    d_loss.backward()\n    g_loss = crit(D(G(z)), real)\n"
        "    g_loss.backward()\n",
        # Only data preparation precedes the backward.
        "    loss = batch['loss'].cuda()\n    loss.backward()\n",
        # The loss is computed in a try.
        "    try:\n        loss = criterion(model(x.cuda()), y)\n    except ValueError:\n        continue\n"
        "    loss.backward()\n",
        # A backward pass inside the region (autograd.grad for a penalty).
        "    out = model(x.cuda())\n    g = torch.autograd.grad(out.sum(), x)\n"
        "    loss = criterion(out, y) + g[0].pow(2).mean()\n"
        "    loss.backward()\n",
        # An optimizer step inside a branch of the region.
        "    out = model(x.cuda())\n    if warmup:\n        scheduler.step()\n"
        "    loss = criterion(out, y)\n    loss.backward()\n",
        # A nested function in the region.
        "    out = model(x.cuda())\n    def penalty():\n        return out.abs().mean()\n"
        "    loss = criterion(out, y) + penalty()\n"
        "    loss.backward()\n",
        # The outputs go to NumPy, which has no bfloat16.
        "    out = model(x.cuda())\n    loss = criterion(out, y)\n    loss.backward()\n"
        "    preds.append(out.argmax(1).cpu().numpy())\n",
    ],
)
def test_no_fix_outside_the_simple_shape(body: str) -> None:
    source = "import torch\nfor x, y in loader:\n" + body
    findings = analyze(source, OOM201)
    assert [f.line for f in findings] == [2]
    assert findings[0].fix is None


@pytest.mark.parametrize(
    ("body", "wrapped"),
    [
        # Between the forward and the loss: the state cut from its history...
        (
            "    out, h = model(x.cuda(), h)\n    h = h.detach()\n    loss = criterion(out, y)\n"
            "    loss.backward()\n",
            '    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            "        out, h = model(x.cuda(), h)\n        h = h.detach()\n        loss = criterion(out, y)\n",
        ),
        # ... assertions on the output ...
        (
            "    out = model(x.cuda())\n    assert out.shape[1] == 10, 'classes'\n"
            "    loss = criterion(out, y)\n"
            "    loss.backward()\n",
            '    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            "        out = model(x.cuda())\n        assert out.shape[1] == 10, 'classes'\n"
            "        loss = criterion(out, y)\n",
        ),
        # ... an if that adjusts the loss terms, wrapped whole.
        (
            "    out, aux = model(x.cuda())\n    if single_gpu:\n        aux = aux.mean()  # per replica\n"
            "    loss = criterion(out, y) + 0.4 * aux\n    loss.backward()\n",
            '    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            "        out, aux = model(x.cuda())\n        if single_gpu:\n"
            "            aux = aux.mean()  # per replica\n"
            "        loss = criterion(out, y) + 0.4 * aux\n",
        ),
        # Data made in the loop (a factory with size arithmetic) stays outside.
        (
            "    tokens = torch.randint(0, V, (B, T + 1), device='cuda')\n"
            "    logits = model(tokens[:, :-1])\n"
            "    loss = criterion(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))\n    loss.backward()\n",
            "    tokens = torch.randint(0, V, (B, T + 1), device='cuda')\n"
            '    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            "        logits = model(tokens[:, :-1])\n"
            "        loss = criterion(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))\n",
        ),
    ],
)
def test_region_from_the_forward_to_the_loss(body: str, wrapped: str) -> None:
    source = "import torch\nfor x, y in loader:\n" + body
    fixed = _fixed(source, OOM201)
    assert wrapped in fixed, fixed
    assert fixed.endswith("    loss.backward()\n")
    ast.parse(fixed)


def test_data_helpers_stay_outside_the_region() -> None:
    source = """\
    import torch
    for i in range(steps):
        x, y = get_batch("train")
        logits = model(x.cuda())
        loss = criterion(logits, y.cuda())
        loss.backward()
    """
    expected = """\
    import torch
    for i in range(steps):
        x, y = get_batch("train")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x.cuda())
            loss = criterion(logits, y.cuda())
        loss.backward()
    """
    assert _fixed(source, OOM201) == textwrap.dedent(expected)


def test_fix_is_unsafe_and_titled() -> None:
    (finding,) = analyze(TRAIN, OOM201)
    assert finding.fix is not None and not finding.fix.is_safe
    assert "autocast" in finding.fix.title
    assert fix_source(TRAIN, OOM201, unsafe=False).source == TRAIN


_SMALL_IMAGES = """\
import torch
import torchvision
from torchvision import transforms
EXTRA
train_set = torchvision.datasets.CIFAR10("data", train=True, transform=transforms.Compose(TRANSFORMS))
loader = torch.utils.data.DataLoader(train_set, batch_size=256)
model = Net().cuda()
for x, y in loader:
    loss = criterion(model(x.cuda()), y.cuda())
    loss.backward()
"""


@pytest.mark.parametrize(
    ("extra", "transforms", "reported"),
    [
        ("", "[transforms.RandomCrop(32, padding=4), transforms.ToTensor()]", False),
        ("", "[transforms.Resize((28, 28)), transforms.ToTensor()]", False),
        # Upscaled to ImageNet sizes, or to a size the file does not show.
        ("", "[transforms.Resize(224), transforms.ToTensor()]", True),
        ("", "[transforms.RandomResizedCrop(args.size), transforms.ToTensor()]", True),
        # A pretrained network (its recipe resizes), or another dataset as well.
        ("backbone = torchvision.models.resnet50(weights='DEFAULT')", "[transforms.ToTensor()]", True),
        ("backbone = torchvision.models.resnet18(pretrained=True)", "[transforms.ToTensor()]", True),
        ("other = torchvision.datasets.ImageFolder(args.data)", "[transforms.ToTensor()]", True),
        # A torchvision network built from scratch takes 32x32 images too.
        ("net = torchvision.models.resnet18(num_classes=10)", "[transforms.ToTensor()]", False),
        ("net = torchvision.models.resnet18(weights=None)", "[transforms.ToTensor()]", False),
        ("vit = AutoModel.from_pretrained('google/vit-base-patch16-224')", "[transforms.ToTensor()]", True),
    ],
)
def test_small_images_train_with_few_activations(extra: str, transforms: str, reported: bool) -> None:
    source = _SMALL_IMAGES.replace("EXTRA", extra).replace("TRANSFORMS", transforms)
    assert bool(_lines(source, OOM201)) is reported


def test_a_mention_of_cifar_without_its_dataset_is_no_evidence() -> None:
    source = """\
    import torch
    # Works like the CIFAR-10 tutorial, on our own images.
    model = Net().cuda()
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        loss.backward()
    """
    assert _lines(source, OOM201) == [4]


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        # The batch reaches a model only under no_grad; the head trains on features.
        ("with torch.no_grad():\n        f = backbone(x)\n    loss = criterion(head(f), y)", False),
        (
            "n = x.size(0)\n    with torch.no_grad():\n        f = backbone(x).view(len(x), -1)\n    loss = criterion(head(f), y)",
            False,
        ),
        # A GAN's discriminator sees the real batch with autograd on.
        (
            "with torch.no_grad():\n        fake = generator(z)\n    loss = criterion(disc(x), y) + criterion(disc(fake), 1 - y)",
            True,
        ),
        # Used with autograd on as well.
        ("with torch.no_grad():\n        f = backbone(x)\n    loss = criterion(head(f) + model(x), y)", True),
        (
            "with torch.no_grad():\n        f = backbone(x)\n    loss = criterion(head(f, x.view(-1)), y)",
            True,
        ),
    ],
)
def test_a_frozen_backbone_feeding_a_head(body: str, reported: bool) -> None:
    source = (
        "import torch\nbackbone, head = backbone.cuda(), head.cuda()\nfor x, y in loader:\n"
        f"    x, y = x.cuda(), y.cuda()\n    {body}\n    loss.backward()\n"
    )
    assert bool(_lines(source, OOM201)) is reported
