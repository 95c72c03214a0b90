"""The terminal view of a performance report: per-rank table, stragglers, top advice, verbose per-step/collective tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ddpdoctor.findings.model import FAILURE_IDS, Finding, Severity, ordered
from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS, Figure, group_ranks, legend
from ddpdoctor.report import Report
from ddpdoctor.reports.perf_json import CollectivesJson, RankJson, StragglersJson
from ddpdoctor.reports.sections import PerfSection, RunDirSection, section_of

MAX_VERBOSE_ROWS = 200


def ms(us: Any, digits: int = 2) -> str:
    """Microseconds as milliseconds for people; a missing value is shown as "-", never "nan"."""
    if not isinstance(us, (int, float)) or not math.isfinite(us):
        return "-"
    return f"{us / 1000.0:.{digits}f}"


def pct(value: Any) -> str:
    return f"{value:.1f}%" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def by_rank(mapping: Mapping[Any, Any] | None) -> dict[int, Any]:
    """JSON turns integer keys into strings; accept both."""
    out: dict[int, Any] = {}
    for k, v in (mapping or {}).items():
        try:
            out[int(k)] = v
        except (TypeError, ValueError):
            continue
    return out


def _steps(r: RankJson) -> str:
    steps = r.get("steps")
    return str(len(steps)) if isinstance(steps, list) else str(steps if steps is not None else "-")


def _overlap(r: RankJson) -> str:
    comm = r.get("comm_us")
    if comm == 0:
        return "no comm"
    return pct(r.get("overlap_pct"))


def _table(title: str, headers: list[str], rows: list[list[str]], caption: str | None = None,
           left: int = 0) -> Table:
    """A compact table whose numbers are never cut: each column is at least as wide as its widest cell
    (headers wrap instead), and light borders leave room for 11 columns in 80."""
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    widths = [max([Text.from_markup(row[i]).cell_len for row in rows] + [1]) for i in range(len(headers))]
    for i, (name, width) in enumerate(zip(headers, widths, strict=True)):
        table.add_column(name, justify="left" if i < left else "right", min_width=width)
    for row in rows:
        table.add_row(*row)
    return table


def fsdp_unit_table(inventory: Mapping[str, Any] | None, verbose: bool) -> Table | None:
    """The FSDP2 unit inventory (docs/metrics.md#fsdp2-units): per unit, ms per step of each collective and the
    part of it exposed."""
    units = list((inventory or {}).get("units") or [])
    if not units:
        return None

    def cell(u: Mapping[str, Any], key: str) -> str:
        t, e = u.get(f"{key}_ms"), u.get(f"{key}_exposed_ms")
        return "-" if t is None else f"{t:.2f}/{e:.2f}"

    rows = []
    for u in units[: None if verbose else 12]:
        how = "first (unavoidable)" if u.get("first") else ("prefetched" if u.get("forward_prefetched") else "on demand")
        size = u.get("bytes")
        rows.append([str(u["unit"]), "-" if size is None else f"{size / 1e6:.2f}", cell(u, "all_gather_forward"), how,
                     cell(u, "all_gather_backward"), cell(u, "reduce_scatter"), cell(u, "all_reduce")])
    more = f"; {len(units) - 12} more units (--verbose)" if len(units) > 12 and not verbose else ""
    replay = (inventory or {}).get("prefetch_replay") or {}
    if replay.get("predictable"):
        more += (f"; one-deep prefetch is predicted to save {replay.get('forward_saved_ms') or 0:.2f} ms (forward), "
                 f"{replay.get('backward_saved_ms') or 0:.2f} ms (backward) per step")
    elif replay.get("reason"):
        more += f"; prefetch gain: {replay['reason']}"
    return _table("FSDP2 units (ms per step: time/exposed)",
                  ["unit", "MB", "AG fwd", "fwd AG issued", "AG bwd", "RS", "AR (HSDP)"], rows,
                  caption=f"AG all-gather, RS reduce-scatter, AR all-reduce across replicas{more}", left=1)


def step_count(r: RankJson) -> int | None:
    """How many steps a rank recorded (``steps`` is a count, or a list in older reports)."""
    steps = r.get("steps")
    n = len(steps) if isinstance(steps, list) else steps
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def per_step(r: RankJson, key: Figure) -> float | None:
    """A rank's total over its recorded steps as a mean per step, so it reads next to the step time (every
    view shows the same)."""
    value, n = r.get(key), step_count(r)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not n:
        return None
    return value / n


OVERLAP_DEFINITION = ("overlap: share of communication time hidden behind compute; exposed: communication time "
                      "with no compute running (the step waits for it), and its share of the step")


def _labelled(ranks: list[RankJson], stragglers: list[int]) -> tuple[list[tuple[str, RankJson]], str | None]:
    """(label, row) for each row of the rank table: every rank when few, else the ranks that matter and classes of
    alike ranks (renderers/rank_classes.py), with the caption that explains them."""
    groups = group_ranks(ranks, stragglers, MAX_RANK_ROWS)
    if groups is None:
        return [(f"{r.get('rank')}{'[yellow]*[/]' if r.get('rank') in stragglers else ''}", r) for r in ranks], None
    stepless = not any(step_count(r) for r in ranks)
    rows = [(f"{escape(g.short_ranges(16))}\n[dim]{escape(g.label)}[/]", g.row) for g in groups]
    return rows, f"{len(ranks)} ranks: {legend(stepless)}; --json has every rank"


def rank_table(ranks: list[RankJson], stragglers: list[int], verbose: bool = False) -> Table:
    """Fits 80 columns; every figure is per step (the step time a median, the others a mean per step), or over the
    whole trace when no rank recorded a ProfilerStep. Above MAX_RANK_ROWS ranks, classes of ranks."""
    if ranks and not any(step_count(r) for r in ranks):
        return _whole_trace_table(ranks, stragglers)
    counts = {_steps(r) for r in ranks}
    steps = f"{counts.pop()} recorded steps" if len(counts) == 1 else "the recorded steps"
    names = ["rank", *(["steps"] if verbose else []), "step", *(["p90", "max"] if verbose else []), "compute",
             "comm", "overlap", "exposed", "idle", "data wait"]
    labelled, grouped = _labelled(ranks, stragglers)
    rows = []
    for label, r in labelled:
        st = r.get("step_time_us") or {}
        exposed = ms(per_step(r, "exposed_comm_us"))
        exposed_pct = r.get("exposed_comm_pct")
        if isinstance(exposed_pct, (int, float)) and math.isfinite(exposed_pct):
            exposed += f" ({exposed_pct:.0f}%)"
        rows.append([
            label, *([_steps(r)] if verbose else []), ms(st.get("median")),
            *([ms(st.get("p90")), ms(st.get("max"))] if verbose else []),
            ms(per_step(r, "compute_us")), ms(per_step(r, "comm_us")), _overlap(r), exposed,
            ms(per_step(r, "idle_us")), ms(per_step(r, "data_wait_us")),
        ])
    captions = [f"step: median; others: mean per step, {steps}"]
    if stragglers and grouped is None:
        captions.append("* straggler")
    if grouped:
        captions.append(grouped)
    return _table("Per rank (ms per step)", names, rows, "\n".join(captions), left=1 if grouped else 0)


def _whole_trace_table(ranks: list[RankJson], stragglers: list[int]) -> Table:
    """Traces without ProfilerStep: each rank's totals over its whole trace (no step to divide by)."""
    labelled, grouped = _labelled(ranks, stragglers)
    rows = [[label, ms(r.get("compute_us")), ms(r.get("comm_us")), _overlap(r), ms(r.get("exposed_comm_us")),
             ms(r.get("idle_us")), ms(r.get("data_wait_us"))] for label, r in labelled]
    captions = ["no ProfilerStep: totals over the whole trace", *([grouped] if grouped else [])]
    return _table("Per rank (ms, whole trace)", ["rank", "compute", "comm", "overlap", "exposed", "idle",
                                                "data wait"], rows, "\n".join(captions), left=1 if grouped else 0)


