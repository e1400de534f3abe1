"""What libraries do that the file cannot show: summaries as data.

The analysis reads one file (or one project) and sees none of the code of
torch, Lightning or transformers. What it needs to know about that code is
written here, reviewed like code, keyed by qualified names and method names
(Pysa's models, CodeQL's summary rows). Anything not listed is unknown, and
unknown keeps a rule silent.

- `FRAMEWORK_HOOKS`: methods a framework calls on a subclass of its base
  class, and the context it calls them in (grad mode, train/eval mode, once per
  training step or not).
- `CALLBACK_RECEIVERS`: calls that run a function passed to them, and the
  grad mode they run it under.
- `GRAPHLESS_METHODS`: methods of library objects that compute under
  `torch.no_grad()` themselves (`generate`), so their results hold no graph.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Grad(enum.Flag):
    """The grad modes code may run under (a set: several callers may differ)."""

    NONE = 0
    ON = enum.auto()
    OFF = enum.auto()
    # Some caller the analysis cannot see (a callback, a public function).
    UNKNOWN = enum.auto()
    # Decided by a value at run time (`torch.set_grad_enabled(phase == "train")`):
    # the author chose the mode per case, so no rule second-guesses it.
    MAYBE = enum.auto()


class Mode(enum.Flag):
    """The train/eval mode a model may be in."""

    NONE = 0
    TRAIN = enum.auto()
    EVAL = enum.auto()
    UNKNOWN = enum.auto()


@dataclass(frozen=True)
class HookContext:
    grad: Grad
    mode: Mode
    # Called once per training batch, whose backward pass the framework runs.
    per_step: bool = False


LIGHTNING_BASES = frozenset(
    {
        "lightning.LightningModule",
        "lightning.pytorch.LightningModule",
        "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule",
        "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule",
        "pytorch_lightning.core.lightning.LightningModule",
        "pytorch_lightning.core.module.LightningModule",
    }
)
TRAINER_BASES = frozenset(
    {
        "transformers.Trainer",
        "transformers.trainer.Trainer",
        "transformers.Seq2SeqTrainer",
        "transformers.trainer_seq2seq.Seq2SeqTrainer",
        "trl.SFTTrainer",
        "trl.DPOTrainer",
        "trl.RewardTrainer",
    }
)

_TRAINING = HookContext(Grad.ON, Mode.TRAIN, per_step=True)
_EVALUATION_NO_GRAD = HookContext(Grad.OFF, Mode.EVAL)

# (base classes, method) -> the context the framework calls the method in.
# Lightning: `fit` runs `training_step` with autograd on in train mode once per
# batch and runs backward on what it returns; its evaluation loops run under
# `torch.no_grad()` or `torch.inference_mode()` (`_no_grad_context` in
# lightning/pytorch/loops/utilities.py) in eval mode.
# transformers' Trainer: `training_step` / `compute_loss` run once per batch
# with autograd on; `evaluation_loop` calls `model.eval()` and then
# `prediction_step` with autograd on (the base `prediction_step` opens
# `torch.no_grad()` itself, so an override that does not is running with
# grad); `compute_loss` is also called from the base `prediction_step`.
FRAMEWORK_HOOKS: dict[tuple[frozenset[str], str], HookContext] = {
    (LIGHTNING_BASES, "training_step"): _TRAINING,
    (LIGHTNING_BASES, "validation_step"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "test_step"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "predict_step"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "on_validation_epoch_end"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "on_test_epoch_end"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "on_predict_epoch_end"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "on_validation_batch_end"): _EVALUATION_NO_GRAD,
    (LIGHTNING_BASES, "on_test_batch_end"): _EVALUATION_NO_GRAD,
    (TRAINER_BASES, "training_step"): _TRAINING,
    (TRAINER_BASES, "compute_loss"): HookContext(Grad.ON | Grad.OFF, Mode.TRAIN | Mode.EVAL),
    (TRAINER_BASES, "prediction_step"): HookContext(Grad.ON, Mode.EVAL),
}

# Calls that run a function passed as their argument, and under what grad mode.
# None: under the grad mode of the call site itself (the function is called
# there and then).
#   - `Optimizer.step(closure)`: LBFGS and the closure-taking optimizers wrap
#     the closure in `torch.enable_grad()` (torch/optim/lbfgs.py).
#   - `torch.utils.checkpoint.checkpoint(fn, ...)`: runs `fn` in the forward
#     under the caller's grad mode (and again in the backward pass).
#   - `map`/`filter`/`sorted(key=)`: run at the call site.
CALLBACK_RECEIVERS: dict[str, Grad | None] = {
    # Launchers and command-line runners call the program's entry point like a
    # plain call from the top level: autograd is on (its default).
    "fire.Fire": Grad.ON,
    "typer.run": Grad.ON,
    "jsonargparse.CLI": Grad.ON,
    "absl.app.run": Grad.ON,
    "argh.dispatch_command": Grad.ON,
    "plac.call": Grad.ON,
    "torch.multiprocessing.spawn": Grad.ON,
    "torch.multiprocessing.start_processes": Grad.ON,
    "accelerate.notebook_launcher": Grad.ON,
    "detectron2.engine.launch": Grad.ON,
    "torch.utils.checkpoint.checkpoint": None,
    "torch.utils.checkpoint.checkpoint_sequential": None,
    "map": None,
    "filter": None,
    "sorted": None,
    "min": None,
    "max": None,
    "functools.reduce": None,
}
# Methods named so on any receiver that call their callable argument with
# autograd on (the optimizer's closure).
CALLBACK_METHODS: dict[str, Grad] = {"step": Grad.ON}

# Decorators that make a function a program's entry point, called by the library
# with autograd in its default mode (on).
ENTRY_POINT_DECORATORS = frozenset({"hydra.main", "click.command", "click.group", "typer.Typer.command"})

# Wrappers that return the function they are given, running it under a mode:
# `torch.no_grad()(fn)`, `torch.inference_mode()(fn)`.
WRAPPING_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.enable_grad"})

# Methods of library models that run without autograd whatever the caller's
# mode: transformers' `GenerationMixin.generate` is decorated with
# `@torch.no_grad()` (transformers/generation/utils.py), as are diffusers'
# pipelines' `__call__`.
GRAPHLESS_METHODS = frozenset({"generate"})
