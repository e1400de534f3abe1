"""Real-shaped notebooks for the tests: written as Jupyter (nbformat), VS Code
and a minified exporter write them, with outputs, ids, metadata and non-ASCII
text, so that a fix can be checked to change no other byte."""

from __future__ import annotations

import json

SETUP = "%matplotlib inline\n!pip install -q torchvision\nimport torch\nimport torch.nn as nn\ndevice = 'cuda'"
MODEL = (
    "model = nn.Linear(10, 2).to(device)\ncriterion = nn.CrossEntropyLoss()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    # A loader, not a listed batch: a loop over a few listed items keeps no per-step growth.
    "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 10), torch.zeros(8, dtype=torch.long)), batch_size=4)"
)
TRAIN = (
    "%%time\ntotal_loss = 0\nfor x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
    "    loss = criterion(model(x), y)\n    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n"
    "    total_loss += loss"
)
LOAD = "ckpt = torch.load('x.pt')  # résumé\nmodel.load_state_dict(ckpt)"


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def cells() -> list[dict]:
    return [
        {"cell_type": "markdown", "id": "a1", "metadata": {}, "source": _lines("# Training ✓\nWith ünïcode.")},
        {"cell_type": "code", "execution_count": 1, "id": "b2", "metadata": {"tags": ["setup"]},
         "outputs": [], "source": _lines(SETUP)},
        {"cell_type": "code", "execution_count": 2, "id": "c3", "metadata": {},
         "outputs": [{"name": "stdout", "output_type": "stream", "text": ["hello ✓\n"]}], "source": _lines(MODEL)},
        {"cell_type": "code", "execution_count": 3, "id": "d4", "metadata": {"collapsed": False},
         "outputs": [{"data": {"image/png": "iVBORw0KGgo=\n", "text/plain": ["<Figure>"]},
                      "metadata": {}, "output_type": "display_data"}], "source": _lines(TRAIN)},
        {"cell_type": "raw", "id": "e5", "metadata": {}, "source": "%%not code"},
        {"cell_type": "code", "execution_count": None, "id": "f6", "metadata": {}, "outputs": [], "source": _lines(LOAD)},
    ]  # fmt: skip


def notebook(**kwargs) -> dict:
    return {
        "cells": cells(),
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "version": "3.11.7"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def jupyter(nb: dict) -> str:
    """As nbformat (Jupyter) writes: indent 1, sorted keys, raw non-ASCII, final newline."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def vscode(nb: dict) -> str:
    """As VS Code's serializer writes: indent 1, its own key order, no final newline."""
    return json.dumps(nb, indent=1, ensure_ascii=False)


def escaped(nb: dict) -> str:
    """json.dumps' defaults: indent 2, \\uXXXX escapes."""
    return json.dumps(nb, indent=2) + "\n"


def minified(nb: dict) -> str:
    return json.dumps(nb, separators=(",", ":"), ensure_ascii=False)


def single_string_sources(nb: dict) -> str:
    """An exporter that writes each source as one string."""
    for cell in nb["cells"]:
        cell["source"] = "".join(cell["source"])
    return json.dumps(nb, indent=4, ensure_ascii=False) + "\n"


WRITERS = {"jupyter": jupyter, "vscode": vscode, "escaped": escaped, "minified": minified, "single": single_string_sources}