def step_table(ranks: list[RankJson]) -> Table:
    rows: list[list[str]] = []
    caption = None
    for r in ranks:
        for s in r.get("per_step") or []:
            if len(rows) >= MAX_VERBOSE_ROWS:
                caption = "truncated; --json has every step"
                break
            bwd = None
            start, end = s.get("backward_start_us"), s.get("backward_end_us")
            if isinstance(end, (int, float)) and isinstance(start, (int, float)):
                bwd = end - start
            rows.append([str(r.get("rank")), str(s.get("step")), ms(s.get("dur_us")), ms(s.get("compute_us")),
                         ms(s.get("comm_us")), pct(s.get("overlap_pct")), ms(s.get("exposed_comm_us")),
                         ms(s.get("idle_us")), ms(bwd), ms(s.get("comm_in_backward_us")), ms(s.get("data_wait_us"))])
    return _table("Per step (ms, each recorded step)", ["rank", "step", "time", "compute", "comm", "overlap", "exposed", "idle",
                                    "backward", "comm in bwd", "data wait"], rows, caption)


def collective_tables(collectives: CollectivesJson) -> list[Table]:
    tables = []
    by_op = collectives.get("by_op") or {}
    if by_op:
        rows = [[escape(str(op)), str(v.get("count", "-")), f"{(v.get('bytes') or 0) / 1e6:.2f}", ms(v.get("time_us"))]
                for op, v in sorted(by_op.items())]
        tables.append(_table("Collectives by op", ["op", "count", "MB", "time ms"], rows,
                             "totals over the recorded steps", left=1))
    calls = collectives.get("calls") or []
    if calls:
        rows = [[str(c.get("rank")), str(c.get("step")), str(c.get("index")), escape(str(c.get("op"))),
                 escape(str(c.get("group"))), f"{(c.get('bytes') or 0) / 1e6:.2f}", ms(c.get("dur_us")),
                 ms(c.get("start_rel_backward_us")), _num(c.get("algbw_gbps")), _num(c.get("busbw_gbps"))]
                for c in calls[:MAX_VERBOSE_ROWS]]
        caption = (f"{len(calls) - MAX_VERBOSE_ROWS} more calls; --json or the HTML report has all"
                   if len(calls) > MAX_VERBOSE_ROWS else None)
        tables.append(_table("Collective calls (ms; start relative to backward start)",
                             ["rank", "step", "#", "op", "group", "MB", "dur", "start vs bwd", "algbw GB/s",
                              "busbw GB/s"], rows, caption))
    return tables


