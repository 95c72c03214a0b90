"""The sync-in-backward rule: synchronising calls (.item(), .cpu(), cuda synchronize) inside a rank's backward
window, which serialise communication (docs/findings.md)."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import WhatIf
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_balance import run_step_us
from ddpdoctor.findings.perf_verdict import cost, step_samples

# Synchronising calls inside backward: a single cudaDeviceSynchronize / .item() per step stalls the CPU until all
# queued work, communication included, is done; any such call inside the backward window is worth naming.
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "aten::item", "aten::_local_scalar_dense")
SYNC_COPY_NAMES = ("aten::_to_copy", "aten::copy_", "aten::to")  # .cpu() copies: named only with "cpu" evidence


def _sync_name(ev: Any) -> str | None:
    name = str(getattr(ev, "name", ""))
    if any(name.startswith(s) for s in SYNC_NAMES):
        return name
    if name in SYNC_COPY_NAMES and "cpu" in str(getattr(ev, "detail", "")).lower():
        return name + " (.cpu())"
    return None


def _inside_item(syncs: list[Any]) -> Callable[[Any], bool]:
    """Whether a call lies inside one of its rank's ``aten::item`` calls (.item() records aten::item with
    aten::_local_scalar_dense inside it: only the outer call counts). Per rank, the items are sorted by start with
    the running maximum of their ends, so each question is one binary search: linear in calls, not calls x items
    (which at 128 ranks was most of analyze's time)."""
    spans: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for e in syncs:
        if str(getattr(e, "name", "")) == "aten::item":
            t = float(getattr(e, "t_us", 0.0))
            spans[getattr(e, "rank", None)].append((t, t + float(getattr(e, "dur_us", 0.0))))
    index: dict[Any, tuple[list[float], list[float]]] = {}
    for rk, v in spans.items():
        v.sort()
        starts = [s for s, _ in v]
        reach = list(itertools.accumulate((e for _, e in v), max))
        index[rk] = (starts, reach)

    def inside(ev: Any) -> bool:
        got = index.get(getattr(ev, "rank", None))
        if got is None:
            return False
        t = float(getattr(ev, "t_us", -1.0))
        i = bisect.bisect_right(got[0], t)  # items starting at or before t; one of them reaches t if the furthest does
        return i > 0 and got[1][i - 1] >= t

    return inside


def rule_sync_in_backward(a: Analysis, w: WhatIf | None) -> list[Finding]:
    """Reads ``analysis.syncs`` (SyncCall: rank, step, name, t_us, dur_us, detail)."""
    syncs = getattr(a, "syncs", None) or []
    if not syncs:
        return []
    # Sync calls are CPU events: compare with the CPU's backward window (on GPU traces backward_*_us is the span
    # of the backward kernels); older analyses without the CPU window use backward_*_us.
    windows = {(r.rank, s.step): (getattr(s, "cpu_backward_start_us", None) or s.backward_start_us,
                                  getattr(s, "cpu_backward_end_us", None) or s.backward_end_us)
               for r in a.ranks for s in r.per_step}
    hits: dict[str, list[Any]] = defaultdict(list)
    inside_item = _inside_item(syncs)
    for ev in syncs:
        if str(getattr(ev, "name", "")) == "aten::_local_scalar_dense" and inside_item(ev):
            continue
        name = _sync_name(ev)
        ev_rank, ev_step = getattr(ev, "rank", None), getattr(ev, "step", None)
        win = windows.get((ev_rank, ev_step)) if ev_rank is not None and ev_step is not None else None
        if name is None or win is None or win[0] is None or win[1] is None:
            continue
        if win[0] <= float(getattr(ev, "t_us", -1.0)) <= win[1]:
            hits[name].append(ev)
    if not hits:
        return []
    all_hits = [e for v in hits.values() for e in v]
    ranks = sorted({e.rank for e in all_hits})
    # On a CPU-only rank .item() waits for nothing (no device queue): the same code would stall a GPU job, so it
    # is reported, as info.
    cpu_only = all(r.device == "cpu" for r in a.ranks if r.rank in ranks)
    return [Finding(
        "sync-in-backward", Severity.INFO if cpu_only else Severity.WARNING,
        f"{len(all_hits)} synchronising call(s) inside backward"
        + (" (CPU run: they would serialise communication on GPUs)" if cpu_only else " serialise communication"),
        ranks=ranks,
        evidence={**cost(sum(float(getattr(e, "dur_us", 0.0)) for e in all_hits) / max(1, step_samples(a)) / max(1, len(ranks)),
                       run_step_us(a)),
                  "calls": {n: len(v) for n, v in sorted(hits.items())},
                  "steps": sorted({e.step for e in all_hits}),
                  "time_ms": round(sum(float(getattr(e, "dur_us", 0.0)) for e in all_hits) / 1000, 3)},
        advice="Remove `.item()`, `.cpu()`, `torch.cuda.synchronize()` from backward hooks and the loss path "
        "before `backward()` completes; log scalars after `optimizer.step()` (or accumulate them on device).",
    )]
