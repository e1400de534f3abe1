from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.llm.fake_server import FakeModelServer

TRAIN = """import torch

API_KEY = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"


def train(model, loader, optimizer):
    model.train()
    optimizer.zero_grad()
    total_loss = 0
    for inputs, labels in loader:
        loss = model(inputs.cuda(), labels.cuda())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total_loss += loss
    return total_loss


def evaluate(model, loader):
    total_loss = 0
    for inputs, labels in loader:
        total_loss += model(inputs.cuda(), labels.cuda())
    return total_loss
"""
TARGET_LINE = 15  # total_loss += loss

GOOD_ANSWER = """## Diagnosis
1. Loss accumulated with its graph (high): line 15 adds `loss` to `total_loss`, keeping every step's graph.
2. No mixed precision (medium): the forward pass runs in float32.
## Edits
<<<<<<< SEARCH
        optimizer.zero_grad()
        total_loss += loss
=======
        optimizer.zero_grad()
        total_loss += loss.item()
>>>>>>> REPLACE
## Validation
The peak of one step stays flat across steps instead of growing.
## Changelog
Accumulate the training loss with .item() so each step's graph is freed
"""
FIXED_LINE = "        total_loss += loss.item()\n"
NO_MATCH_ANSWER = GOOD_ANSWER.replace(
    "        total_loss += loss\n=", "        total_loss = total_loss + loss\n="
)
AMBIGUOUS_ANSWER = GOOD_ANSWER.replace(
    "        optimizer.zero_grad()\n        total_loss += loss\n=======\n        optimizer.zero_grad()\n        total_loss += loss.item()\n",
    "optimizer.zero_grad()\n=======\noptimizer.zero_grad(set_to_none=True)\n",
)
BROKEN_ANSWER = GOOD_ANSWER.replace("total_loss += loss.item()", "total_loss += (loss.item()")
GARBAGE = "I think you should buy a bigger GPU."


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server
