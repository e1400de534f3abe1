"""The `--html` page opened in a real headless Chromium (issue 32): it renders, and shows the
estimate's peak where the chart marks it. Skipped where no Chromium is installed
(apt-get install chromium, or $OOM_LSP_CHROMIUM); the probe is bench/page_in_browser.py's."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests import console

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("page_in_browser", ROOT / "bench" / "page_in_browser.py")
assert _spec is not None and _spec.loader is not None
browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(browser)

CHROMIUM = browser.find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, int]:
    folder = tmp_path_factory.mktemp("page")
    shutil.copy(ROOT / "fixtures" / "estimate" / "mlp.py", folder)
    result = console.run(["estimate", "mlp.py", "--format", "json", "--html", "p.html"], folder)
    assert result.returncode in (0, 1), result.stderr
    return folder / "p.html", json.loads(result.stdout)["peak_bytes"]


def test_chromium_renders_the_page_and_shows_the_estimate_s_peak(page):
    path, peak = page
    probe = browser.probe_page(path, CHROMIUM)
    assert browser.failures(probe, peak) == []
    assert probe["areas"] >= 4  # parameters, gradients, optimizer state, activations at least
    assert probe["painted_at_dot"] == "circle"
    assert probe["label_text"].startswith("peak ") and "aten." in probe["label_text"]
    assert f"({peak:,} bytes)" in probe["headline"]


def test_the_probe_fails_a_page_whose_peak_marker_is_hidden_or_whose_bytes_differ(page, tmp_path):
    path, peak = page
    text = path.read_text()
    hidden = tmp_path / "hidden.html"
    hidden.write_text(text.replace('r="4" fill="#000"/>', 'r="4" fill="#000" style="display:none"/>'))
    assert any("marker" in reason for reason in browser.failures(browser.probe_page(hidden, CHROMIUM), peak))
    off = tmp_path / "off.html"
    off.write_text(text.replace(f'data-peak-bytes="{peak}"', f'data-peak-bytes="{peak + 512}"'))
    assert any("bytes" in reason for reason in browser.failures(browser.probe_page(off, CHROMIUM), peak))
