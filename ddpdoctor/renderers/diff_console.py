"""The terminal view of a diff: one screen (headline, the 3-5 contributors, what else changed); -v adds every part,
rank, collective class and bucket."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.report import Report
from ddpdoctor.reports.diff_json import DeltaJson, DiffJson
from ddpdoctor.reports.sections import DiffSection

LABEL = {"compute": "compute", "exposed_comm": "exposed comm", "data_wait": "data wait", "idle": "idle",
         "data": "data loading", "forward": "forward", "backward": "backward", "optimizer": "optimizer+tail",
         "comm_wait": "comm: waiting", "comm_transfer": "comm: transfer"}


def _delta(d: DeltaJson) -> str:
    dm = d.get("delta_ms") or {}
    iv = dm.get("interval") or []
    lo, hi = (iv[0], iv[1]) if len(iv) >= 2 else (None, None)
    pct = d.get("pct_of_step")
    pct_s = f" ({pct:+.1f}%)" if isinstance(pct, (int, float)) else ""
    return f"{dm.get('value', 0):+.2f} ms [{lo:+.2f}, {hi:+.2f}]{pct_s}"


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks[:8])) + ("…" if len(ranks) > 8 else "")


def _value(v: Any) -> str:
    return "-" if v is None else escape(str(v))


def render_diff_section(report: Report, out: Console, verbose: bool) -> None:
    section = report.section(DiffSection)
    if section is None:
        return
    d = section.diff
    step = d["step"]
    word = "[yellow]slower[/yellow]" if step["significant"] and step["delta_ms"]["value"] > 0 else \
        "[green]faster[/green]" if step["significant"] else "[dim]no change beyond noise[/dim]"
    out.print(f"[bold]step time[/bold] {step['base_ms']:.2f} ms -> {step['new_ms']:.2f} ms: {_delta(step)} {word}")
    out.print(f"[dim]base {escape(d['base'])} ({d['steps']['base']} steps), new {escape(d['new'])} "
              f"({d['steps']['new']} steps), {d['world_size']} ranks; 90% intervals; a change counts from "
              f"{step['min_effect_ms']:.2f} ms (the step; each part has its own)[/dim]")
    changes = d.get("changes") or []
    contributors = d.get("contributors") or []
    if contributors and not (step["significant"] or verbose):
        out.print(f"[dim]{len(contributors)} part(s) moved on single ranks while the step did not (-v)[/dim]")
    elif contributors:
        out.print("[bold]where the step changed[/bold] (per step, 90% interval, % of the base step)")
        for c in contributors[: 5 if not verbose else len(contributors)]:
            related = [ch["key"] for ch in changes if c["component"] in ch.get("explains", [])]
            wait = f", waiting for rank {_ranks(c['waiting_for'])}" if c.get("waiting_for") else ""
            rel = f"\n      [dim]plausibly related: {escape(', '.join(related[:5]))}" \
                f"{' …' if len(related) > 5 else ''}[/dim]" if related else ""
            out.print(f"  {_delta(c)}  {LABEL.get(c['component'], c['component'])} ({c['kind']}) on rank(s) "
                      f"{_ranks(c['ranks'])}: {c['base_ms']:.2f} -> {c['new_ms']:.2f} ms{wait}{rel}")
    ops = d.get("operators") or []
    if ops:
        out.print("[bold]operators whose time changed[/bold] (self time per step)")
        for o in ops[: 3 if not verbose else len(ops)]:
            out.print(f"  {_delta(o)}  {escape(o['name'])} ({o['kind']}) on rank {o['rank']}: "
                      f"{o['base_ms']:.2f} -> {o['new_ms']:.2f} ms")
    if changes:
        t = Table(title="what else changed (recorded; a lead, not a cause)", title_justify="left", show_edge=False)
        for col in ("fact", "base", "new"):
            t.add_column(col, overflow="fold")
        for ch in changes[: 8 if not verbose else len(changes)]:
            t.add_row(escape(ch["key"]), _value(ch["base"]), _value(ch["new"]))
        out.print(t)
        if len(changes) > 8 and not verbose:
            out.print(f"[dim]… {len(changes) - 8} more (-v)[/dim]")
    else:
        out.print("[dim]what else changed: nothing recorded differs[/dim]")
    b = d.get("buckets")
    if b and b.get("layout_changed"):
        lay = b["layout_bytes"]
        out.print(f"buckets: bucket_cap_mb {b['bucket_cap_mb']['base']} -> {b['bucket_cap_mb']['new']}, "
                  f"{len(lay['base'])} -> {len(lay['new'])} bucket(s)")
    if verbose:
        _verbose(d, out)


def _verbose(d: DiffJson, out: Console) -> None:
    t = Table(title="parts of the step (job: each step's mean over ranks)", title_justify="left", show_edge=False)
    for col in ("part", "base ms", "new ms", "change"):
        t.add_column(col)
    for c in d.get("components") or []:
        if c["rank"] is None:
            t.add_row(f"{LABEL.get(c['component'], c['component'])} ({c['kind']})", f"{c['base_ms']:.2f}",
                      f"{c['new_ms']:.2f}", _delta(c) + (" *" if c["significant"] else ""))
    out.print(t)
    t = Table(title="step time by rank", title_justify="left", show_edge=False)
    for col in ("rank", "base ms", "new ms", "change"):
        t.add_column(col)
    for rank, r in (d.get("by_rank") or {}).items():
        t.add_row(rank, f"{r['base_ms']:.2f}", f"{r['new_ms']:.2f}", _delta(r) + (" *" if r["significant"] else ""))
    out.print(t)
    t = Table(title="collectives (time per step per rank)", title_justify="left", show_edge=False)
    for col in ("op", "size", "calls/step", "change", "busbw GB/s"):
        t.add_column(col)
    for cd in d.get("collectives") or []:
        t.add_row(escape(cd["op"]), cd["size_class"], f"{cd['calls_per_step']['base']} -> {cd['calls_per_step']['new']}",
                  _delta(cd), f"{_value(cd['busbw_gbps']['base'])} -> {_value(cd['busbw_gbps']['new'])}")
    out.print(t)
    b = d.get("buckets")
    if b:
        t = Table(title="DDP buckets", title_justify="left", show_edge=False)
        for col in ("bucket", "bytes", "ms", "busbw GB/s"):
            t.add_column(col)
        for row in b["rows"]:
            t.add_row(str(row["index"]), f"{_value(row['bytes']['base'])} -> {_value(row['bytes']['new'])}",
                      f"{_value(row['dur_ms']['base'])} -> {_value(row['dur_ms']['new'])}",
                      f"{_value(row['busbw_gbps']['base'])} -> {_value(row['busbw_gbps']['new'])}")
        out.print(t)
