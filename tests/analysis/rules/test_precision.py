"""OOM201 no-mixed-precision and OOM202 float64, beyond their examples."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.rules.precision import file_uses_cuda

OOM201 = LintSettings(enabled=frozenset({"OOM201"}))
OOM202 = LintSettings(enabled=frozenset({"OOM202"}))


def _lines(source: str, settings: LintSettings) -> list[int]:
    return [finding.line for finding in analyze(textwrap.dedent(source), settings)]


def _fixed(source: str, settings: LintSettings) -> str:
    return fix_source(textwrap.dedent(source), settings, unsafe=True).source


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=OOM201, path="t.py")


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nmodel.cuda()\n",
        "import torch\nx = torch.zeros(3, device='cuda:1')\n",
        "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "import torch\nx = x.to(f'cuda:{local_rank}')\n",
        "import torch as T\nT.cuda.set_device(rank)\n",
        "from torch import cuda\nprint(cuda.max_memory_allocated())\n",
        "import torch\nmodel.cuda().eval()\n",
    ],
)
def test_cuda_is_detected(source: str) -> None:
    assert file_uses_cuda(_context(source))


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch.zeros(3)\n",
        '"""Trains on cuda when available."""\nimport torch\n',
        "import torch\n# model.cuda()\n",
        "import torch\ndevice = 'cpu'\nname = 'cudaless'\n",
        "import torch\ndef cuda():\n    pass\nx = cuda\n",
    ],
)
def test_cuda_is_not_imagined(source: str) -> None:
    assert not file_uses_cuda(_context(source))


# --- OOM201 ------------------------------------------------------------------

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
    assert "bfloat16" in findings[0].message and "4 bytes" in findings[0].message


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
        with torch.autocast("cuda", dtype=torch.bfloat16):
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
        '\twith torch.autocast("cuda", dtype=torch.bfloat16):\r\n'
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
                with torch.autocast("cuda", dtype=torch.bfloat16):
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
        "    d_loss = crit(D(x.cuda()), real)\n    d_loss.backward()\n    g_loss = crit(D(G(z)), real)\n    g_loss.backward()\n",
        # Only data preparation precedes the backward.
        "    loss = batch['loss'].cuda()\n    loss.backward()\n",
        # The forward and the loss are not consecutive: wrapping the loss
        # alone would leave the forward's activations in float32.
        "    out, h = model(x.cuda(), h)\n    h = h.detach()\n    loss = criterion(out, y)\n    loss.backward()\n",
    ],
)
def test_no_fix_outside_the_simple_shape(body: str) -> None:
    source = "import torch\nfor x, y in loader:\n" + body
    findings = analyze(source, OOM201)
    assert [f.line for f in findings] == [2]
    assert findings[0].fix is None


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
        with torch.autocast("cuda", dtype=torch.bfloat16):
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


# --- OOM202 ------------------------------------------------------------------


def test_float64_reports_each_spelling_once() -> None:
    source = """\
    import torch as T
    from torch import float64
    device = T.device("cuda")
    a = T.ones(4096, 256, device=device, dtype=T.double)
    b = x.to(float64)
    c = x.type(T.float64)
    T.set_default_tensor_type(T.cuda.DoubleTensor)
    d = T.cuda.DoubleTensor(3)
    """
    assert _lines(source, OOM202) == [4, 5, 6, 7, 8]


def test_default_tensor_type_as_a_string() -> None:
    source = "import torch\ntorch.set_default_tensor_type('torch.cuda.DoubleTensor')\n"
    fixed = fix_source(source, OOM202, unsafe=False).source
    assert fixed == "import torch\ntorch.set_default_tensor_type('torch.cuda.FloatTensor')\n"


def test_bare_imported_name_is_reported_without_fix() -> None:
    source = "import torch\nfrom torch import float64\nx = y.cuda().to(float64)\n"
    (finding,) = analyze(source, OOM202)
    assert finding.fix is None


def test_float64_fix_is_safe_and_keeps_the_alias() -> None:
    source = "import torch as th\nm = net.cuda().double()\nx = m(y.to(dtype=th.float64))\n"
    result = fix_source(source, OOM202, unsafe=False)
    assert result.source == "import torch as th\nm = net.cuda().float()\nx = m(y.to(dtype=th.float32))\n"


@pytest.mark.parametrize(
    "line",
    [
        "acc = (pred == y).double().mean()",
        "total = correct.double().sum().item()",
        "host = x.cpu().double()",
        "on_cpu = x.to('cpu', torch.float64)",
        "eps = torch.finfo(torch.float64).eps",
        "is_double = x.dtype == torch.double",
        "with torch.no_grad():\n    metric = scores.double()",
        "a = np.zeros(3, dtype=np.float64)",
        "assert torch.autograd.gradcheck(layer, (x.cuda().double(),))",
        "class Packed:\n    def double(self):\n        return type(self)(self.data.double())",
        "class Seq:\n    def double(self):\n        return self.to(dtype=torch.double)",
    ],
)
def test_float64_that_costs_no_gpu_memory_is_silent(line: str) -> None:
    assert _lines(f"import torch\nimport numpy as np\nmodel.cuda()\n{line}\n", OOM202) == []


def test_float64_in_a_cpu_helper_of_a_cuda_file_is_silent() -> None:
    source = """\
    import torch
    def reference_solution(a, b):
        return torch.linalg.solve(a.double(), b.to(torch.float64))
    def train():
        model = Net().cuda()
        model = model.double()
    """
    assert _lines(source, OOM202) == [6]


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        # A metric's count and total, summed exactly across ranks.
        ("t = torch.tensor([count, total], dtype=torch.float64, device='cuda')", False),
        ("t = torch.tensor([[1, 2], [3, 4]], dtype=torch.float64, device=device)", False),
        ("cov = torch.zeros(3, 3, dtype=torch.double, device=device)", False),
        ("cov = torch.zeros((64, 64), dtype=torch.double, device=device)", False),
        ("f = torch.full((8,), 0.5, dtype=torch.float64, device='cuda')", False),
        # Large, or a size the call does not show.
        ("x = torch.randn(256, 256, dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros((1024, 1024), dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros(n, 3, dtype=torch.float64, device='cuda')", True),
        ("x = torch.zeros(*shape, dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor(values, dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor([v for v in values], dtype=torch.float64, device='cuda')", True),
        ("x = torch.tensor([*values], dtype=torch.float64, device='cuda')", True),
    ],
)
def test_a_tensor_of_a_few_elements_costs_nothing(line: str, reported: bool) -> None:
    assert bool(_lines(f"import torch\n{line}\n", OOM202)) is reported


def test_float64_noqa() -> None:
    source = "import torch\nx = torch.zeros(4096, 4096, device='cuda', dtype=torch.float64)  # noqa: OOM202\n"
    assert _lines(source, OOM202) == []


# --- OOM201: how much float32 costs ------------------------------------------

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
