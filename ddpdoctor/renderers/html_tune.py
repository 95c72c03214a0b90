"""The HTML section of `ddpdoctor tune` (also what its TensorBoard tab shows): each setting's step time with its
interval beside the baseline's, the prediction beside the measurement, and why each variant was chosen or skipped.
Every string is escaped."""

from __future__ import annotations

import html
from typing import Any

from ddpdoctor.renderers.console_tune import measured
from ddpdoctor.reports.sections import TuneSection
from ddpdoctor.reports.tune_json import NumericsJson


def _esc(value: Any) -> str:
    # As renderers/html.esc (this module is imported by it, so it does not import it back).
    return html.escape("" if value is None else str(value), quote=True)


def _num(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def _iv(iv: Any) -> str:
    return f"[{_num(iv[0])}, {_num(iv[1])}]" if isinstance(iv, list) and len(iv) == 2 else ""


def _bar(iv: Any, lo: float, hi: float, colour: str) -> str:
    """The interval as a bar on one shared scale (an inline SVG, no script)."""
    if not (isinstance(iv, list) and len(iv) == 2 and hi > lo):
        return ""
    x0 = 4 + 292 * (float(iv[0]) - lo) / (hi - lo)
    x1 = 4 + 292 * (float(iv[1]) - lo) / (hi - lo)
    return (f'<svg width="300" height="14" role="img" aria-label="interval"><rect x="{x0:.1f}" y="3" '
            f'width="{max(2.0, x1 - x0):.1f}" height="8" fill="{colour}"/></svg>')


def tune_html(section: TuneSection | None) -> str:
    """The section, or "" for a report of another command."""
    tune = section.tune if section else None
    if not isinstance(tune, dict):
        return ""
    rows = [r for r in (section.variants if section else None) or [] if isinstance(r, dict)]
    base = tune.get("baseline") or {}
    ivs = [base.get("interval")] + [r.get("interval") for r in rows]
    ends = [float(x) for iv in ivs if isinstance(iv, list) for x in iv if isinstance(x, (int, float))]
    lo, hi = (min(ends), max(ends)) if ends else (0.0, 1.0)
    head = ("<tr><th class='l'>setting</th><th>step ms</th><th>90% interval</th><th class='l'></th>"
            "<th class='l'>predicted</th><th class='l'>measured vs baseline</th><th class='l'>verdict</th>"
            "<th class='l'>numerics</th><th class='l'>GPU-hours/day saved</th><th class='l'>change</th></tr>")
    body = [f"<tr><td class='l'>baseline</td><td>{_num(base.get('step_ms'))}</td><td>{_esc(_iv(base.get('interval')))}"
            f"</td><td class='l'>{_bar(base.get('interval'), lo, hi, '#9ca3af')}</td><td></td><td></td>"
            "<td class='l'>the script's own settings</td><td></td><td></td><td></td></tr>"]
    for r in rows:
        pred = r.get("predicted_ms")
        gph = r.get("gpu_hours_per_day")
        saved = (f"{gph['value']:+.1f} {_iv(gph.get('interval'))} at {gph.get('gpus_total')} GPUs"
                 if isinstance(gph, dict) and isinstance(gph.get("value"), (int, float))
                 and r.get("verdict") in ("faster", "slower") else "-")  # inside the noise, no cost is claimed
        raw_num = r.get("numerics")
        num: NumericsJson = raw_num if isinstance(raw_num, dict) else {}
        body.append(
            f"<tr><td class='l'>{_esc(r.get('setting'))}</td><td>{_num(r.get('step_ms'))}</td>"
            f"<td>{_esc(_iv(r.get('interval')))}</td>"
            f"<td class='l'>{_bar(r.get('interval'), lo, hi, '#16a34a' if r.get('winner') else '#3b82f6')}</td>"
            f"<td class='l'>{_esc(f'{pred:+.3f} ms' if isinstance(pred, (int, float)) else 'no model')}</td>"
            f"<td class='l'>{_esc(measured(r))}</td>"
            f"<td class='l'>{'<b>' if r.get('winner') else ''}{_esc(r.get('verdict'))}{'</b>' if r.get('winner') else ''}: "
            f"{_esc(r.get('why'))}</td><td class='l'>{_esc(num.get('state', '-'))} "
            f"({_esc(num.get('loss_rel_diff'))})</td><td class='l'>{_esc(saved)}</td>"
            f"<td class='l'><code>{_esc(str(r.get('change') or '').replace('`', ''))}</code></td></tr>")
    cands = "".join(
        f"<li>{'measured' if c.get('chosen') else 'skipped'}: <code>{_esc(c.get('setting'))}</code> "
        f"({_esc(c.get('source'))}): {_esc(c.get('why'))}</li>" for c in tune.get("candidates") or []
        if isinstance(c, dict))
    design = tune.get("design") or {}
    return (f'<section id="tune"><h2>Tune: DDP options measured against the baseline</h2>'
            f'<div class="scroll"><table><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="note">{_esc(design.get("launches"))} launches in the order {_esc(" ".join(design.get("order") or []))};'
            f' {_esc(design.get("warmup"))} warm-up iterations left out of each, {_esc(design.get("steps"))} measured. '
            "A winner's interval lies wholly below the baseline's, each of its launches beat its neighbouring "
            "baseline launches, by more than the launch noise (docs/tune.md).</p><h3>Variants considered</h3><ul>" + cands + "</ul></section>")
