"""The HTML view: one self-contained file (inline CSS, JS, SVG charts; no network) with every trace-derived string escaped."""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from ddpdoctor.findings.model import Finding, ordered
from ddpdoctor.jsontypes import JsonValue
from ddpdoctor.renderers.rank_classes import ranges_text
from ddpdoctor.report import Report
from ddpdoctor.reports.perf_json import CollectivesJson, RankJson
from ddpdoctor.reports.sections import (
    JobOutcome,
    JobSection,
    PerfSection,
    RunDirSection,
    TuneSection,
    section_of,
)
from ddpdoctor.safe_io import write_atomic

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


def _chart_data(perf: PerfSection | None) -> JsonValue:
    """What the charts draw (assets/report.js), as JSON."""
    coll: CollectivesJson = {**((perf.collectives if perf else None) or {})}
    calls = coll.get("calls") or []
    if len(calls) > MAX_CALLS_EMBEDDED:
        coll["calls"] = calls[:MAX_CALLS_EMBEDDED]
    coll.pop("grad_ready", None)  # not drawn; can be large
    return _finite({"ranks": (perf.ranks if perf else None) or [], "collectives": coll,
                    "stragglers": (perf.stragglers if perf else None) or {}, "whatif": (perf.whatif if perf else None) or {}})


def _findings_html(findings: list[Finding]) -> str:
    if not findings:
        return '<p class="status-ok">No findings.</p>'
    out = []
    for f in ordered(findings):
        sev = f.severity.value
        ranks = ranges_text(f.ranks, 120)
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


def _ranks_html(ranks: list[RankJson], stragglers: list[int]) -> str:
    """Every rank when few; above MAX_RANK_ROWS, the ranks that matter and classes of alike ranks
    (renderers/rank_classes.py), with every rank's row folded away below them."""
    from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS, group_ranks, legend

    groups = group_ranks(ranks, stragglers, MAX_RANK_ROWS)
    if groups is None:
        return _rank_rows_html([(f"{r.get('rank')}{' (straggler)' if r.get('rank') in stragglers else ''}", r)
                                for r in ranks])
    stepless = not any((r.get("step_time_us") or {}).get("median") for r in ranks)
    grouped = _rank_rows_html([(f"{g.short_ranges(40)}: {g.label}", g.row) for g in groups])
    return (f'<p class="note">{len(ranks)} ranks: {esc(legend(stepless))}.</p>{grouped}'
            f"<details><summary>every rank ({len(ranks)} rows)</summary>"
            + _rank_rows_html([(f"{r.get('rank')}{' (straggler)' if r.get('rank') in stragglers else ''}", r)
                               for r in ranks]) + "</details>")


def _rank_rows_html(labelled: list[tuple[str, RankJson]]) -> str:
    from ddpdoctor.renderers.console_perf import per_step

    rows = []
    for label, r in labelled:
        st = r.get("step_time_us") or {}
        steps = r.get("steps", "-")
        rows.append([
            label, r.get("device", "-"), len(steps) if isinstance(steps, list) else steps, _ms(st.get("median")),
            _ms(st.get("p90")), _ms(per_step(r, "compute_us")), _ms(per_step(r, "comm_us")),
            "no comm" if r.get("comm_us") == 0 else _pct(r.get("overlap_pct")),
            _ms(per_step(r, "exposed_comm_us")), _pct(r.get("exposed_comm_pct")), _ms(per_step(r, "idle_us")),
            _ms(per_step(r, "data_wait_us")),
        ])
    return _table(["rank", "device", "steps recorded", "step ms (median)", "step ms (p90)", "compute ms",
                   "comm ms", "overlap", "exposed comm ms", "exposed % of step", "idle ms", "data wait ms"],
                  rows, left=2)


DEFINITIONS = {
    "overlap": "the share of communication time during which compute ran too, so the communication was hidden "
               "behind it: 100 × |communication ∩ compute| / |communication|.",
    "exposed communication": "communication time with no compute running: the step waits for it. Its share of "
                             "the step is what faster communication or better overlap can save.",
    "idle": "time in the step with neither compute nor communication (data loading, Python, synchronisation).",
    "arrival skew": "for one collective matched across ranks, the latest rank's start minus the earliest "
                    "rank's: how long the first rank waited for the last.",
    "caused wait": "the time the other ranks spent waiting for this rank, summed over matched collectives; the "
                   "rank that arrives last most often and makes the others wait is the straggler.",
}


