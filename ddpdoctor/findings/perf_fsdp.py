"""FSDP2's exposed communication, attributed to a named unit and a cause (analyses/fsdp_units.py): an all-gather
issued only when its unit's forward needed it (`fsdp-no-prefetch`), collectives the main thread waited out because
they were issued synchronously (`fsdp-comm-synchronous`). The first unit's forward all-gather is unavoidable (nothing
runs before it) and is said so in the evidence, never flagged."""

from __future__ import annotations

import statistics
from collections import defaultdict

from ddpdoctor.analyses.fsdp_replay import replay_prefetch
from ddpdoctor.analyses.results import Analysis, UnitCollective
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.jsontypes import JsonObject

NO_PREFETCH_WARN_PCT = 5.0  # exposed forward all-gathers that were not prefetched, % of the median step
NO_PREFETCH_INFO_PCT = 1.0
SYNC_INFO_PCT = 5.0  # exposed time of synchronous, prefetched or backward collectives, % of the median step
SHOWN = 6


def _step_us(a: Analysis) -> float:
    durs = [s.dur_us for r in a.ranks for s in r.per_step]
    return statistics.median(durs) if durs else 0.0


def _per_step_ms(rows: list[UnitCollective], steps: int, ranks: int) -> float:
    return sum(r.exposed_us for r in rows) / 1e3 / max(1, steps * ranks)


def _by_unit(rows: list[UnitCollective], steps: int, ranks: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        out[r.unit or "(root)"] += r.exposed_us / 1e3 / max(1, steps * ranks)
    return {u: round(v, 3) for u, v in sorted(out.items(), key=lambda kv: -kv[1])}


def fsdp_findings(a: Analysis) -> list[Finding]:
    rows = a.fsdp
    if not rows:
        return []
    step_us = _step_us(a)
    steps = max((r.steps for r in a.ranks), default=0)
    ranks = len({r.rank for r in rows})
    if step_us <= 0 or steps == 0:
        return []
    out: list[Finding] = []
    forward = [r for r in rows if r.op == "all_gather" and r.phase == "forward"]
    first = [r for r in forward if r.first]
    late = [r for r in forward if not r.first and not r.prefetched and r.exposed_us > 0]
    late_ms = _per_step_ms(late, steps, ranks)
    pct = 100.0 * late_ms * 1e3 / step_us
    first_ms = _per_step_ms(first, steps, ranks)
    if pct >= NO_PREFETCH_INFO_PCT:
        units = _by_unit(late, steps, ranks)
        names = list(units)
        evidence: JsonObject = {
            "exposed_ms_per_step": round(late_ms, 3), "pct_of_step": round(pct, 1),
            "step_ms": round(step_us / 1e3, 3), "units": dict(list(units.items())[:SHOWN]),
            "unavoidable_first_unit_ms_per_step": round(first_ms, 3),
            "first_unit": (first[0].unit or "(root)") if first else None,
            "synchronous": all(r.synchronous for r in late),
        }
        replay = replay_prefetch(rows)
        if replay.predictable:  # docs/metrics.md#fsdp2-prefetch-replay
            saved = replay.to_json(steps, ranks)
            evidence["predicted_saved_ms_per_step"] = saved["forward_saved_ms"]
            evidence["predicted_by_unit_ms"] = {
                u: replay.unit_saved_ms("" if u == "(root)" else u, "forward", steps, ranks) for u in names[:SHOWN]}
        else:
            evidence["prediction"] = replay.reason
        predicted = (f" A replay of FSDP2's schedule from this run's times predicts one-deep forward prefetch saves "
                     f"{evidence['predicted_saved_ms_per_step']:.2f} ms per step (docs/metrics.md#fsdp2-prefetch-"
                     "replay)." if replay.predictable else "")
        sync_note = (" On this device FSDP2 issues its all-gathers with async_op=False (CPU has no streams): a "
                     "prefetched all-gather still makes the main thread wait, so prefetch alone moves the wait "
                     "rather than hiding it; on GPU it runs on FSDP's all-gather stream beside compute."
                     if evidence["synchronous"] and a.ranks and a.ranks[0].device == "cpu" else "")
        out.append(Finding(
            "fsdp-no-prefetch", Severity.WARNING if pct >= NO_PREFETCH_WARN_PCT else Severity.INFO,
            f"FSDP2 all-gathers start only when their unit's forward needs them: {late_ms:.2f} ms per step exposed "
            f"({pct:.0f}% of the step) in {len(names)} unit(s): {', '.join(names[:3])}"
            + (" …" if len(names) > 3 else ""),
            ranks=sorted({r.rank for r in late}), evidence=evidence,
            advice="Prefetch the next unit's parameters while the current one computes: for each unit, "
                   "`unit.set_modules_to_forward_prefetch([next_unit])` (and `set_modules_to_backward_prefetch` for "
                   "backward, which FSDP2 prefetches one unit deep by default). The first unit's all-gather "
                   f"({first_ms:.2f} ms per step) is unavoidable: nothing runs before it. Fewer, larger units "
                   "(fully_shard on blocks rather than single layers) also cut the per-collective latency; "
                   "`reshard_after_forward=False` on the last units saves their backward all-gather at the cost "
                   "of memory." + predicted + sync_note,
        ))
    waited = [r for r in rows if r.synchronous and r.exposed_us > 0 and not r.first and r not in late]
    waited_ms = _per_step_ms(waited, steps, ranks)
    wpct = 100.0 * waited_ms * 1e3 / step_us
    if wpct >= SYNC_INFO_PCT:
        kinds: dict[str, float] = defaultdict(float)
        for r in waited:
            kinds[f"{r.op} ({r.phase})"] += r.exposed_us / 1e3 / max(1, steps * ranks)
        out.append(Finding(
            "fsdp-comm-synchronous", Severity.INFO,
            f"The main thread waited out {len(waited)} FSDP2 collective(s) it issued synchronously: {waited_ms:.2f} ms "
            f"per step exposed ({wpct:.0f}% of the step), prefetched or not",
            ranks=sorted({r.rank for r in waited}),
            evidence={"exposed_ms_per_step": round(waited_ms, 3), "pct_of_step": round(wpct, 1),
                      "by_collective": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
                      "units": dict(list(_by_unit(waited, steps, ranks).items())[:SHOWN])},
            advice="FSDP2 waits for each collective it issues with async_op=False (its default) before the hook "
                   "returns; on GPU the wait is a stream dependency and compute runs on, on CPU (gloo) the thread "
                   "itself blocks, so no unit order or prefetch hides it there. Measure on the GPU job, or make each "
                   "collective cheaper: fewer, larger units, `MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)` for "
                   "the reduce-scatter, and for HSDP a replicate group inside the node.",
        ))
    return out
