"""OOM603 ddp-bucket-copy, beyond its examples."""

from __future__ import annotations

import textwrap

from oom_lsp.analysis import LintSettings, analyze, default_settings
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Applicability, Finding

MINGPT_TRAINER = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class Trainer:
    def __init__(self, model, local_rank):
        self.local_rank = local_rank
        self.model = model.to(local_rank)
        self.model = DDP(self.model, device_ids=[self.local_rank])
"""


def _findings(source: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({"OOM603"}), strict=True))


def test_off_by_default():
    assert [f for f in analyze(MINGPT_TRAINER, default_settings()) if f.code == "OOM603"] == []


def test_a_trainer_method_wrapping_its_model_is_reported_with_an_unsafe_fix():
    (finding,) = _findings(MINGPT_TRAINER)
    assert finding.line == 8
    assert finding.message == "DistributedDataParallel keeps every gradient twice: in the parameter and in its bucket."
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE
    fixed = fix_source(MINGPT_TRAINER, LintSettings(enabled=frozenset({"OOM603"}), strict=True), unsafe=True).source
    assert "DDP(self.model, device_ids=[self.local_rank], gradient_as_bucket_view=True)" in fixed


def test_torch_nn_spelled_through_from_import():
    source = """\
    from torch import nn
    model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    """
    assert [f.line for f in _findings(source)] == [2]


def test_every_option_given_positionally_is_not_read():
    # Eleven positional arguments reach gradient_as_bucket_view in some releases, not in others.
    source = """\
    import torch
    model = torch.nn.parallel.DistributedDataParallel(m, None, None, 0, True, True, None, 25, False, False, True)
    """
    assert _findings(source) == []


def test_requires_grad_changed_on_gradients_keeps_it_silent():
    source = """\
    import torch
    model = torch.nn.parallel.DistributedDataParallel(model)
    for p in model.parameters():
        p.grad.data.requires_grad_(False)
    """
    assert _findings(source) == []
