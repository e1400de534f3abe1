"""The rank facts OOM402 reads (rules/_tensor_ranks.py): stated by the code,
followed through helpers and layers of the file, never guessed."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze

ATTEND = """\
    scores = queries @ keys.transpose(2, 3)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values
"""


def _reported(source: str) -> bool:
    code = textwrap.dedent(source)
    return any(f.code == "OOM402" for f in analyze(code, LintSettings(enabled=frozenset({"OOM402"}), strict=True)))


def _attention(prelude: str, body: str) -> str:
    return (
        "import torch\nimport torch.nn as nn\n" + textwrap.dedent(prelude)
        + "\ndef attend(x, queries, values, b, t, h, d, cos, sin):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + textwrap.indent(textwrap.dedent(ATTEND), "    ")
    )


@pytest.mark.parametrize(
    ("prelude", "body"),
    [
        ("", "keys = x.view(b, t, h, d).transpose(1, 2)\n"),
        ("", "b, h, t, d = x.shape\nkeys = x\n"),
        ("", "keys = x.view(b, t, h, d).transpose(1, 2).repeat_interleave(2, dim=1)\n"),
        ("", "keys = -x.view(b, t, h, d)[..., : d // 2]\n"),
        ("", "keys = torch.cat((x.view(b, t, h, d), cos), dim=-1)\n"),
        ("", "keys, other = x.view(b, t, h, d), None\n"),
        ("", "keys = x.view(b, t, h, d) * cos + sin\n"),
        ("def rope(x, cos, sin):\n    half = x[..., : x.shape[-1] // 2]\n    return (x * cos).to(dtype=x.dtype)\n",
         "keys = rope(x.view(b, t, h, d), cos, sin)\n"),
        ("def rope(x, cos, sin):\n    if cos is None:\n        x = x.float()\n    else:\n        x = x * cos\n    return x\n",
         "keys = rope(x.view(b, t, h, d), cos, sin)\n"),
    ],
    ids=["view", "shape-unpacked", "repeat_interleave", "slice-and-sign", "cat", "tuple-assign", "broadcast",
         "helper", "helper-with-branches"],
)
def test_a_key_whose_four_dimensions_the_code_states_has_transpose_2_3_as_its_last_two(prelude: str, body: str) -> None:
    assert _reported(_attention(prelude, body))


@pytest.mark.parametrize(
    ("prelude", "body"),
    [
        ("", "keys = x\n"),
        ("", "keys = x.view(b, t, h, d, 1)\n"),
        ("", "keys = x.view(b, t, h, d)[:, 0]\n"),
        ("", "keys = x.view(b, t, h, d).unsqueeze(2)\n"),
        ("def rope(x, cos, sin):\n    for _ in range(2):\n        x = x.flatten(1)\n    return x\n",
         "keys = rope(x.view(b, t, h, d), cos, sin)\n"),
        ("def rope(x, cos, sin):\n    if cos is None:\n        return x.flatten(1)\n    return x\n",
         "keys = rope(x.view(b, t, h, d), cos, sin)\n"),
        ("def rope(x, cos, sin):\n    if cos is None:\n        x = x.flatten(1)\n    return x\n",
         "keys = rope(x.view(b, t, h, d), cos, sin)\n"),
        ("", "keys = x.view(b, t, h, d)\nif cos is None:\n    keys = keys.flatten(1)\n"),
    ],
    ids=["unknown", "five-dims", "indexed", "unsqueezed", "helper-loop", "helper-returns-in-branch",
         "helper-branches-disagree", "rebound-in-branch"],
)
def test_a_key_whose_rank_is_unknown_or_not_four_is_not_taken_for_scores(prelude: str, body: str) -> None:
    assert not _reported(_attention(prelude, body))


LAYER = """\
    class Attention(nn.Module):
        def __init__(self, d, norm):
            super().__init__()
            self.k_norm = {built}

        def forward(self, x, queries, values, b, t, h, d):
            keys = x.view(b, t, h, d).transpose(1, 2)
            keys = self.k_norm(keys)
            scores = queries @ keys.transpose(2, 3)
            weights = torch.softmax(scores, dim=-1)
            return weights @ values
"""

FILE_NORM = """\
    class Norm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))

    class Flatten(nn.Module):
        def forward(self, x):
            return x.flatten(2)
"""


@pytest.mark.parametrize(
    ("built", "kept"),
    [
        ("nn.LayerNorm(d)", True),
        ("Norm() if norm else None", True),
        ("nn.Linear(d, d)", False),
        ("Flatten()", False),
        ("Norm() if norm else nn.LayerNorm(d)", False),
        ("make_norm(d)", False),
    ],
)
def test_a_submodule_keeps_the_rank_only_when_every_layer_assigned_to_it_keeps_the_shape(built: str, kept: bool) -> None:
    source = "import torch\nimport torch.nn as nn\n" + textwrap.dedent(FILE_NORM) + textwrap.dedent(LAYER).format(built=built)
    assert _reported(source) is kept


CHANNELS_FIRST = """\
    import torch

    def attend(x, q, k, v):
        {unpack}
        q = q.reshape({q_shape}).permute(0, 2, 1)
        k = k.reshape({k_shape})
        w_ = torch.softmax(torch.bmm(q, k), dim={dim})
        return torch.bmm(v.reshape({k_shape}), w_.permute(0, 2, 1))
"""


@pytest.mark.parametrize(
    ("unpack", "q_shape", "k_shape", "dim", "reported"),
    [
        # positions of a feature map (NCHW), in either order of the factors
        ("b, c, h, w = x.shape", "b, c, h * w", "b, c, w * h", "2", True),
        ("b, c, h, w = x.size()", "b, -1, h * w", "b, -1, h * w", "-1", True),
        ("b, c, t, h, w = x.shape", "b, c, t * h * w", "b, c, t * h * w", "-1", True),
        # channels by channels, or no spatial dimension the code names
        ("b, c, h, w = x.shape", "b, h * w, c", "b, h * w, c", "-1", False),
        ("b, n, d = x.shape", "b, d, n", "b, d, n", "-1", False),
        ("b, c, h, w = x.shape", "b, c, -1", "b, c, -1", "-1", False),
        # softmax over another dimension than the last
        ("b, c, h, w = x.shape", "b, c, h * w", "b, c, h * w", "1", False),
    ],
)
def test_bmm_is_a_score_matrix_when_both_its_last_dimensions_are_the_flattened_positions(
    unpack: str, q_shape: str, k_shape: str, dim: str, reported: bool
) -> None:
    source = textwrap.dedent(CHANNELS_FIRST).format(unpack=unpack, q_shape=q_shape, k_shape=k_shape, dim=dim)
    assert _reported(source) is reported


@pytest.mark.parametrize("grown", ["x.view(b, t, h, d).expand(2, b, t, h, d)", "x.view(b, t, h, d).repeat(2, 1, 1, 1, 1)"])
def test_expand_and_repeat_may_add_dimensions(grown: str) -> None:
    assert not _reported(_attention("", f"keys = {grown}\n"))
