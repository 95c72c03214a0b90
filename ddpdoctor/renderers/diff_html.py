"""The HTML view of a diff: the two runs' step composition side by side (inline SVG, no script needed), the
contributors and what else changed; a section of profile's report.html and a page of its own for `diff --html`."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.renderers.html import _asset, _findings_html, esc, render_html, write_page
from ddpdoctor.report import Report
from ddpdoctor.reports.diff_json import CompositionJson, DeltaJson, DiffJson
from ddpdoctor.reports.sections import DiffSection

COLOURS = {"compute": "#3b82f6", "exposed_comm": "#dc2626", "data_wait": "#f59e0b", "idle": "#9ca3af",
           "data": "#f59e0b", "forward": "#60a5fa", "backward": "#1d4ed8", "optimizer": "#16a34a"}
GROUPS = (("by what ran", ("compute", "exposed_comm", "data_wait", "idle")),
          ("by phase", ("data", "forward", "backward", "optimizer")))


def _bars(comp: CompositionJson, parts: tuple[str, ...], title: str) -> str:
    """Two horizontal stacked bars (base, new), one scale: the longer step fills the width."""
    width, bar_h, label_w = 640.0, 26, 48
    by_side = {"base": comp.get("base") or {}, "new": comp.get("new") or {}}
    longest = max((sum(by_side[side].get(p, 0.0) for p in parts) for side in by_side), default=0.0) or 1.0
    rows = []
    for i, side in enumerate(by_side):
        x, y = float(label_w), 8 + i * (bar_h + 10)
        rows.append(f'<text x="0" y="{y + 18}" font-size="12">{side}</text>')
        for p in parts:
            ms = by_side[side].get(p, 0.0)
            w = (width - label_w) * ms / longest
            if w <= 0:
                continue
            rows.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLOURS[p]}">'
                        f"<title>{esc(side)} {esc(p)}: {ms:.2f} ms per step</title></rect>")
            x += w
        total = sum(by_side[side].get(p, 0.0) for p in parts)
        rows.append(f'<text x="{min(x + 4, width + 4):.1f}" y="{y + 18}" font-size="12">{total:.2f} ms</text>')
    legend = "".join(f'<span><i style="background:{COLOURS[p]}"></i>{esc(p)}</span>' for p in parts)
    return (f"<h3>{esc(title)}</h3><div class=\"legend\">{legend}</div>"
            f'<svg class="diff-bars" role="img" aria-label="{esc(title)}" width="{width + 80:.0f}" '
            f'height="{2 * (bar_h + 10) + 8}" viewBox="0 0 {width + 80:.0f} {2 * (bar_h + 10) + 8}">'
            + "".join(rows) + "</svg>")


def _delta(d: DeltaJson) -> str:
    dm = d.get("delta_ms") or {}
    lo, hi = (dm.get("interval") or [0, 0])[:2]
    return f"{dm.get('value', 0):+.2f} ms [{lo:+.2f}, {hi:+.2f}]"


def diff_of(report: Report) -> DiffJson:
    """The report's "diff" object ({} when it has none)."""
    section = report.section(DiffSection)
    return section.diff if section is not None else {}


def diff_section_html(d: DiffJson) -> str:
    """The <section id="diff"> of a report that carries a "diff" section."""
    comp = d.get("composition_ms") or {}
    if not isinstance(comp.get("base"), dict) or not isinstance(comp.get("new"), dict):
        return ""
    step = d.get("step") or {}
    rows = "".join(
        f"<tr><td>{esc(c['component'])} ({esc(c['kind'])})</td><td>{esc(','.join(map(str, c['ranks'])))}</td>"
        f"<td>{c['base_ms']:.2f}</td><td>{c['new_ms']:.2f}</td><td>{esc(_delta(c))}</td></tr>"
        for c in d.get("contributors") or [])
    changes = "".join(f"<tr><td>{esc(c['key'])}</td><td>{esc(c['base'])}</td><td>{esc(c['new'])}</td>"
                      f"<td>{esc(', '.join(c['explains']))}</td></tr>" for c in d.get("changes") or [])
    ops = "".join(f"<tr><td>{esc(o['name'])}</td><td>{esc(o['kind'])}</td><td>{esc(o['rank'])}</td>"
                  f"<td>{o['base_ms']:.2f}</td><td>{o['new_ms']:.2f}</td><td>{esc(_delta(o))}</td></tr>"
                  for o in d.get("operators") or [])
    charts = "".join(_bars(comp, parts, f"Step composition {title} (mean ms per step)") for title, parts in GROUPS)
    return (f'<section id="diff"><h2>Against the baseline</h2>'
            f"<p>base {esc(d.get('base'))} → new {esc(d.get('new'))}: step {step.get('base_ms', 0):.2f} → "
            f"{step.get('new_ms', 0):.2f} ms, {esc(_delta(step))}"
            f"{' (beyond noise)' if step.get('significant') else ' (within noise)'}</p>{charts}"
            "<h3>Where the step changed</h3>"
            + (f"<table><tr><th>part</th><th>ranks</th><th>base ms</th><th>new ms</th><th>change (90%)</th></tr>"
               f"{rows}</table>" if rows else "<p>No part changed beyond noise.</p>")
            + (f"<h3>Operators whose time changed</h3><table><tr><th>operator</th><th>kind</th><th>rank</th>"
               f"<th>base ms</th><th>new ms</th><th>change (90%)</th></tr>{ops}</table>" if ops else "")
            + "<h3>What else changed (recorded; a lead, not a cause)</h3>"
            + (f"<table><tr><th>fact</th><th>base</th><th>new</th><th>could move</th></tr>{changes}</table>"
               if changes else "<p>Nothing recorded differs.</p>") + "</section>")


def render_report_html(report: Report) -> str:
    """A run's report page (report.html, the TensorBoard tab) with its diff against a baseline where it has one."""
    return render_html(report, diff_section_html(diff_of(report)))


def render_diff_html(report: Report) -> str:
    d = diff_of(report)
    notes = "".join(f'<p class="note">note: {esc(n)}</p>' for n in report.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>ddpdoctor diff: {esc(report.status)}</title><style>{_asset("report.css")}</style></head><body>
<header><h1>ddpdoctor diff: <span class="status-{esc(report.status)}">{esc(report.status)}</span></h1></header>
<main><section id="findings"><h2>Findings</h2>{_findings_html(report.findings)}{notes}</section>
{diff_section_html(d)}</main></body></html>
"""


def write_diff_html(report: Report, path: Path) -> Path:
    """Atomically, like the report's own HTML. Raises OSError."""
    return write_page(render_diff_html(report), path)
