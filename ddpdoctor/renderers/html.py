"""The HTML view: one self-contained file (inline CSS, JS, SVG charts; no network) with every trace-derived string escaped."""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from ddpdoctor.findings.model import Finding, ordered
from ddpdoctor.report import Report

# The embedded data is capped so a 1,000-rank report stays a file a browser opens; tables say what was left out.
MAX_CALLS_EMBEDDED = 20000
MAX_CALL_ROWS = 500


def esc(value: Any) -> str:
    """Text for HTML element content and quoted attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def script_json(data: Any) -> str:
    """JSON safe to place inside <script type="application/json">: no "</script>", "<!--" or line separators.

    json.dumps escapes quotes and backslashes; escaping <, > and & as \\uXXXX stops the HTML parser from ever
    seeing a tag inside the data, whatever names the trace held.
    """
    text = json.dumps(data, default=str, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _asset(name: str) -> str:
    text = resources.files("ddpdoctor.renderers").joinpath("assets").joinpath(name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"asset {name} would end its own element early")
    return text


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _ms(us: Any) -> str:
    return f"{us / 1000.0:.2f}" if _real(us) else "-"


def _pct(v: Any) -> str:
    return f"{v:.1f}%" if _real(v) else "-"


def _finite(data: Any) -> Any:
    """NaN/inf have no JSON spelling: they become null here (the analyses should never produce them)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {str(k): _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _chart_data(report: Report) -> dict[str, Any]:
    s = report.sections
    coll = dict(s.get("collectives") or {})
    calls = coll.get("calls") or []
    if len(calls) > MAX_CALLS_EMBEDDED:
        coll["calls"] = calls[:MAX_CALLS_EMBEDDED]
    coll.pop("grad_ready", None)  # not drawn; can be large
    return _finite({"ranks": s.get("ranks") or [], "collectives": coll, "stragglers": s.get("stragglers") or {}})


def _findings_html(findings: list[Finding]) -> str:
    if not findings:
        return '<p class="status-ok">No findings.</p>'
    out = []
    for f in ordered(findings):
        sev = f.severity.value
        ranks = ", ".join(str(r) for r in f.ranks[:32]) + (" …" if len(f.ranks) > 32 else "")
        evidence = json.dumps(f.evidence, indent=1, default=str) if f.evidence else ""
        out.append(
            f'<div class="finding {esc(sev)}"><span class="sev sev-{esc(sev)}">{esc(sev)}</span> '
            f"<b>{esc(f.title)}</b> <code>{esc(f.id)}</code>"
            + (f' <span class="note">ranks {esc(ranks)}</span>' if ranks else "")
            + (f'<div class="advice">→ {esc(f.advice)}</div>' if f.advice else "")
            + (f'<details><summary class="note">evidence</summary><div class="evidence">{esc(evidence)}</div></details>'
               if evidence else "")
            + "</div>"
        )
    return "\n".join(out)


def _table(headers: list[str], rows: list[list[Any]], left: int = 0) -> str:
    """A table; the first ``left`` columns are text (left-aligned). Every cell is escaped."""
    head = "".join(f'<th class="{"l" if i < left else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{esc(c)}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ranks_html(ranks: list[dict[str, Any]], stragglers: list[int]) -> str:
    rows = []
    for r in ranks:
        st = r.get("step_time_us") or {}
        rows.append([
            f"{r.get('rank')}{' (straggler)' if r.get('rank') in stragglers else ''}", r.get("device", "-"),
            len(r["steps"]) if isinstance(r.get("steps"), list) else r.get("steps", "-"), _ms(st.get("median")), _ms(st.get("p90")), _ms(r.get("compute_us")),
            _ms(r.get("comm_us")), "no comm" if r.get("comm_us") == 0 else _pct(r.get("overlap_pct")),
            _ms(r.get("exposed_comm_us")), _pct(r.get("exposed_comm_pct")), _ms(r.get("idle_us")),
            _ms(r.get("data_wait_us")),
        ])
    return _table(["rank", "device", "steps", "step ms (median)", "p90", "compute ms", "comm ms", "overlap",
                   "exposed ms", "exposed % of step", "idle ms", "data wait ms"], rows, left=2)


def _collectives_html(coll: dict[str, Any]) -> str:
    parts = []
    by_op = coll.get("by_op") or {}
    if by_op:
        parts.append(_table(["op", "count", "MB", "time ms"], [
            [op, v.get("count"), f"{(v.get('bytes') or 0) / 1e6:.2f}", _ms(v.get("time_us"))]
            for op, v in sorted(by_op.items())], left=1))
    bw = coll.get("bandwidth") or {}
    if bw.get("bytes_per_us"):
        latency, rate = float(bw.get("latency_us") or 0.0), float(bw["bytes_per_us"])
        parts.append(f'<p class="note">Fitted from this run: duration = {latency:.1f} µs + bytes / {rate:.1f} B/µs '
                     f'({esc(bw.get("points"))} collectives).</p>')
    calls = coll.get("calls") or []
    if calls:
        rows = [[c.get("rank"), c.get("step"), c.get("index"), c.get("op"), c.get("group"), c.get("seq"),
                 f"{(c.get('bytes') or 0) / 1e6:.3f}", _ms(c.get("dur_us")), _ms(c.get("start_rel_backward_us")),
                 "-" if c.get("algbw_gbps") is None else f"{c['algbw_gbps']:.3f}",
                 "-" if c.get("busbw_gbps") is None else f"{c['busbw_gbps']:.3f}"] for c in calls[:MAX_CALL_ROWS]]
        parts.append('<div class="scroll">' + _table(
            ["rank", "step", "#", "op", "group", "seq", "MB", "dur ms", "start vs backward ms", "algbw GB/s",
             "busbw GB/s"], rows) + "</div>")
        if len(calls) > MAX_CALL_ROWS:
            parts.append(f'<p class="note">{len(calls) - MAX_CALL_ROWS} more calls in report.json.</p>')
    buckets = coll.get("buckets") or []
    if buckets:
        rows = [[b.get("rank"), b.get("step"), b.get("index"), "yes" if b.get("is_last") else "",
                 f"{(b.get('bytes') or 0) / 1e6:.3f}", _ms(b.get("dur_us")), _ms(b.get("after_backward_end_us"))]
                for b in buckets[:MAX_CALL_ROWS]]
        parts.append("<h3>DDP gradient buckets</h3>" + '<div class="scroll">' + _table(
            ["rank", "step", "bucket", "last", "MB", "dur ms", "after backward end ms"], rows) + "</div>")
    return "\n".join(parts) or '<p class="note">No collectives in the traces.</p>'


def _ddp_html(ddp: Any) -> str:
    if not ddp:
        return ""
    rows = []
    for m in ddp if isinstance(ddp, list) else [ddp]:
        if isinstance(m, dict):
            rows.append([m.get("rank", "-"), m.get("module_class", "-"), m.get("bucket_cap_mb", "-"),
                         m.get("find_unused_parameters", "-"), m.get("static_graph", "-"),
                         m.get("gradient_as_bucket_view", "-"), len(m.get("buckets") or [])])
    return "<section><h2>DDP configuration</h2>" + _table(
        ["rank", "module", "bucket_cap_mb", "find_unused_parameters", "static_graph", "gradient_as_bucket_view",
         "buckets"], rows, left=2) + "</section>"


def render_html(report: Report) -> str:
    """The whole report as one HTML document string."""
    s = report.sections
    ranks = s.get("ranks") or []
    stragglers = list((s.get("stragglers") or {}).get("ranks") or [])
    from ddpdoctor import __version__

    meta = [f"ddpdoctor {__version__}", f"{len(ranks)} rank(s)"]
    if s.get("run_dir"):
        meta.append(f"run {s['run_dir']}")
    if s.get("window"):
        meta.append(f"window: {s['window']}")
    notes = "".join(f'<p class="note">note: {esc(n)}</p>' for n in report.notes)
    straggler_text = (f"Straggler rank(s): {', '.join(str(r) for r in stragglers)}." if stragglers
                      else "No straggler rank found.")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ddpdoctor {esc(report.command)}: {esc(report.status)}</title>
<style>{_asset("report.css")}</style>
<script>window.addEventListener("error", function (e) {{
  document.documentElement.setAttribute("data-error", String(e.message || e));
}});</script>
</head><body>
<header><h1>ddpdoctor {esc(report.command)}: <span class="status-{esc(report.status)}">{esc(report.status)}</span></h1>
<div class="meta">{esc(" · ".join(meta))}</div></header>
<main>
<noscript><p class="noscript">Charts need JavaScript; the tables below do not.</p></noscript>
<section id="findings"><h2>Findings</h2>{_findings_html(report.findings)}{notes}</section>
<section id="ranks"><h2>Per rank</h2><div class="scroll">{_ranks_html(ranks, stragglers)}</div></section>
<section id="timeline"><h2>Timeline of a step <select id="step-select" aria-label="step"></select></h2>
<div class="legend"><span><i style="background:#e5eaf1"></i>step</span><span><i style="background:#3b82f6"></i>backward</span>
<span><i style="background:#f59e0b"></i>gradient bucket all_reduce</span><span><i style="background:#dc2626"></i>last bucket</span>
<span><i style="background:#9ca3af"></i>other collective</span><span>* straggler</span></div>
<div class="chart" id="chart-timeline"></div>
<p class="note">Times on rank 0's clock after alignment on matched collectives; hover a bar for numbers.</p></section>
<section id="overlap"><h2>Overlapped and exposed communication per rank</h2>
<div class="legend"><span><i style="background:#16a34a"></i>overlapped with compute</span><span><i style="background:#dc2626"></i>exposed</span></div>
<div class="chart" id="chart-overlap"></div></section>
<section id="stragglers"><h2>Stragglers</h2><p>{esc(straggler_text)}</p><div class="chart" id="chart-stragglers"></div></section>
<section id="collectives"><h2>Collectives</h2>{_collectives_html(s.get("collectives") or {})}</section>
{_ddp_html(s.get("ddp"))}
</main>
<script type="application/json" id="ddpdoctor-data">{script_json(_chart_data(report))}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def write_html(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
    return path
