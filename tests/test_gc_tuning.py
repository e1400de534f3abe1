"""The collection run before an editor's analysis: the young generation is
emptied, and the generation collected is the one the collector would pick."""

from __future__ import annotations

import gc

import pytest

from oom_lsp.gc_tuning import collect_before_analysis


@pytest.fixture
def collections():
    """The generation of every collection that starts, with automatic ones off."""
    started: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.disable()
    gc.callbacks.append(record)
    try:
        yield started
    finally:
        gc.callbacks.remove(record)
        gc.enable()


def test_the_young_generation_is_emptied(collections: list[int]) -> None:
    left = [[index] for index in range(1000)]
    assert gc.get_count()[0] >= len(left)
    collect_before_analysis()
    assert collections == [0]
    assert gc.get_count()[0] < 10


def test_nothing_is_collected_when_nothing_was_allocated(collections: list[int]) -> None:
    collect_before_analysis()
    collections.clear()
    collect_before_analysis()
    assert collections == []


@pytest.mark.parametrize("generation", [1, 2])
def test_an_older_generation_is_collected_when_its_turn_has_come(
    collections: list[int], generation: int
) -> None:
    # Each collection of generation N - 1 counts one for generation N.
    for _ in range(gc.get_threshold()[generation] + 1):
        gc.collect(generation - 1)
    collections.clear()
    collect_before_analysis()
    assert collections == [generation]
    assert gc.get_count()[generation] == 0