def _defs(*terms: str) -> str:
    return '<dl class="defs">' + "".join(f"<dt>{esc(t)}</dt><dd>{esc(DEFINITIONS[t])}</dd>" for t in terms) + "</dl>"


def _command_line(run_dir: Any) -> str | None:
    """`ddpdoctor profile ...` as the run's manifest recorded it (None for bare traces)."""
    if not run_dir:
        return None
    try:
        from ddpdoctor.safe_io import loads_json, read_text

        manifest = loads_json(read_text(Path(str(run_dir)) / "manifest.json", 4 << 20))
    except (OSError, ValueError, Exception):  # noqa: BLE001 - a missing or odd manifest only hides the command
        return None
    argv = manifest.get("command_line") if isinstance(manifest, dict) else None
    if not isinstance(argv, list) or len(argv) < 2:
        return None
    return "ddpdoctor " + " ".join(str(a) for a in argv[1:])


def lead_finding(findings: list[Finding]) -> Finding | None:
    """The finding a one-line verdict names: the first in report order (the views' one place for it)."""
    ordered = sorted(findings, key=lambda f: -f.severity.rank)
    return ordered[0] if ordered else None


def _summary_html(report: Report, ranks: list[RankJson]) -> str:
    """The strip at the top: job, command, ranks, exit, steps recorded, verdict and its one-line why."""
    from ddpdoctor.renderers.console_perf import step_count

    job_section = section_of(report, JobSection)
    job = job_section.job if job_section else JobOutcome()
    where = section_of(report, RunDirSection)
    run_dir = where.run_dir if where else None
    lead = lead_finding(report.findings)
    why = lead.title if lead else "no findings: nothing wrong was found in the recorded steps"
    steps = sorted({n for n in (step_count(r) for r in ranks) if n is not None})
    ids = sorted({i for r in ranks for i in (r.get("step_ids") or [])})
    steps_text = "-" if not steps else (f"{steps[0]} per rank" if len(steps) == 1 else
                                        f"{min(steps)}-{max(steps)} per rank")
    if ids:
        steps_text += f" (steps {ids[0]}-{ids[-1]})" if len(ids) > 1 else f" (step {ids[0]})"
    exit_text = "-"
    if job.exit_code is not None:
        exit_text = str(job.exit_code) + (f" ({job.killed_by})" if job.killed_by else "")
    items = [
        ("job", str(run_dir or "traces given to analyze")),
        ("command", _command_line(run_dir) or f"ddpdoctor {report.command}"),
        ("ranks", str(job.world_size or len(ranks) or "-")),
        ("exit", exit_text),
        ("steps recorded", steps_text),
    ]
    cells = "".join(f'<div class="cell"><span class="k">{esc(k)}</span><span class="v">{esc(v)}</span></div>'
                    for k, v in items)
    return (f'<section id="summary" class="summary status-bg-{esc(report.status)}">'
            f'<div class="verdict"><span class="status-{esc(report.status)}">{esc(report.status)}</span>: '
            f"{esc(why)}</div>{cells}</section>")


