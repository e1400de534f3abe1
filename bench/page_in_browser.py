"""Issue 32's browser goal: the `oom-lsp estimate --html` page opened in a real headless Chromium.
For each script (default: the fixture scripts of bench/timeline_exports.py), writes the page, loads
it in Chromium with a probe script appended (layout measured by the browser, not by us), and prints
whether it rendered (the chart's box, the stacked areas), whether the peak is shown (the marker is
the element painted at its own centre, its label inside the chart, the label's bytes equal to the
estimate's `peak_bytes`), and how long Chromium took. `--screenshot PNG` writes the first
script's page as Chromium draws it (the README's and docs/estimate.md's picture).

    .venv/bin/python bench/page_in_browser.py [--screenshot docs/images/estimate-timeline.png] [SCRIPT.py ...]

Chromium: $OOM_LSP_CHROMIUM, or chromium / chromium-browser / google-chrome on PATH (Debian:
apt-get install chromium). Exit 1 when a page fails a check, 2 when no Chromium is found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["mlp.py", "cnn.py", "gpt.py", "lstm.py", "unet.py", "vit.py", "encoder_bf16.py", "finetune_frozen.py"]

# Appended to a copy of the page: measures what Chromium laid out and writes it into the DOM,
# which --dump-dom prints after the load event.
PROBE = """<script>
window.addEventListener("load", () => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const svg = document.querySelector("svg");
  const label = document.getElementById("peak-label");
  const dot = svg.querySelector("circle");
  const d = dot.getBoundingClientRect();
  const hit = document.elementFromPoint(d.left + d.width / 2, d.top + d.height / 2);
  const probe = {
    svg: box(svg), label: box(label), dot: box(dot), label_text: label.textContent,
    headline: document.getElementById("peak").innerText,
    peak_bytes: Number(document.getElementById("peak").dataset.peakBytes),
    areas: svg.querySelectorAll("polygon").length,
    painted_at_dot: hit ? hit.tagName.toLowerCase() : null,
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>"""


def find_chromium() -> str | None:
    named = os.environ.get("OOM_LSP_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def _chromium(chromium: str, *args: str, size: str = "1400,900") -> subprocess.CompletedProcess[str]:
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        f"--window-size={size}", "--virtual-time-budget=3000", *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def probe_page(page: Path, chromium: str) -> dict:
    """What Chromium laid out for the page (see PROBE); raises RuntimeError when it printed no probe."""
    with tempfile.TemporaryDirectory(prefix="oom-lsp-browser-") as tmp:
        copy = Path(tmp) / "probed.html"
        copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
        result = _chromium(chromium, "--dump-dom", copy.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.DOTALL)
    if not found:
        raise RuntimeError(f"Chromium printed no probe (exit {result.returncode}): {result.stderr.strip()[-300:]}")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def failures(probe: dict, estimate_peak: int) -> list[str]:
    """The checks the goal asks: the chart rendered, the peak shown, with the estimate's bytes."""
    wrong = []
    sx, sy, sw, sh = probe["svg"]
    if sw < 400 or sh < 200 or probe["areas"] == 0:
        wrong.append(f"chart not rendered (box {sw:.0f}x{sh:.0f}, {probe['areas']} areas)")
    if probe["painted_at_dot"] != "circle":
        wrong.append(f"the peak marker is not what is painted at its centre ({probe['painted_at_dot']})")
    lx, ly, lw, lh = probe["label"]
    if lw <= 0 or not (sx <= lx and lx + lw <= sx + sw and sy <= ly and ly + lh <= sy + sh):
        wrong.append("the peak's label is not inside the chart")
    if probe["peak_bytes"] != estimate_peak or f"({estimate_peak:,} bytes)" not in probe["headline"]:
        wrong.append(f"the page shows {probe['peak_bytes']} bytes, the estimate {estimate_peak}")
    return wrong


def _trim(png: Path) -> None:
    """Cut the window's blank right and bottom off the screenshot (Pillow, of the bench extra)."""
    from PIL import Image, ImageChops

    image = Image.open(png).convert("RGB")
    page = image.crop((0, 0, image.width - 20, image.height))  # not the scrollbar's column
    box = ImageChops.difference(page, Image.new("RGB", page.size, (255, 255, 255))).getbbox()
    if box:
        image.crop((0, 0, min(image.width, box[2] + 16), min(image.height, box[3] + 16))).save(png, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scripts", nargs="*", type=Path)
    parser.add_argument("--screenshot", type=Path, help="write the first script's page as Chromium draws it")
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found (set OOM_LSP_CHROMIUM, or apt-get install chromium)")
        return 2
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"browser: {version}")
    scripts = args.scripts or [ROOT / "fixtures" / "estimate" / name for name in SCRIPTS]
    bad = 0
    print(f"{'script':<20} {'peak (B)':>12}  {'rendered':<8} {'peak shown':<10} {'label':<44} chromium s")
    for number, script in enumerate(scripts):
        with tempfile.TemporaryDirectory(prefix="oom-lsp-browser-page-") as tmp:
            folder = Path(tmp)
            shutil.copy(script, folder)
            run = subprocess.run(
                [sys.executable, "-m", "oom_lsp", "estimate", script.name, "--format", "json", "--html", "p.html"],
                cwd=folder, capture_output=True, text=True, timeout=900, check=False,
            )
            if not (folder / "p.html").exists():
                bad += 1
                print(f"{script.name:<20} no page: {(run.stdout + run.stderr).strip().splitlines()[-1:]}")
                continue
            peak = json.loads(run.stdout)["peak_bytes"]
            started = time.perf_counter()
            probe = probe_page(folder / "p.html", chromium)
            seconds = time.perf_counter() - started
            wrong = failures(probe, peak)
            bad += bool(wrong)
            rendered = not any(w.startswith("chart") for w in wrong)
            print(
                f"{script.name:<20} {peak:>12,}  {'yes' if rendered else 'NO':<8} "
                f"{'yes' if not wrong else 'NO':<10} {probe['label_text'][:44]:<44} {seconds:.1f}"
            )
            for reason in wrong:
                print(f"    {reason}")
            if number == 0 and args.screenshot:
                shot = _chromium(
                    chromium, f"--screenshot={args.screenshot.resolve()}", (folder / "p.html").as_uri(), size="1400,1000"
                )
                if not args.screenshot.exists():
                    print(f"no screenshot: {shot.stderr.strip()[-300:]}")
                    bad += 1
                else:
                    _trim(args.screenshot)
    print(f"{len(scripts) - bad} of {len(scripts)} pages render in Chromium and show the estimate's peak")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
