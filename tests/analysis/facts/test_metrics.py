"""Stateful metrics that grow with every update and are never reset (oom_lsp.analysis.facts.metrics)."""

from __future__ import annotations

import textwrap

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.metrics import growing_metrics
from oom_lsp.analysis.settings import default_settings

LIGHTNING = """
    import lightning as L
    import torchmetrics
    from torchmetrics.classification import BinaryAUROC, BinaryAccuracy

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.val_metric = {construction}

        def validation_step(self, batch, batch_idx):
            x, y = batch
            {update}

        def on_validation_epoch_end(self):
            {epoch_end}
"""


def _growing(source: str) -> list[tuple[str, str, int]]:
    source = textwrap.dedent(source)
    module = cst.parse_module(source)
    context = FileContext(source=source, module=module, settings=default_settings(), path="t.py")
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    return [
        (metric.path, metric.metric_class, positions[metric.update.node].start.line)
        for metric in growing_metrics(context)
    ]


def _lightning(construction: str = "BinaryAUROC()", update: str = "self.val_metric.update(self(x), y)",
               epoch_end: str = 'self.log("auroc", self.val_metric.compute())') -> str:
    return LIGHTNING.format(construction=construction, update=update, epoch_end=epoch_end)


def test_a_list_state_metric_of_a_lightning_module_logged_by_value_and_never_reset_grows() -> None:
    assert _growing(_lightning()) == [("self.val_metric", "BinaryAUROC", 13)]


def test_a_call_of_the_metric_updates_it_too() -> None:
    assert _growing(_lightning(update="self.val_metric(self(x), y)")) == [("self.val_metric", "BinaryAUROC", 13)]


def test_the_task_wrapper_through_the_package_is_the_same_metric() -> None:
    found = _growing(_lightning(construction='torchmetrics.AUROC(task="binary")'))
    assert found == [("self.val_metric", "AUROC", 13)]


def test_a_reset_after_compute_bounds_it() -> None:
    epoch_end = 'self.log("auroc", self.val_metric.compute()); self.val_metric.reset()'
    assert _growing(_lightning(epoch_end=epoch_end)) == []


def test_logging_the_metric_object_lets_lightning_reset_it() -> None:
    assert _growing(_lightning(epoch_end='self.log("auroc", self.val_metric)')) == []


def test_binned_thresholds_and_states_moved_to_the_cpu_keep_it_bounded() -> None:
    assert _growing(_lightning(construction="BinaryAUROC(thresholds=100)")) == []
    assert _growing(_lightning(construction="BinaryAUROC(thresholds=None)")) != []
    assert _growing(_lightning(construction="BinaryAUROC(compute_on_cpu=True)")) == []


def test_a_metric_with_counter_states_does_not_grow() -> None:
    assert _growing(_lightning(construction="BinaryAccuracy()")) == []


def test_a_metric_rebuilt_at_each_epoch_start_is_a_new_one() -> None:
    epoch_end = "self.val_metric = BinaryAUROC()"
    assert _growing(_lightning(epoch_end=epoch_end)) == []


def test_a_plain_class_may_be_made_once_per_evaluation() -> None:
    source = """
        from torchmetrics.classification import BinaryAUROC

        class Evaluator:
            def __init__(self):
                self.auroc = BinaryAUROC()

            def validation_step(self, x, y):
                self.auroc.update(x, y)
    """
    assert _growing(source) == []


def test_a_local_metric_made_before_the_epoch_loop_grows_over_every_epoch() -> None:
    source = """
        from torchmetrics import RetrievalMAP

        def fit(model, loader, epochs):
            metric = RetrievalMAP()
            for epoch in range(epochs):
                for x, y, index in loader:
                    scores = model(x)
                    scores.mean().backward()
                    metric.update(scores.detach(), y, indexes=index)
                print(metric.compute())
    """
    assert _growing(source) == [("metric", "RetrievalMAP", 10)]


def test_a_local_metric_of_one_pass_is_what_it_needs() -> None:
    source = """
        from torchmetrics import RetrievalMAP

        def evaluate(model, loader):
            metric = RetrievalMAP()
            for x, y, index in loader:
                metric.update(model(x), y, indexes=index)
            return metric.compute()
    """
    assert _growing(source) == []


def test_a_metric_put_in_a_collection_is_left_to_it() -> None:
    source = """
        import lightning as L
        from torchmetrics import MetricCollection
        from torchmetrics.classification import BinaryAUROC

        class Classifier(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.val_metric = BinaryAUROC()
                self.metrics = MetricCollection([self.val_metric])

            def validation_step(self, batch, batch_idx):
                self.val_metric.update(*batch)
    """
    assert _growing(source) == []


def test_a_name_that_is_not_torchmetrics_is_not_a_metric() -> None:
    source = """
        import lightning as L
        from mylib import BinaryAUROC

        class Classifier(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.val_metric = BinaryAUROC()

            def validation_step(self, batch, batch_idx):
                self.val_metric.update(*batch)
    """
    assert _growing(source) == []


def test_a_method_a_step_calls_runs_once_per_batch_too() -> None:
    source = """
        import lightning as L
        from torchmetrics.classification import MulticlassAveragePrecision

        class Classifier(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.val_ap = MulticlassAveragePrecision(num_classes=10)

            def _update_metrics(self, logits, y):
                self.val_ap.update(logits, y)

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self._update_metrics(self(x), y)
    """
    assert _growing(source) == [("self.val_ap", "MulticlassAveragePrecision", 11)]


def test_a_test_step_runs_one_pass_per_call_so_its_metric_holds_what_it_needs() -> None:
    source = _lightning().replace("def validation_step", "def test_step")
    assert _growing(source) == []


def test_nested_loops_of_one_evaluation_are_no_epochs() -> None:
    # Every query scored against every batch: one pass, the inputs the metric needs.
    source = """
        import torch
        from torchmetrics import RetrievalMAP

        @torch.no_grad()
        def validate(model, loader, queries):
            metric = RetrievalMAP()
            for x, y in loader:
                embedding = model(x)
                for query, target, index in queries:
                    metric(embedding @ query, target == y, index)
            return metric.compute()
    """
    assert _growing(source) == []


_GROWING_CLASS = """
    import torch

    class Seen:
        def __init__(self):
            self.preds = []

        def add(self, logits):
            self.preds.append(logits.argmax(-1))

        def other(self, i):
            {other}

    def fit(model, loader, optimizer, epochs):
        seen = Seen()
        for epoch in range(epochs):
            for x, y in loader:
                logits = model(x)
                logits.mean().backward()
                optimizer.step()
                seen.add(logits.detach())
                seen.other(0)
            print(torch.cat(seen.preds).float().mean())
"""


def test_a_method_that_adds_to_or_stores_one_entry_of_the_list_does_not_reset_it() -> None:
    for other in ("self.preds += [i]", "self.preds[i] = None", "del self.preds[i]", "del i"):
        found = _growing(_GROWING_CLASS.replace("{other}", other))
        assert [(path, metric) for path, metric, _ in found] == [("seen", "Seen")], other


def test_a_method_that_empties_or_rebinds_the_list_resets_it() -> None:
    for other in ("self.preds = []", "self.preds[:] = []", "del self.preds[:]", "self.preds.clear()", "_, self.preds = self.preds, []"):
        assert _growing(_GROWING_CLASS.replace("{other}", other)) == [], other
