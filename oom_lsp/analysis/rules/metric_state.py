"""OOM308: a stateful metric that keeps every update's inputs and is never reset."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.facts.metrics import growing_metrics
from oom_lsp.analysis.rule import MESSAGE_LIMIT, Invalid, Rule, Valid, deferred_report


class MetricNeverReset(Rule):
    """
    ## What it does
    Flags a torchmetrics metric that keeps the inputs of every update
    (`AUROC`, `AveragePrecision`, `ROC`, `PrecisionRecallCurve`,
    `SpearmanCorrCoef`, the retrieval and clustering metrics: the classes
    whose states are lists, measured from torchmetrics 1.9) when it is
    updated once per batch, lives across passes over the data and nothing
    resets it:

    - an attribute of a LightningModule updated in a hook that `fit` runs
      on every batch of every epoch (`training_step`, `validation_step`,
      `on_train_batch_end`, or a method they call), with no `.reset()` of it
      anywhere in the class (`test_step` and `predict_step` run one pass per
      call: what they fill is what the metric needs);
    - a local metric made before a loop that trains (a backward pass in it)
      and updated in a loop inside it, never reset: every epoch adds to it;
    - an attribute of a plain object, updated in a loop of a method that a
      training loop runs again after each epoch of training
      (`self.train_one_epoch(...)` then `self.evaluate(...)`), with no
      `.reset()` of it anywhere in the class.

    A `MetricCollection` made of such a metric is such a metric.

    A metric moved when it is made (`BinaryAUROC().to(device)`) is the same
    metric. A class of the file counts as such a metric when a method other
    than `__init__` appends what it is given to a list that `__init__` makes
    (`self.preds.append(logits.argmax(-1))`); a method that binds that list
    again or clears it (or calls one that does) resets it.

    It stays silent when the metric is bounded (`thresholds=` of the curve
    family keeps fixed bins; `compute_on_cpu=True` moves the states off the
    GPU), bound again, reset, or handed to other code: Lightning's
    `self.log(name, metric)` resets a logged metric object at the end of the
    epoch, and a collection, a callback or a helper it is handed to may
    reset it.

    ## Why is this bad?
    These metrics need every prediction at `compute()` time, so each
    `update()` appends the batch's predictions and targets to the metric's
    states, on the device they are on. Logging `metric.compute()` does not
    reset it: without `reset()` the states hold every batch of the whole run,
    and GPU memory grows by one batch of predictions per step until it runs
    out, epochs into training.

    ## Example
    ```python
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_auroc.update(self(x), y)

    def on_validation_epoch_end(self):
        self.log("val_auroc", self.val_auroc.compute())
    ```

    ## Use instead
    ```python
    def on_validation_epoch_end(self):
        self.log("val_auroc", self.val_auroc.compute())
        self.val_auroc.reset()
    ```
    (or `self.log("val_auroc", self.val_auroc)` in the step: Lightning
    computes and resets it at the epoch's end.)
    """

    code = "OOM308"
    name = "metric-never-reset"
    summary = "A metric that keeps every update's inputs is never reset: it grows for the whole run."
    why = (
        "Curve, ranking and retrieval metrics append each update's predictions and targets to their "
        "states until reset(); compute() does not reset them."
    )
    remedy = "Call metric.reset() after compute() at the end of each epoch, or log the metric object in Lightning."

    VALID = [
        # Reset after compute at the epoch's end.
        Valid(
            """
            import lightning as L
            from torchmetrics.classification import BinaryAUROC

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.val_auroc = BinaryAUROC()

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.val_auroc.update(self(x), y)

                def on_validation_epoch_end(self):
                    self.log("val_auroc", self.val_auroc.compute())
                    self.val_auroc.reset()
            """
        ),
        # The metric object logged: Lightning computes and resets it.
        Valid(
            """
            import lightning as L
            import torchmetrics

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.val_auroc = torchmetrics.AUROC(task="binary")

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.val_auroc(self(x), y)
                    self.log("val_auroc", self.val_auroc, on_epoch=True)
            """
        ),
        # Binned: fixed-size states.
        Valid(
            """
            import lightning as L
            from torchmetrics.classification import BinaryAUROC

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.val_auroc = BinaryAUROC(thresholds=200)

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.val_auroc.update(self(x), y)
            """
        ),
        # A counter-state metric keeps a fixed size whatever the number of updates.
        Valid(
            """
            import lightning as L
            from torchmetrics.classification import BinaryAccuracy

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.val_accuracy = BinaryAccuracy()

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.val_accuracy.update(self(x), y)
            """
        ),
        # One metric per pass: made inside the epoch loop.
        Valid(
            """
            from torchmetrics import AveragePrecision

            def fit(model, loader, epochs):
                for epoch in range(epochs):
                    metric = AveragePrecision(task="binary")
                    for x, y in loader:
                        metric.update(model(x), y)
                    print(metric.compute())
            """
        ),
        # Handed to a helper, which may reset it.
        Valid(
            """
            from torchmetrics import AveragePrecision

            def fit(model, loader, epochs):
                metric = AveragePrecision(task="binary")
                for epoch in range(epochs):
                    for x, y in loader:
                        metric.update(model(x), y)
                    report(metric)
            """
        ),
        # A class of the file whose own method hands the data over and starts afresh.
        Valid(
            """
            import torch

            class Rollout:
                def __init__(self):
                    self.data = []

                def put(self, transition):
                    self.data.append(transition)

                def take(self):
                    batch, self.data = self.data, []
                    return batch

            def fit(agent, env, optimizer, episodes):
                memory = Rollout()
                for episode in range(episodes):
                    for t in range(100):
                        memory.put(agent.act(env))
                    loss = agent.loss(memory.take())
                    loss.backward()
                    optimizer.step()
            """
        ),
        # A plain object's metric reset after each evaluation, or one that
        # evaluates once (no training loop runs it again).
        Valid(
            """
            import torch
            from torchmetrics import AUROC

            class Experiment:
                def __init__(self, model):
                    self.model = model.cuda()
                    self.auroc = AUROC(task="binary").cuda()

                def train_one_epoch(self, loader, optimizer):
                    for x, y in loader:
                        self.model(x.cuda()).mean().backward()
                        optimizer.step()

                @torch.no_grad()
                def evaluate(self, loader):
                    for x, y in loader:
                        self.auroc.update(self.model(x.cuda()).sigmoid(), y.cuda())
                    score = self.auroc.compute()
                    self.auroc.reset()
                    return score

                def fit(self, train_loader, val_loader, optimizer, epochs):
                    for epoch in range(epochs):
                        self.train_one_epoch(train_loader, optimizer)
                        print(self.evaluate(val_loader))
            """
        ),
        Valid(
            """
            import torch
            from torchmetrics import AUROC

            class Scorer:
                def __init__(self, model):
                    self.model = model.cuda()
                    self.auroc = AUROC(task="binary").cuda()

                @torch.no_grad()
                def evaluate(self, loader):
                    for x, y in loader:
                        self.auroc.update(self.model(x.cuda()).sigmoid(), y.cuda())
                    return self.auroc.compute()

            print(Scorer(net).evaluate(test_loader))
            """
        ),
    ]

    INVALID = [
        Invalid(
            """
            import lightning as L
            from torchmetrics.classification import BinaryAUROC

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.val_auroc = BinaryAUROC()

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.val_auroc.update(self(x), y)

                def on_validation_epoch_end(self):
                    self.log("val_auroc", self.val_auroc.compute())
            """,
            line=12,
        ),
        Invalid(
            """
            from torchmetrics import SpearmanCorrCoef

            def fit(model, loader, optimizer, epochs):
                spearman = SpearmanCorrCoef()
                for epoch in range(epochs):
                    for x, y in loader:
                        out = model(x)
                        out.pow(2).mean().backward()
                        optimizer.step()
                        spearman(out.detach().squeeze(), y)
                    print(spearman.compute())
            """,
            line=11,
        ),
        # Moved to the GPU when made: `.to()` returns the metric itself.
        Invalid(
            """
            from torchmetrics.classification import BinaryAUROC

            def fit(model, loader, optimizer, epochs, device):
                auroc = BinaryAUROC().to(device)
                for epoch in range(epochs):
                    for x, y in loader:
                        logits = model(x.to(device))
                        loss = logits.mean()
                        loss.backward()
                        optimizer.step()
                        auroc.update(logits.detach(), y.to(device))
                    print(auroc.compute())
            """,
            line=12,
        ),
        # A metric class of the file that appends each update to a list, never reset.
        Invalid(
            """
            import torch

            class Collector:
                def __init__(self):
                    self.preds = []

                def add(self, logits):
                    self.preds.append(logits.argmax(-1))

                def reset(self):
                    self.preds = []

            def fit(model, loader, optimizer, epochs):
                seen = Collector()
                for epoch in range(epochs):
                    for x, y in loader:
                        logits = model(x)
                        logits.mean().backward()
                        optimizer.step()
                        seen.add(logits.detach())
                    print(torch.cat(seen.preds).float().mean())
            """,
            line=21,
        ),
        # A plain object's metric, evaluated after every epoch of training.
        Invalid(
            """
            import torch
            from torchmetrics import AUROC

            class Experiment:
                def __init__(self, model):
                    self.model = model.cuda()
                    self.auroc = AUROC(task="binary").cuda()

                def train_one_epoch(self, loader, optimizer):
                    for x, y in loader:
                        self.model(x.cuda()).mean().backward()
                        optimizer.step()

                @torch.no_grad()
                def evaluate(self, loader):
                    for x, y in loader:
                        self.auroc.update(self.model(x.cuda()).sigmoid(), y.cuda())
                    return self.auroc.compute()

                def fit(self, train_loader, val_loader, optimizer, epochs):
                    for epoch in range(epochs):
                        self.train_one_epoch(train_loader, optimizer)
                        print(self.evaluate(val_loader))
            """,
            line=18,
        ),
        # A collection of metrics that keep their inputs keeps them too.
        Invalid(
            """
            import torch
            import torchmetrics

            def fit(model, train_loader, val_loader, optimizer, epochs):
                metrics = torchmetrics.MetricCollection({
                    "ap": torchmetrics.AveragePrecision(task="binary"),
                    "acc": torchmetrics.Accuracy(task="binary"),
                }).cuda()
                for epoch in range(epochs):
                    for x, y in train_loader:
                        model(x.cuda()).mean().backward()
                        optimizer.step()
                    with torch.no_grad():
                        for x, y in val_loader:
                            metrics.update(model(x.cuda()).sigmoid(), y.cuda())
                    print(metrics.compute())
            """,
            line=16,
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        for metric in growing_metrics(self.context):
            message = f"{metric.path} ({metric.metric_class}) keeps every update's inputs and is never reset"
            if len(message) + len(": it grows with each update") < MESSAGE_LIMIT:
                message += ": it grows with each update"
            self.context.add_report(deferred_report(self, metric.update.node, message, None, metric.update.path))
