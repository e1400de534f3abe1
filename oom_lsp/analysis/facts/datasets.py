"""What the file trains or evaluates on, when a known dataset says it: small inputs.

A model's activations scale with its inputs. A file whose data are a known
dataset of small samples (MNIST's 28x28 digits, CIFAR's 32x32 images, Cora's
2,708-node citation graph, QM9's molecules) and that neither resizes them past
64 pixels nor loads a pretrained model (whose recipe resizes its inputs) runs
every forward pass on a fraction of a GPU's memory at any batch a training
script uses. That is evidence that the memory at stake in a finding about its
activations is small.
"""

from __future__ import annotations

import weakref

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, int_value, is_false, method_call
from oom_lsp.analysis.rules._devices import Found, search

# torchvision datasets of images 32 pixels wide or less (MNIST's 28x28,
# CIFAR's and SVHN's 32x32, USPS's 16x16).
_SMALL_IMAGE_DATASETS = {
    "MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN", "USPS",
}  # fmt: skip
# PyTorch Geometric's datasets of small graphs: citation graphs of at most
# 20,000 nodes (Planetoid, CitationFull), co-purchase and co-author graphs of at
# most 35,000 (Amazon, Coauthor), molecules (QM9, ZINC, MoleculeNet, TUDataset),
# meshes and point clouds of a few thousand points (FAUST, ShapeNet, ModelNet).
# Not Reddit, Flickr, Yelp, AmazonProducts or OGB's products / papers100M,
# whose sampled batches alone are millions of nodes.
_SMALL_GRAPH_DATASETS = {
    "Planetoid", "KarateClub", "TUDataset", "QM7b", "QM9", "ZINC", "MoleculeNet", "PPI", "MNISTSuperpixels",
    "GNNBenchmarkDataset", "Amazon", "Coauthor", "CitationFull", "Actor", "WebKB", "WikipediaNetwork",
    "Airports", "ShapeNet", "ModelNet", "FAUST", "GeometricShapes", "DynamicFAUST", "BAShapes",
    "FakeDataset", "MovieLens", "BitcoinOTC", "UPFD", "Entities", "AttributedGraphDataset",
}  # fmt: skip
_SMALL_IMAGE_WORDS = ("MNIST", "CIFAR", "SVHN", "USPS", "torch_geometric")
# Transforms that set the size of the images the model sees.
_SIZING_TRANSFORMS = {
    "Resize",
    "RandomResizedCrop",
    "CenterCrop",
    "RandomCrop",
    "FiveCrop",
    "TenCrop",
    "Scale",
}
# The largest side that keeps images "small": a CIFAR crop, a 64x64 DCGAN.
_SMALL_IMAGE_SIDE = 64
_SMALL_IMAGES: weakref.WeakKeyDictionary[FileContext, bool] = weakref.WeakKeyDictionary()


class _LargerInputFinder(cst.BatchableCSTVisitor):
    """Raises `Found` at the first sign that the file's model may see more
    than small images: another torchvision dataset, an image resized or
    cropped above 64 pixels (or to a size the call does not show), or a
    pretrained model (`from_pretrained`, `timm.create_model`, a
    `torchvision.models` network with weights), whose processor or recipe
    resizes its inputs.
    Records whether a small-image dataset is built at all."""

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        self.small_dataset = False

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is not None and called[1] == "from_pretrained":
            raise Found
        qualified = self.context.call_name(node)
        if qualified is None:
            return
        last = qualified.rsplit(".", 1)[-1]
        if qualified.startswith("torchvision.datasets."):
            if last not in _SMALL_IMAGE_DATASETS:
                raise Found
            self.small_dataset = True
        elif qualified.startswith("torch_geometric.datasets.") or qualified.startswith("ogb."):
            if last not in _SMALL_GRAPH_DATASETS:
                raise Found
            self.small_dataset = True
        elif qualified == "timm.create_model" or (
            qualified.startswith("torchvision.models.") and _loads_weights(node)
        ):
            raise Found
        elif qualified.startswith("torchvision.transforms.") and last in _SIZING_TRANSFORMS:
            size = get_arg(node, "size", 0)
            if not isinstance(size, cst.Arg) or not _is_small_side(size.value):
                raise Found


def _loads_weights(call: cst.Call) -> bool:
    """`resnet18(weights="DEFAULT")`, `resnet18(pretrained=True)`: ImageNet
    weights, trained (and meant to be fine-tuned) on 224-pixel inputs. A
    network built from scratch (`resnet18(num_classes=10)`) takes any size."""
    if has_splat(call):
        return True
    weights = get_arg(call, "weights")
    pretrained = get_arg(call, "pretrained")
    return (isinstance(weights, cst.Arg) and not _is_none(weights.value)) or (
        isinstance(pretrained, cst.Arg) and not is_false(pretrained.value)
    )


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _is_small_side(expr: cst.BaseExpression) -> bool:
    """`32`, `(28, 28)`: literal sides of at most 64 pixels."""
    sides = (
        [element.value for element in expr.elements] if isinstance(expr, (cst.Tuple, cst.List)) else [expr]
    )
    values = [int_value(side) for side in sides]
    return bool(values) and all(value is not None and value <= _SMALL_IMAGE_SIDE for value in values)


def trains_on_small_inputs(context: FileContext) -> bool:
    """Whether the file's data are small images: it builds a torchvision
    MNIST / CIFAR / SVHN / USPS dataset, and nothing in it resizes the
    images past 64 pixels, loads another dataset or a pretrained model.
    Activations of a network on 32x32 images are a fraction of a GPU's
    memory at any batch a training script uses (a 224x224 ImageNet image
    has 49 times the pixels). Computed once per file, on demand."""
    answer = _SMALL_IMAGES.get(context)
    if answer is None:
        answer = False
        if any(word in context.source for word in _SMALL_IMAGE_WORDS):
            finder = _LargerInputFinder(context)
            answer = not search(context.module, finder) and finder.small_dataset
        _SMALL_IMAGES[context] = answer
    return answer


