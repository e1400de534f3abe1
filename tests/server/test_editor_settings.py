"""Parsing the `oomLsp` editor settings (pure, no server)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from oom_lsp.server.settings import LintSettingsSource, parse_editor_settings, unwrap

FLAT = {"maxBatchSize": 64, "logLevel": "debug"}


@pytest.mark.parametrize(
    "payload",
    [FLAT, {"settings": FLAT}, {"oomLsp": FLAT}, {"settings": {"oomLsp": FLAT}}],
    ids=["flat", "settings", "oomLsp", "settings.oomLsp"],
)
def test_every_accepted_shape_unwraps_to_the_same_object(payload):
    assert unwrap(payload) == FLAT


@pytest.mark.parametrize("payload", [None, [], "oomLsp"])
def test_no_settings(payload):
    assert unwrap(payload) is None


def test_server_and_command_keys_are_not_lint_keys():
    parsed = parse_editor_settings(
        {
            "select": ["OOM5"],
            "logLevel": "warning",
            "logFile": "~/oom.log",
            "debounceMs": 10,
            "interpreter": ["/venv/bin/python"],
            "gpu": "A100",
            "profile": {"steps": 2},
        }
    )
    assert parsed.lint == {"select": ["OOM5"]}
    assert parsed.log_level == logging.WARNING
    assert parsed.log_file is not None and parsed.log_file.endswith("/oom.log") and "~" not in parsed.log_file
    assert parsed.debounce_seconds == 0.01
    assert parsed.commands == {"interpreter": ["/venv/bin/python"], "gpu": "A100", "profile": {"steps": 2}}


@pytest.mark.parametrize(
    "bad",
    [{"logLevel": "loud"}, {"logFile": 3}, {"debounceMs": -1}, {"debounceMs": True}, {"debounceMs": "fast"}],
)
def test_bad_server_values_fall_back_to_defaults(bad):
    parsed = parse_editor_settings(bad)
    assert parsed.log_level == logging.INFO
    assert parsed.log_file is None
    assert parsed.debounce_seconds == 0.075


def test_lint_settings_from_the_editor_with_a_bad_key(tmp_path: Path):
    reported: list[str] = []
    source = LintSettingsSource(tmp_path, reported.append)
    source.update_editor_settings(parse_editor_settings({"ignore": ["OOM501"], "maxBatchSize": "big"}))
    settings = source.for_path(tmp_path / "train.py")
    assert settings is not None and "OOM501" not in settings.enabled
    assert settings.max_batch_size == 32
    assert reported == [
        "Ignoring oomLsp.maxBatchSize: editor settings max-batch-size: expected a positive integer, got 'big'"
    ]
    # An untitled buffer gets the same editor settings.
    untitled = source.for_path(None)
    assert untitled is not None and "OOM501" not in untitled.enabled
