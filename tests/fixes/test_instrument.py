"""The "Insert memory monitoring" and "Guard with oom_guard" edits (oom_lsp.fixes.instrument).

Each tests/fixes/golden/instrument_<case>.in.py, edited at the line named in CASES, must equal
instrument_<case>.out.py byte for byte; the result parses and the action is not offered again.
`OOM_LSP_UPDATE_GOLDEN=1` rewrites the .out.py files after an intended change.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.edits import apply_edits
from oom_lsp.fixes.instrument import (
    TrainingCall,
    TrainingLoop,
    find_training_calls,
    find_training_loops,
    guard_with_oom_guard,
    insert_memory_monitoring,
)

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CASES = {
    # case: (action, text of the line the action is asked for)
    "instrument_monitor_nested": (insert_memory_monitoring, "for epoch in range(epochs):"),
    "instrument_monitor_epoch_function": (insert_memory_monitoring, "for inputs, targets in loader:"),
    "instrument_monitor_single_loop": (insert_memory_monitoring, "loss.backward()"),
    # The step is a function called from the loop; both loops end on the same line.
    "instrument_monitor_step_function": (insert_memory_monitoring, "for batch in loader:"),
    # Gradient accumulation: the monitor steps with the optimizer (scaler.step), not per micro-batch.
    "instrument_monitor_gradient_accumulation": (insert_memory_monitoring, "for micro_step, batch in"),
    # The optimizer step is a one-line block: the monitor's step joins it on that line.
    "instrument_monitor_one_line_step": (insert_memory_monitoring, "for i, x in enumerate(loader):"),
    "instrument_guard_main_call": (guard_with_oom_guard, "fit(model, loader, optimizer, args.epochs)"),
    "instrument_guard_flat_script": (guard_with_oom_guard, "for epoch in range(5):"),
}


def _line_of(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def test_every_golden_file_has_a_case() -> None:
    assert {path.name.removesuffix(".in.py") for path in GOLDEN_DIR.glob("instrument_*.in.py")} == set(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_edit_matches_golden_output(case: str) -> None:
    action, marker = CASES[case]
    source = (GOLDEN_DIR / f"{case}.in.py").read_text(encoding="utf-8")
    edits = action(source, _line_of(source, marker))
    assert edits is not None
    result = apply_edits(source, edits)
    expected_path = GOLDEN_DIR / f"{case}.out.py"
    if os.environ.get("OOM_LSP_UPDATE_GOLDEN"):
        expected_path.write_text(result, encoding="utf-8")
    assert result == expected_path.read_text(encoding="utf-8")
    cst.parse_module(result)
    assert action(result, _line_of(result, marker)) is None  # offered once


def test_the_finders_say_where_the_actions_apply() -> None:
    source = (GOLDEN_DIR / "instrument_monitor_epoch_function.in.py").read_text(encoding="utf-8")
    assert find_training_loops(source) == [
        TrainingLoop(6, 10, "steps", "train_one_epoch"),
        TrainingLoop(22, 24, "epochs", "main"),
    ]
    assert find_training_calls(source) == [
        TrainingCall(23, 23, "train_one_epoch"),
        TrainingCall(28, 28, "main"),
    ]
    # The same edits from the step loop in train_one_epoch and from the epoch loop in main.
    assert insert_memory_monitoring(source, 8) == insert_memory_monitoring(source, 22)
    assert insert_memory_monitoring(source, 14) is None  # evaluate(): no backward, not a training loop


def test_monitoring_a_loop_inside_another_function_in_the_epoch_loop() -> None:
    source = (GOLDEN_DIR / "instrument_monitor_epoch_function.in.py").read_text(encoding="utf-8")
    edited = apply_edits(source, insert_memory_monitoring(source, 6) or ())
    assert "monitor.step()" not in edited  # the monitor lives in main(): train_one_epoch cannot see it
    assert edited.count("monitor.epoch_end()") == 1


def test_nothing_is_offered_where_it_does_not_apply() -> None:
    plain = "import torch\n\nfor x in range(3):\n    print(torch.ones(x))\n"
    assert find_training_loops(plain) == [] and find_training_calls(plain) == []
    assert insert_memory_monitoring(plain, 3) is None and guard_with_oom_guard(plain, 3) is None
    assert insert_memory_monitoring("def broken(:\n", 1) is None
    assert find_training_loops("def broken(:\n") == []
    one_line_body = "for x in loader: model(x).sum().backward()\n"
    assert insert_memory_monitoring(one_line_body, 1) is None
    nested_function = "for x in loader:\n    def step():\n        model(x).sum().backward()\n    step()\n"
    assert find_training_loops(nested_function) == []  # the backward belongs to step(), called once per x


def test_an_existing_guard_or_monitor_is_respected() -> None:
    guarded = (
        "from oom_lsp.runtime import oom_guard\n\nwith oom_guard():\n"
        "    for x in loader:\n        model(x).sum().backward()\n"
    )
    assert find_training_calls(guarded) == [] and guard_with_oom_guard(guarded, 4) is None
    decorated = (
        "from oom_lsp.runtime import oom_guard\n\n@oom_guard(ask=True)\ndef fit(loader):\n"
        "    for x in loader:\n        model(x).sum().backward()\n\n\ndef main():\n    fit(loader)\n\n\nmain()\n"
    )
    assert find_training_calls(decorated) == []
    monitored = (
        "from oom_lsp.runtime import memory_monitor\n\nm = memory_monitor()\n"
        "for x in loader:\n    model(x).sum().backward()\n    m.step()\n"
    )
    assert insert_memory_monitoring(monitored, 4) is None


def test_a_file_without_a_final_newline_and_a_taken_name() -> None:
    source = "import torch\nmonitor = 1\nfor x in loader:\n    model(x).sum().backward()"
    edited = apply_edits(source, insert_memory_monitoring(source, 4) or ())
    assert edited == (
        "import torch\nfrom oom_lsp.runtime import memory_monitor  # pip install oom-lsp\nmonitor = 1\n"
        "monitor_2 = memory_monitor(every_n_steps=100)\nfor x in loader:\n"
        "    model(x).sum().backward()\n    monitor_2.step()\n"
    )
    guarded = apply_edits(source, guard_with_oom_guard(source, 3) or ())
    assert guarded == (
        "import torch\nfrom oom_lsp.runtime import oom_guard  # pip install oom-lsp\nmonitor = 1\n"
        "with oom_guard():\n"
        "    for x in loader:\n        model(x).sum().backward()"
    )


def test_a_critic_loop_inside_the_batch_loop_keeps_the_epoch_loop() -> None:
    gan = (
        "for epoch in range(3):\n    for x in loader:\n        for _ in range(5):\n"
        "            critic(x).mean().backward()\n        generator(x).mean().backward()\n"
    )
    assert [(loop.line, loop.kind) for loop in find_training_loops(gan)] == [
        (1, "epochs"),
        (2, "steps"),
        (3, "steps"),
    ]
    assert apply_edits(gan, insert_memory_monitoring(gan, 2) or ()) == (
        "from oom_lsp.runtime import memory_monitor  # pip install oom-lsp\nmonitor = memory_monitor()\n"
        "for epoch in range(3):\n    for x in loader:\n        for _ in range(5):\n            critic(x).mean().backward()\n"
        "        generator(x).mean().backward()\n        monitor.step()\n    monitor.epoch_end()\n"
    )


def test_the_monitor_steps_with_the_optimizer_not_the_scheduler_nor_a_nested_loop() -> None:
    """Only an optimizer's step counts: a scheduler's `.step()` does not, nor one in a loop nested
    inside the step loop; without an optimizer step the monitor steps at the end of the body."""
    scheduler_last = (
        "for x in loader:\n    model(x).sum().backward()\n    optimizer.step()\n"
        "    optimizer.zero_grad()\n    scheduler.step()\n"
    )
    edited = apply_edits(scheduler_last, insert_memory_monitoring(scheduler_last, 1) or ())
    assert "    optimizer.step()\n    monitor.step()\n    optimizer.zero_grad()\n" in edited
    deepspeed = "for x in loader:\n    loss = engine(x)\n    engine.backward(loss)\n    engine.step()\n    log(loss)\n"
    edited = apply_edits(deepspeed, insert_memory_monitoring(deepspeed, 1) or ())
    assert "    engine.step()\n    monitor.step()\n    log(loss)\n" in edited
    schedulers = (
        "opt = torch.optim.SGD(params)\nsched = torch.optim.lr_scheduler.StepLR(opt, 10)\n"
        "plateau = ReduceLROnPlateau(opt)\nfor x in loader:\n    model(x).sum().backward()\n"
        "    opt.step()\n    log(x)\n    sched.step()\n    plateau.step(val_loss)\n"
    )
    edited = apply_edits(schedulers, insert_memory_monitoring(schedulers, 4) or ())
    assert "    opt.step()\n    monitor.step()\n    log(x)\n" in edited
    no_optimizer_step = "for x in loader:\n    model(x).sum().backward()\n    scheduler.step()\n    log(x)\n"
    edited = apply_edits(no_optimizer_step, insert_memory_monitoring(no_optimizer_step, 1) or ())
    assert edited.endswith("    log(x)\n    monitor.step()\n")
    inner_only = (
        "for x in loader:\n    for part in x.split(2):\n        model(part).sum().backward()\n"
        "        optimizer.step()\n        optimizer.zero_grad()\n    log(x)\n"
    )
    edited = apply_edits(inner_only, insert_memory_monitoring(inner_only, 2) or ())
    assert edited.count("monitor.step()") == 1
    assert "        optimizer.step()\n        monitor.step()\n" in edited  # the inner loop is the step loop


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_page_break_above_changes_nothing_but_the_line_numbers(case: str) -> None:
    """A form feed or U+2028 in a comment is no line break for Python: the edits land as
    they do without it, one line further down for the comment's line."""
    action, marker = CASES[case]
    source = (GOLDEN_DIR / f"{case}.in.py").read_text(encoding="utf-8")
    paged = "# page \x0c break \u2028 here\n" + source
    line = source.count("\n", 0, source.index(marker)) + 1
    edits = action(paged, line + 1)
    assert edits is not None
    expected = (GOLDEN_DIR / f"{case}.out.py").read_text(encoding="utf-8")
    assert apply_edits(paged, edits) == "# page \x0c break \u2028 here\n" + expected