def _num(v: Any) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.3f}"


def straggler_line(stragglers: StragglersJson) -> str | None:
    ranks = stragglers.get("ranks") or []
    if not ranks:
        return None
    ev = stragglers.get("evidence") or {}
    waits = by_rank(ev.get("caused_wait_us"))
    parts = [f"rank {r} (others waited {ms(waits.get(r))} ms)" for r in ranks[:8]]
    more = f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    skew = ev.get("arrival_skew_median_us")
    return (f"[yellow]Straggler(s):[/] {', '.join(parts)}{more}; median arrival skew {ms(skew)} ms")


def _saves_ms(f: Finding) -> float:
    cost = f.evidence.get("cost_ms_per_step")
    return float(cost) if isinstance(cost, int | float) else -1.0


def top_advice(report: Report) -> str | None:
    """The advice of the most severe finding that has some (what to do first); among findings of that severity, the
    one whose cost per step (what following it would save) is largest."""
    found = [f for f in ordered(report.findings) if f.advice and f.severity is not Severity.INFO]
    if not found:
        return None
    worst = found[0]
    same = [f for f in found if (f.id in FAILURE_IDS) == (worst.id in FAILURE_IDS) and f.severity is worst.severity]
    best = max(same, key=_saves_ms)  # (max keeps the first of equals: the report's own order)
    # A finding whose advice only points at another one ("See exposed-comm-high.") shows the advice it points at.
    ref = next((f for f in report.findings if best.advice.strip() == f"See {f.id}." and f.advice), None)
    if ref is not None:
        return f"[bold]Top advice[/] ({escape(best.id)}, see {escape(ref.id)}): {escape(ref.advice)}"
    return f"[bold]Top advice[/] ({escape(best.id)}): {escape(best.advice)}"


def render_perf_sections(report: Report, out: Console, verbose: bool) -> None:
    """Sections renderer for ``emit(..., sections=render_perf_sections)``: the per-rank summary first."""
    perf = section_of(report, PerfSection)
    where = section_of(report, RunDirSection)
    run_dir = where.run_dir if where else None
    ranks: list[RankJson] = (perf.ranks if perf else None) or []
    stragglers: StragglersJson = (perf.stragglers if perf else None) or {}
    if run_dir:
        out.print(f"[dim]run directory: {escape(str(run_dir))}[/dim]")
    if ranks:
        out.print(rank_table(ranks, list(stragglers.get("ranks") or []), verbose))
        out.print(f"[dim]{OVERLAP_DEFINITION}[/dim]")
    else:
        out.print("[dim]No profiled steps to summarise.[/dim]")
    line = straggler_line(stragglers)
    if line:
        out.print(line)
    units = fsdp_unit_table(perf.fsdp_units if perf else None, verbose)
    if units is not None:
        out.print(units)
    if verbose and ranks:
        out.print(step_table(ranks))
    if verbose:
        for t in collective_tables((perf.collectives if perf else None) or {}):
            out.print(t)
    advice = top_advice(report)
    if advice:
        out.print(advice)
    if run_dir and (Path(run_dir) / "report.html").is_file():
        out.print(f"[dim]open {escape(str(Path(run_dir) / 'report.html'))} in a browser, or: "
                  f"tensorboard --logdir {escape(str(run_dir))} --host 127.0.0.1[/dim]")
