"""`oom-lsp estimate --html`: the traced step's memory timeline as one self-contained page
(inline SVG, a few lines of inline script; no network): allocated memory over the step's
allocations stacked by what holds it, the phases shaded, the peak marked with its op, module
and line; beside it the breakdown, top modules and top lines at the peak, and the what-if rows.
Rendered from the typed estimate result (EstimateResult, its Prediction's Timeline)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from oom_lsp.units import format_bytes

from .results import Category, EstimateResult, WhatIfTable
from .timeline import Alloc, Free, Timeline

MAX_POINTS = 1500  # samples drawn; each keeps its bucket's highest point, so the peak is drawn exactly
WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 960, 380, 78, 16, 34
COLOURS = {
    "parameters": "#4e79a7",
    "unsharded_parameters": "#6b95c4",
    "gradients": "#f28e2b",
    "ddp_buckets": "#ffbe7d",
    "optimizer_state": "#59a14f",
    "activations": "#e15759",
    "temporaries": "#b07aa1",
    "all_gather_buffers": "#9c755f",
    "reduce_scatter_buffers": "#d4a6c8",
    "inputs": "#edc948",
    "other": "#bab0ac",
    "workspaces": "#76b7b2",
}
PHASES = {"forward": "#dbe9f6", "backward": "#fbe3d0", "optimizer step": "#dcefd9"}


class Samples:
    """The stacked series: per sample, the bytes of each category and the phase."""

    def __init__(self, timeline: Timeline) -> None:
        self.categories: list[str] = []
        self.points: list[tuple[int, dict[str, int], str]] = []  # (event index, sizes, phase)
        self.peak_index = -1
        self.peak_bytes = 0
        self.peak_sizes: dict[str, int] = {}
        self.peak_event: Alloc | None = None
        self._read(timeline)

    def _read(self, timeline: Timeline) -> None:
        live: dict[int, tuple[str, int]] = {}
        sizes: dict[str, int] = {}
        phase = ""
        total = 0
        samples: list[tuple[int, int, dict[str, int], str]] = []
        for index, event in enumerate(timeline):
            if isinstance(event, Alloc):
                live[event.serial] = (event.category, event.size)
                sizes[event.category] = sizes.get(event.category, 0) + event.size
                total += event.size
                phase = event.phase or phase
                # ">=": the last time the peak is reached, as the estimate reports it (the second
                # step's, whose optimizer state is known as such).
                if total >= self.peak_bytes and total:
                    self.peak_bytes, self.peak_index, self.peak_event = total, index, event
            elif isinstance(event, Free):
                category, size = live.pop(event.serial, (None, 0))
                if category is None:
                    continue
                sizes[category] -= size
                total -= size
            else:
                held = live.get(event.serial)
                if held is None:
                    continue
                sizes[held[0]] -= held[1]
                sizes[event.category] = sizes.get(event.category, 0) + held[1]
                live[event.serial] = (event.category, held[1])
            samples.append((index, total, dict(sizes), phase))
            if index == self.peak_index:
                self.peak_sizes = dict(sizes)
        order = {category.value: category.rank for category in Category}
        self.categories = sorted({c for _, _, s, _ in samples for c in s}, key=lambda c: order.get(c, 99))
        step = max(1, -(-len(samples) // MAX_POINTS))
        for start in range(0, len(samples), step):
            bucket = samples[start : start + step]
            index, _, sizes_at, phase_at = max(bucket, key=lambda sample: sample[1])
            self.points.append((index, sizes_at, phase_at))
        self.events = len(samples)


def _svg(samples: Samples, peak_label: str) -> str:
    plot_w, plot_h = WIDTH - LEFT - 10, HEIGHT - TOP - BOTTOM
    top = max(samples.peak_bytes, 1) * 1.08
    last = max(samples.events - 1, 1)

    def x(index: int) -> float:
        return LEFT + plot_w * index / last

    def y(size: float) -> float:
        return TOP + plot_h * (1 - size / top)

    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" style="max-width:100%;height:auto" role="img" '
            'aria-label="memory timeline">'
        )
    ]
    # Phases: runs of the same phase, shaded behind the areas.
    run_start, run_phase = 0, None
    for position, (index, _, phase) in enumerate([*samples.points, (last, {}, None)]):
        if phase != run_phase or position == len(samples.points):
            if run_phase in PHASES and position:
                x0, x1 = x(samples.points[run_start][0]), x(index)
                parts.append(
                    f'<rect x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 0.5):.1f}" height="{plot_h}" '
                    f'fill="{PHASES[run_phase]}"><title>{html.escape(run_phase)}</title></rect>'
                )
            run_start, run_phase = position, phase
    # The stacked areas, bottom to top in the breakdown's order.
    below = [0] * len(samples.points)
    for category in samples.categories:
        upper = [b + sizes.get(category, 0) for b, (_, sizes, _) in zip(below, samples.points)]
        if any(u != b for u, b in zip(upper, below)):
            line = [f"{x(i):.1f},{y(u):.1f}" for (i, _, _), u in zip(samples.points, upper)]
            back = [f"{x(i):.1f},{y(b):.1f}" for (i, _, _), b in reversed(list(zip(samples.points, below)))]
            label = Category(category).label if category in Category._value2member_map_ else category
            parts.append(
                f'<polygon points="{" ".join(line + back)}" fill="{COLOURS.get(category, "#999")}" '
                f'fill-opacity="0.9"><title>{html.escape(label)}</title></polygon>'
            )
        below = upper
    # Axes: a few byte ticks.
    for tick in range(5):
        size = top * tick / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - 10}" y1="{y(size):.1f}" y2="{y(size):.1f}" stroke="#ccc" '
            f'stroke-width="0.5"/><text x="{LEFT - 6}" y="{y(size) + 4:.1f}" text-anchor="end" '
            f'font-size="11">{format_bytes(size, short=True)}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="11">'
        f"allocations and frees of the traced steps, in order ({samples.events:,} events)</text>"
    )
    # The peak.
    px, py = x(samples.peak_index), y(samples.peak_bytes)
    anchor = "end" if px > LEFT + plot_w * 0.6 else "start"
    shift = -6 if anchor == "end" else 6
    parts.append(
        f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#000" stroke-dasharray="3,3"/>'
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#000"/>'
        f'<text id="peak-label" x="{px + shift:.1f}" y="{max(py - 6, TOP + 10):.1f}" text-anchor="{anchor}" '
        f'font-size="12" font-weight="bold">{html.escape(peak_label)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


COMPARE_W, COMPARE_H, COMPARE_POINTS = 460, 130, 400


def _totals(timeline: Timeline) -> list[int]:
    """The allocated bytes after each event (what a change's chart draws: its total, not its stack)."""
    total, totals = 0, []
    for event in timeline:
        if isinstance(event, Alloc):
            total += event.size
        elif isinstance(event, Free):
            total -= event.size
        totals.append(total)
    return totals


def _polyline(totals: list[int], top: float, colour: str, width: float) -> str:
    """The totals over the chart's width (each trace spread over it: their event counts differ),
    at most COMPARE_POINTS points, each the highest of its stretch, so each peak is drawn."""
    step = max(1, -(-len(totals) // COMPARE_POINTS))
    last = max(len(totals) - 1, 1)
    points = []
    for start in range(0, len(totals), step):
        index = max(range(start, min(start + step, len(totals))), key=totals.__getitem__)
        x = LEFT + (COMPARE_W - LEFT - 10) * index / last
        y = 8 + (COMPARE_H - 28) * (1 - totals[index] / top)
        points.append(f"{x:.1f},{y:.1f}")
    return f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" stroke-width="{width}"/>'


def _compare_svg(base: list[int], change: list[int], title: str) -> str:
    """One what-if change's allocated memory (blue) over the script's own (grey), one scale."""
    top = max(max(base, default=0), max(change, default=0), 1) * 1.08
    ticks, taken = [], []
    for size in (0, max(base, default=0), max(change, default=0)):
        y = 8 + (COMPARE_H - 28) * (1 - size / top)
        if all(abs(y - other) > 11 for other in taken):  # no label over another
            taken.append(y)
            ticks.append(
                f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
                f"{format_bytes(size, short=True)}</text>"
            )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{COMPARE_W}" height="{COMPARE_H}" '
        f'viewBox="0 0 {COMPARE_W} {COMPARE_H}" role="img" aria-label="{html.escape(title)} against the script">'
        f"{''.join(ticks)}{_polyline(base, top, '#999', 1.2)}{_polyline(change, top, '#4e79a7', 1.6)}"
        f'<text x="{LEFT}" y="{COMPARE_H - 6}" font-size="10">each trace'
        f"'s events in order, spread over the width ({len(base):,} and {len(change):,})</text></svg>"
    )


def _what_if_timelines(samples_totals: list[int], what_if: WhatIfTable) -> str:
    charts = [
        f'<figure class=change data-peak-bytes="{max(totals, default=0)}"><figcaption>{html.escape(row.title)}: '
        f"allocated peak {html.escape(format_bytes(max(totals, default=0)))}</figcaption>"
        f"{_compare_svg(samples_totals, totals, row.title)}</figure>"
        for row in what_if.changes
        if row.timeline is not None
        for totals in [_totals(row.timeline)]
    ]
    if not charts:
        return ""
    return (
        "<h2>Each change's step against the script's</h2><p><small>Allocated memory of the change's "
        'traced steps (<span style="color:#4e79a7">blue</span>) over the script as it is '
        '(<span style="color:#999">grey</span>), on one scale.</small></p><div class=row>'
        + "".join(charts)
        + "</div>"
    )


def _rows(rows: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><td>{html.escape(a)}</td><td class=n>{html.escape(b)}</td></tr>" for a, b in rows)


def render_page(result: EstimateResult, what_if: WhatIfTable | None = None) -> str:
    prediction = result.prediction
    timeline = prediction.timeline
    samples = Samples(timeline)
    at = prediction.peak_at
    folder = str(Path(prediction.script).resolve().parent) + "/"

    def short(place: str) -> str:
        """A line of the script's folder named from there (the page may be opened anywhere)."""
        return place.removeprefix(folder)

    where = short(f"{at.file}:{at.line}") if at.file else "no line of the script"
    event = samples.peak_event
    op = at.op or (event.op if event else "?")
    peak_label = f"peak {format_bytes(samples.peak_bytes)}: {op}"
    title = f"oom-lsp: memory timeline of {Path(prediction.script).name}"
    legend = "".join(
        f'<span class=key><i style="background:{COLOURS.get(c, "#999")}"></i>'
        f"{html.escape(Category(c).label if c in Category._value2member_map_ else c)}</span>"
        for c in samples.categories
    ) + "".join(
        f'<span class=key><i style="background:{colour}"></i>{html.escape(phase)} (shaded)</span>'
        for phase, colour in PHASES.items()
    )
    order = {category.value: category.rank for category in Category}
    breakdown = [
        (Category(c).label if c in Category._value2member_map_ else c, format_bytes(size))
        for c, size in sorted(samples.peak_sizes.items(), key=lambda item: order.get(item[0], 99))
        if size > 0
    ]
    target = (
        f"{prediction.gpu.name} ({format_bytes(prediction.gpu.memory)})"
        if prediction.gpu
        else "no target GPU given"
    )
    verdict = prediction.verdict.value if prediction.verdict is not None else ""
    what_if_html = ""
    if what_if is not None:
        rows = "".join(
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td>{}</td></tr>".format(
                html.escape(row.title),
                html.escape(format_bytes(row.needed_bytes)) if row.needed_bytes is not None else "",
                html.escape(format_bytes(row.peak_bytes)) if row.peak_bytes is not None else "",
                html.escape(
                    f"{format_bytes(row.saving_bytes)} ({row.saving_percent:.1f}%)"
                    if row.saving_bytes is not None and row.saving_percent is not None
                    else (row.error or "")
                ),
                html.escape(row.verdict.value if row.verdict is not None else ""),
            )
            for row in what_if.changes
        )
        base = what_if.baseline
        what_if_html = (
            "<h2>What if</h2><p>Each change traced alone, as <code>oom-lsp estimate --what-if</code> prints it: "
            "<i>needed</i> is what the verdict uses (reserved memory and the CUDA context on cuda), "
            f"{html.escape(format_bytes(base.needed_bytes))} as the script is "
            f"(allocated {html.escape(format_bytes(base.peak_bytes))}).</p>"
            "<table><tr><th>change</th><th>needed</th><th>allocated</th><th>saves</th><th>verdict</th></tr>"
            + rows
            + "</table>"
            + _what_if_timelines(_totals(timeline), what_if)
        )
    summary = {
        "peak_bytes": samples.peak_bytes,
        "estimate_peak_bytes": prediction.peak_bytes,
        "peak_op": op,
        "peak_module": at.module,
        "peak_line": where,
        "peak_phase": at.phase,
    }
    summary_json = json.dumps(summary).replace("</", "<\\/")  # no "</script>" inside the script
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:20px;color:#222}}
.row{{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}}
table{{border-collapse:collapse;margin:4px 0 14px}}td,th{{padding:2px 10px 2px 0;text-align:left}}
.n{{text-align:right;font-variant-numeric:tabular-nums}}h2{{font-size:15px;margin:10px 0 2px}}
.key{{margin-right:12px;white-space:nowrap}}.key i{{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}}
.peak{{font-weight:bold}}small{{color:#666}}figure{{margin:4px 0}}figcaption{{font-size:13px}}
</style></head><body>
<h1 style="font-size:18px">{html.escape(title)}</h1>
<p class=peak id=peak data-peak-bytes="{samples.peak_bytes}">Allocated peak {html.escape(format_bytes(samples.peak_bytes))}
({samples.peak_bytes:,} bytes) at {html.escape(op)} in {html.escape(at.module or "(outside modules)")},
{html.escape(where)}, during {html.escape(at.phase or "the step")}.</p>
<p><small>{html.escape(prediction.method)}; device {html.escape(prediction.device)}; target {html.escape(target)}{
html.escape(", " + verdict) if verdict else ""}. Allocated memory as torch.cuda.memory_allocated() would count it (without the
allocator's cache and the CUDA context; see docs/estimate.md).</small></p>
<div>{legend}</div>
<div class=row><div>{_svg(samples, peak_label)}</div>
<div><h2>At the peak</h2><table>{_rows(breakdown)}</table>
<h2>Top modules</h2><table>{_rows([(name or "(outside modules)", format_bytes(size)) for name, size in prediction.top_modules])}</table>
<h2>Top lines</h2><table>{_rows([(short(place) if place else "(no line of the script)", format_bytes(size)) for place, size in prediction.top_lines])}</table>
</div></div>
{what_if_html}
<script type="application/json" id="summary">{summary_json}</script>
</body></html>
"""


def write_page(result: EstimateResult, what_if: Any, path: Path) -> None:
    path.write_text(render_page(result, what_if), encoding="utf-8")