def _collectives_html(coll: CollectivesJson) -> str:
    parts = []
    by_op = coll.get("by_op") or {}
    if by_op:
        parts.append('<p class="note">Totals over the recorded steps, all ranks.</p>')
        parts.append(_table(["op", "calls (total)", "MB (total)", "time ms (total)"], [
            [op, v.get("count"), f"{(v.get('bytes') or 0) / 1e6:.2f}", _ms(v.get("time_us"))]
            for op, v in sorted(by_op.items())], left=1))
    bw = coll.get("bandwidth") or {}
    rate_or_none = bw.get("bytes_per_us")
    if rate_or_none:
        latency, rate = float(bw.get("latency_us") or 0.0), float(rate_or_none)
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
             "busbw GB/s"], rows) + "</div>" + '<p class="note">One row per call.</p>')
        if len(calls) > MAX_CALL_ROWS:
            parts.append(f'<p class="note">{len(calls) - MAX_CALL_ROWS} more calls in report.json.</p>')
    buckets = coll.get("buckets") or []
    if buckets:
        rows = [[b.get("rank"), b.get("step"), b.get("index"), "yes" if b.get("is_last") else "",
                 f"{(b.get('bytes') or 0) / 1e6:.3f}", _ms(b.get("dur_us")), _ms(b.get("after_backward_end_us"))]
                for b in buckets[:MAX_CALL_ROWS]]
        parts.append("<h3>DDP gradient buckets (one row per bucket and step)</h3>" + '<div class="scroll">' + _table(
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


def render_html(report: Report, extra: str = "") -> str:
    """The whole report as one HTML document string; ``extra``: sections of other views placed after the findings
    (already escaped HTML, e.g. the diff against a baseline)."""
    perf = section_of(report, PerfSection)
    where = section_of(report, RunDirSection)
    ranks = (perf.ranks if perf else None) or []
    stragglers = list(((perf.stragglers if perf else None) or {}).get("ranks") or [])
    from ddpdoctor.renderers.html_tune import tune_html
    from ddpdoctor.version import __version__

    meta = [f"ddpdoctor {__version__}", f"{len(ranks)} rank(s)"]
    if where and where.run_dir:
        meta.append(f"run {where.run_dir}")
    if perf and perf.window:
        meta.append(f"window: {perf.window}")
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
{_summary_html(report, ranks)}
{tune_html(section_of(report, TuneSection))}
<noscript><p class="noscript">Charts need JavaScript; the tables below do not.</p></noscript>
<section id="findings"><h2>Findings</h2>{_findings_html(report.findings)}{notes}</section>
{extra}
<section id="ranks"><h2>Per rank, per step</h2>
<p class="note">Every figure is per step: step time as the median (and p90) over the recorded steps, the others as a
mean per step (report.json has the totals).</p>
<div class="scroll">{_ranks_html(ranks, stragglers)}</div>{_defs("overlap", "exposed communication", "idle")}</section>
<section id="steps"><h2>Step time per step and rank</h2>
<div class="chart" id="chart-steps"></div>
<p class="note">One line per rank (ms per step); the straggler's line is dashed and marked ★.</p></section>
<section id="timeline"><h2>Timeline of a step <select id="step-select" aria-label="step"></select></h2>
<div class="legend"><span><i style="background:#e5eaf1"></i>step</span><span><i style="background:#3b82f6"></i>backward</span>
<span><i style="background:#f59e0b"></i>gradient bucket all_reduce</span><span><i style="background:#dc2626"></i>communication after
backward ended (exposed)</span><span><i style="background:#9ca3af"></i>other collective</span><span>★ straggler</span></div>
<div class="chart" id="chart-timeline"></div>
<p class="note">Times on rank 0's clock after alignment on matched collectives; hover a bar for numbers.</p></section>
<section id="overlap"><h2>Overlapped and exposed communication per rank (mean per step)</h2>
<div class="legend"><span><i style="background:#16a34a"></i>overlapped with compute</span><span><i style="background:#dc2626"></i>exposed</span></div>
<div class="chart" id="chart-overlap"></div>{_defs("overlap", "exposed communication")}</section>
<section id="buckets"><h2>Gradient buckets against backward</h2>
<div class="legend"><span><i style="background:#3b82f6"></i>backward</span><span><i style="background:#f59e0b"></i>bucket
all_reduce (height: MB)</span><span><i style="background:#dc2626"></i>after backward ended (exposed)</span></div>
<div class="chart" id="chart-buckets"></div></section>
<section id="whatif"><h2>What-if: exposed communication against bucket_cap_mb</h2>
<div class="chart" id="chart-whatif"></div>
<p class="note">DDP's bucketing replayed on this run's gradient-ready times and fitted bandwidth (docs/whatif.md);
per step. The dot is the current bucket_cap_mb; the dashed line what was measured.</p></section>
<section id="stragglers"><h2>Stragglers</h2><p>{esc(straggler_text)}</p><div class="chart" id="chart-stragglers"></div>
{_defs("arrival skew", "caused wait")}</section>
<section id="collectives"><h2>Collectives</h2>{_collectives_html((perf.collectives if perf else None) or {})}</section>
{_ddp_html(perf.ddp if perf else None)}
</main>
<script type="application/json" id="ddpdoctor-data">{script_json(_chart_data(perf))}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def write_html(report: Report, path: Path, extra: str = "") -> Path:
    """Write the report atomically (a temporary file beside it, then a rename): a full disk or a crash leaves the
    previous report or none, never half a page. Raises OSError; the caller names the file."""
    return write_page(render_html(report, extra), path)


def write_page(text: str, path: Path) -> Path:
    """``text`` to ``path`` atomically (see write_html). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # An unpredictable temporary name created O_EXCL|O_NOFOLLOW, 0600 (the report holds the job's stacks and
    # environment): links planted beside the target for a range of pids are never written through (issue 40 item 4).
    write_atomic(path, text)
    return path
