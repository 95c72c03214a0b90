"""The terminal view of `ddpdoctor tune`: the variants against the baseline (prediction beside measurement), and
why each variant was chosen or skipped."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.reports.tune_json import VariantJson


def _ms(v: Any, sign: bool = False) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v:+.3f}" if sign else f"{v:.3f}"


def _interval(iv: Any) -> str:
    if not (isinstance(iv, list) and len(iv) == 2):
        return ""
    return f"[{_ms(iv[0])}, {_ms(iv[1])}]"


def measured(row: VariantJson) -> str:
    """"measured -3.1 ± 1.2 ms" from the paired difference and its interval."""
    d, iv = row.get("diff_ms"), row.get("diff_interval")
    if not isinstance(d, (int, float)) or not isinstance(iv, list):
        return "not measured"
    return f"measured {d:+.3f} ± {(iv[1] - iv[0]) / 2:.3f} ms"


def _numerics(n: Any) -> str:
    if not isinstance(n, dict) or n.get("loss_rel_diff") is None:
        return "loss not compared"
    state, d = n.get("state"), float(n["loss_rel_diff"])
    if state == "not finite":
        return "[red]loss not finite[/red]"
    if state == "undecided":
        return f"loss {d:.1e} off, undecided (the baseline's own launches differ by {n.get('baseline_rel_spread'):.1e})"
    if state == "changed":
        return f"[yellow]loss changes by {d:.1e} (tolerance {n.get('tolerance'):.0e})[/yellow]"
    return "loss bit-identical" if state == "identical" else f"loss within {d:.1e} (tolerance {n.get('tolerance'):.0e})"


def render_tune_section(report: Any, out: Console, verbose: bool) -> None:
    from ddpdoctor.reports.sections import TuneSection

    section = report.section(TuneSection)
    if section is None:
        return
    tune = section.tune or {}
    base = tune.get("baseline") or {}
    rows: list[VariantJson] = section.variants or []
    table = Table(title="Step time per setting (median ms [90% interval], warm-up left out)", title_justify="left")
    for col in ("setting", "step ms", "predicted", "vs baseline", "verdict"):
        table.add_column(col, overflow="fold")
    table.add_row("baseline", f"{_ms(base.get('step_ms'))} {_interval(base.get('interval'))}", "", "", "")
    for r in rows:
        verdict = escape(str(r.get("verdict")))
        if r.get("winner"):
            verdict = f"[green]{verdict}[/green]"
        pred = r.get("predicted_ms")
        table.add_row(escape(str(r.get("setting"))), f"{_ms(r.get('step_ms'))} {_interval(r.get('interval'))}",
                      f"predicted {_ms(pred, True)} ms" if isinstance(pred, (int, float)) else "no model",
                      measured(r), verdict)
    out.print(table)
    for r in rows:
        line = f"  {escape(str(r.get('setting')))}: {escape(str(r.get('why')))}; {_numerics(r.get('numerics'))}"
        if r.get("effect"):
            line += f"; in effect: {escape(str(r.get('effect')))}" if r.get("in_effect") else ""
        if isinstance(r.get("buckets"), int) and r.get("buckets") != r.get("baseline_buckets"):
            replay = r.get("expected_buckets")
            line += (f" (baseline {r.get('baseline_buckets')}"
                     + (f"; the what-if's replay: {replay:g}" if isinstance(replay, (int, float)) else "") + ")")
        gph = r.get("gpu_hours_per_day")
        if isinstance(gph, dict) and r.get("winner"):
            line += f"; {gph['value']:+.1f} GPU-hours/day saved at {gph['gpus_total']} GPUs"
        out.print(line)
    spread = base.get("launch_spread_ms")
    if spread is not None:
        out.print(f"[dim]baseline launches: {', '.join(_ms(x) for x in base.get('launch_medians_ms') or [])} ms "
                  f"(launch noise {_ms(spread)} ms: the largest difference of two consecutive ones)[/dim]")
    out.print("[bold]Variants considered[/bold]")
    for c in tune.get("candidates") or []:
        mark = "[green]measured[/green]" if c.get("chosen") else "[dim]skipped[/dim]"
        out.print(f"  {mark} {escape(str(c.get('setting')))} ({escape(str(c.get('source')))}): "
                  f"{escape(str(c.get('why')))}")
    design = tune.get("design") or {}
    if design.get("trials_dir"):
        out.print(f"[dim]trial run directories: {escape(str(design['trials_dir']))}[/dim]")
