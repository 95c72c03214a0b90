"""Performance findings: pure rules from an Analysis to Findings (docs/findings.md explains every threshold)."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ddpdoctor.analyses.intervals import bootstrap
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import CANDIDATE_CAPS_MB, MIB, WhatIf, bucket_whatif, ddp_config
from ddpdoctor.findings.framework_advice import comm_hook, ddp_option
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_balance import (
    median_or_none,
    median_step_us,
    ms,
    rule_data_wait,
    rule_ddp_flags,
    rule_step_variance,
    rule_stragglers,
)
from ddpdoctor.findings.perf_verdict import (
    COMM_GROUP,
    cost,
    group_root_causes,
    merge_undecided,
    step_samples,
    undecided,
)
from ddpdoctor.findings.perf_wholetrace import rule_no_steps
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DDPModule

# Exposed communication (|comm \ compute|) as a share of step time. Under 20% the step is dominated by compute and
# tuning DDP buys little. Above it, a warning: a performance problem is never an error (the job computes right).
EXPOSED_WARN_PCT = 20.0
# The overlap causes are only named when exposed communication is worth chasing: 5% of a step.
CAUSE_MIN_EXPOSED_PCT = 5.0
# The last bucket's all_reduce still running after backward ended, as a share of step time: 10% is where it is
# the bulk of a 20%-exposed (warning) step, and a smaller or re-ordered last bucket would win it back.
TAIL_WARN_PCT = 10.0
# Buckets under 1 MiB (DDP's own first-bucket size) move too little data to amortise a collective's fixed latency
# (tens of microseconds on NCCL, more on gloo); 4 or more of them per step, making up half the buckets, is a
# configuration (bucket_cap_mb too small), not one small first bucket.
SMALL_BUCKET_BYTES = 1 * MIB
SMALL_BUCKET_MIN_COUNT = 4
SMALL_BUCKET_MIN_SHARE = 0.5
# Estimated share of all_reduce time that is fixed latency (count x fitted latency / comm time) above which the
# small-bucket finding is a warning: a third of the communication time buys no bytes.
LATENCY_SHARE_WARN = 1 / 3
# The first gradient all_reduce starting after half of the backward window: the first bucket waited for gradients
# of more than half the model, so at most half the backward can hide communication.
FIRST_BUCKET_LATE_SHARE = 0.5
# Synchronising calls inside backward: a single cudaDeviceSynchronize / .item() per step stalls the CPU until all
# queued work, communication included, is done; any such call inside the backward window is worth naming.
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "aten::item", "aten::_local_scalar_dense")
SYNC_COPY_NAMES = ("aten::_to_copy", "aten::copy_", "aten::to")  # .cpu() copies: named only with "cpu" evidence
# The bucket what-if is reported when its predicted saving reaches 2% of a step (info) or 10% (warning).
WHATIF_INFO_PCT = 2.0
WHATIF_WARN_PCT = 10.0


def _recommends(w: WhatIf | None, noise_us: float = 0.0) -> bool:
    """The what-if recommends a cap only when its layout differs from the current one (more or fewer buckets) and
    the predicted saving is worth reporting and larger than the run's own noise in exposed communication."""
    if (w is None or not w.available or w.best_bucket_cap_mb is None
            or (w.saving_pct_of_step or 0.0) < WHATIF_INFO_PCT or (w.saving_us_per_step or 0.0) <= noise_us):
        return False
    best = next((p for p in w.predictions if p.bucket_cap_mb == w.best_bucket_cap_mb), None)
    return best is None or best.buckets_per_step != w.current_buckets_per_step


def _waits(a: Analysis) -> dict[tuple[int, int], float]:
    """(rank, step) -> the part of its exposed communication spent waiting for a late peer (docs/metrics.md)."""
    return {(c.rank, step): w for c in a.comm_split for step, w in c.wait_by_step.items()}


def transfer_us(a: Analysis) -> dict[tuple[int, int], float]:
    """(rank, step) -> exposed transfer: exposed communication less the wait for a late peer. The overlap rules,
    exposed-comm-high and the bucket what-if rest on it: buckets and compression cannot shorten a wait."""
    waits = _waits(a)
    return {(r.rank, s.step): max(0.0, s.exposed_comm_us - waits.get((r.rank, s.step), 0.0))
            for r in a.ranks for s in r.per_step}


def _exposed_noise_us(a: Analysis) -> float:
    """Half the interval of exposed transfer per step: a predicted saving below it cannot be told from noise."""
    iv = bootstrap(list(transfer_us(a).values()) if any(r.comm_us > 0 for r in a.ranks) else [])
    return iv.half_width if iv is not None and iv.measurable else 0.0


def _cap_advice(whatif: WhatIf | None, fallback: str, noise_us: float = 0.0, cfg: DDPModule | None = None) -> str:
    """The what-if's cap when it recommends one, else ``fallback`` (without the what-if), or why no cap helps; said
    in the terms of the framework that built DDP (``cfg``: the DDP description)."""
    if not _recommends(whatif, noise_us):
        if whatif is not None and whatif.available:
            return ("The bucket what-if finds no bucket_cap_mb that would hide more of it (same bucket layout, or a "
                    "saving within the run's noise); larger per-rank batches (more compute per byte) or fp16 "
                    f"gradient compression ({comm_hook(cfg, plain='`fp16_compress_hook`')}) shrink what must be hidden.")
        return fallback
    assert whatif is not None and whatif.best_bucket_cap_mb is not None
    text = (f"{ddp_option(cfg, 'bucket_cap_mb', whatif.best_bucket_cap_mb)}: the bucket what-if predicts "
            f"{ms(whatif.saving_us_per_step)} ms less exposed communication per step")
    if whatif.fit_error_pct_of_step is not None and whatif.fit_error_pct_of_step > (whatif.saving_pct_of_step or 0.0):
        text += (f" (but it reproduces this run only within {whatif.fit_error_pct_of_step:.0f}% of a step: "
                 "profile again to confirm)")
    return text + "."


def _single_bucket(a: Analysis) -> int | None:
    """The gradient bytes when every step ran one gradient bucket and would at any cap, else None."""
    per: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b in a.buckets:
        per[(b.rank, b.step)].append(b.bytes or 0)
    if not per or statistics.median(len(v) for v in per.values()) > 1:
        return None
    total = int(statistics.median(sum(v) for v in per.values()))
    # One bucket at ANY cap: under the smallest cap the what-if tries (1 MiB). A larger model in one bucket because
    # of a large cap is a different story: a smaller cap does help it.
    return total if 0 < total <= min(CANDIDATE_CAPS_MB) * MIB else None


def _step_us(a: Analysis) -> float | None:
    return median_or_none([v for r in a.ranks if (v := median_step_us(r))])


# ------------------------------------------------------------------------------------------------------- rules

def rule_no_communication(a: Analysis, w: WhatIf | None) -> list[Finding]:
    silent = [r.rank for r in a.ranks if r.comm_us <= 0]
    worlds = {r.world_size for r in a.ranks if r.world_size}
    if a.ranks and not silent and worlds == {1}:
        return [Finding(
            "single-rank-ddp", Severity.INFO, "World size 1: the recorded collectives synchronise nothing",
            ranks=[r.rank for r in a.ranks],
            evidence={"world_size": 1, "collective_ms": {str(r.rank): ms(r.comm_us) for r in a.ranks}},
            advice="Overlap and bucket advice only mean something with 2 or more ranks: profile with "
            "`--nproc-per-node 2` (or more) to see the communication DDP will do.",
        )]
    if not a.ranks or not silent:
        return []
    if len(silent) == len(a.ranks):
        single = worlds == {1} or (not worlds and len(a.ranks) == 1)
        return [Finding(
            "no-communication", Severity.INFO,
            "No communication recorded" + (" (world size 1)" if single else " (not DDP, or no collective in the window)"),
            ranks=silent, evidence={"world_size": sorted(worlds), "ranks_analysed": len(a.ranks)},
            advice="Overlap and bucket advice do not apply. For a multi-rank job, check the model is wrapped in "
            "`DistributedDataParallel` and the profiler window covers a full training step.",
        )]
    return [Finding(
        "rank-no-communication", Severity.WARNING,
        f"Rank(s) {silent} recorded no communication while the others did",
        ranks=silent, evidence={"ranks_with_comm": [r.rank for r in a.ranks if r.comm_us > 0]},
        advice="Those ranks' traces may cover a different window (profile the same steps on every rank) or the "
        "ranks run a different code path; compare their traces.",
    )]


def _transfer_pct(a: Analysis, tr: dict[tuple[int, int], float]) -> dict[int, float]:
    """Each rank's exposed transfer as % of its recorded step time."""
    out = {}
    for r in a.ranks:
        total = sum(s.dur_us for s in r.per_step)
        if total > 0:
            out[r.rank] = 100.0 * sum(tr.get((r.rank, s.step), 0.0) for s in r.per_step) / total
    return out


def rule_exposed_comm(a: Analysis, w: WhatIf | None) -> list[Finding]:
    comm_ranks = [r for r in a.ranks if r.comm_us > 0]
    tr = transfer_us(a)
    iv = bootstrap([100.0 * tr[(r.rank, s.step)] / s.dur_us for r in comm_ranks for s in r.per_step if s.dur_us > 0])
    if iv is None:
        return []
    if not iv.above(EXPOSED_WARN_PCT):
        return [undecided("exposed-comm-high", "exposed transfer, % of step", iv, EXPOSED_WARN_PCT, a)] \
            if iv.undecided(EXPOSED_WARN_PCT) else []
    pct = _transfer_pct(a, tr)
    hot = [r for r in comm_ranks if pct.get(r.rank, 0.0) > EXPOSED_WARN_PCT] or comm_ranks
    exposed_us = statistics.median(tr[(r.rank, s.step)] for r in comm_ranks for s in r.per_step)
    single = _single_bucket(a)
    whole = bootstrap([100.0 * s.exposed_comm_us / s.dur_us for r in comm_ranks for s in r.per_step
                       if s.dur_us > 0]) or iv
    # The wait for a late rank is straggler-rank's: said beside the transfer, so the two figures add up.
    waiting = f" in transfer (and {whole.value - iv.value:.0f}% waiting for a late rank)" \
        if whole.value - iv.value >= 1.0 else ""
    evidence: dict[str, Any] = {  # an evidence map (Finding.evidence): shown and copied as it is
        **cost(exposed_us, _step_us(a)),
        "exposed_transfer_pct_of_step": iv.to_json(),
        "exposed_comm_pct_of_step": whole.to_json(),
        "exposed_split": [c.to_json() for c in a.comm_split if c.rank in {r.rank for r in hot}],
        "exposed_comm_pct": {str(r.rank): round(r.exposed_comm_pct or 0.0, 1) for r in hot},
        "exposed_comm_ms_per_step": {str(r.rank): ms(r.exposed_comm_us / max(1, r.steps)) for r in hot},
        "overlap_pct": {str(r.rank): None if r.overlap_pct is None else round(r.overlap_pct, 1) for r in hot},
        "steps": {str(r.rank): r.steps for r in hot},
        "threshold_pct": EXPOSED_WARN_PCT,
    }
    if single is not None:
        # One bucket: its all_reduce can only start when the last gradient is ready, i.e. when backward ends. No
        # DDP knob changes that, so the finding explains instead of listing knobs (info: nothing to tune).
        evidence["single_bucket_bytes"] = single
        return [Finding(
            "exposed-comm-high", Severity.INFO,
            f"Communication not hidden by compute takes {iv.value:.0f}% of step time{waiting}: the model's gradients fit "
            "in one bucket, which DDP can only send after backward",
            ranks=[r.rank for r in hot], evidence=evidence,
            advice=(f"All {single / 1024:.1f} KiB of gradients fit in one bucket, so DDP starts their all_reduce when "
                    "the last gradient is ready (at the end of backward) and nothing can overlap it. Its cost is "
                    "mostly the collective's fixed latency, which no DDP setting (bucket size, static_graph) shortens; "
                    "it only shrinks relative to the step with more work per step (a larger per-rank batch or "
                    "model). For a model this small, fewer ranks may train as fast."),
        )]
    return [Finding(
        "exposed-comm-high", Severity.WARNING,
        f"Communication not hidden by compute takes {iv.value:.0f}% of step time{waiting}",
        ranks=[r.rank for r in hot], evidence=evidence,
        advice=_cap_advice(w, "See the overlap findings for the cause; larger per-rank batches (more compute per "
                           f"byte) or fp16 gradient compression ({comm_hook(ddp_config(a))}) shrink what must be "
                           "hidden.", _exposed_noise_us(a), ddp_config(a)),
    )]


def _exposed_worth_it(a: Analysis) -> bool:
    return any(v >= CAUSE_MIN_EXPOSED_PCT for v in _transfer_pct(a, transfer_us(a)).values())


def rule_comm_tail(a: Analysis, w: WhatIf | None) -> list[Finding]:
    if not _exposed_worth_it(a):
        return []
    durs = {(r.rank, s.step): s.dur_us for r in a.ranks for s in r.per_step}
    tails: dict[int, list[float]] = defaultdict(list)
    shares_all: list[float] = []
    last_bytes: dict[int, list[int]] = defaultdict(list)
    for b in a.buckets:
        if b.is_last:
            tails[b.rank].append(b.after_backward_end_us)
            if durs.get((b.rank, b.step)):
                shares_all.append(100.0 * b.after_backward_end_us / durs[(b.rank, b.step)])
            if b.bytes:
                last_bytes[b.rank].append(b.bytes)
    iv = bootstrap(shares_all)
    if iv is None:
        return []
    if not iv.above(TAIL_WARN_PCT):
        return [undecided("comm-tail-after-backward", "last bucket after backward, % of step", iv, TAIL_WARN_PCT,
                          a)] if iv.undecided(TAIL_WARN_PCT) else []
    ranks, evidence_ms, shares = [], {}, {}
    for r in a.ranks:
        tail, step = median_or_none(tails.get(r.rank, [])), median_step_us(r)
        if tail is None or not step:
            continue
        ranks.append(r.rank)
        evidence_ms[str(r.rank)] = ms(tail)
        shares[str(r.rank)] = round(min(100.0, 100.0 * tail / step), 1)
    if not ranks:
        return []
    lb = median_or_none([float(x) for rk in ranks for x in last_bytes.get(rk, [])])
    tail_us = statistics.median(t for v in tails.values() for t in v)
    return [Finding(
        "comm-tail-after-backward", Severity.WARNING,
        f"The last bucket's all_reduce runs {ms(tail_us)} ms after backward has ended",
        ranks=ranks,
        evidence={**cost(tail_us, _step_us(a)), "tail_pct_of_step": iv.to_json(), "tail_ms_median": evidence_ms,
                  "tail_pct_of_step_by_rank": shares,
                  "last_bucket_mb": None if lb is None else round(lb / MIB, 2), "threshold_pct": TAIL_WARN_PCT},
        advice=_cap_advice(w, _smaller_cap_advice(ddp_config(a), tail=True, sizes_known=_bucket_sizes_known(a)),
                           _exposed_noise_us(a), ddp_config(a)),
    )]


def rule_small_buckets(a: Analysis, w: WhatIf | None) -> list[Finding]:
    if not _exposed_worth_it(a):
        return []
    by_step: dict[tuple[int, int], list[int]] = defaultdict(list)
    step_comm: dict[tuple[int, int], float] = defaultdict(float)
    for b in a.buckets:
        by_step[(b.rank, b.step)].append(b.bytes or 0)
        step_comm[(b.rank, b.step)] += b.dur_us
    small_counts, totals, sizes = [], [], []
    for sizes_in_step in by_step.values():
        small = [x for x in sizes_in_step if 0 < x < SMALL_BUCKET_BYTES]
        small_counts.append(len(small))
        totals.append(len(sizes_in_step))
        sizes.extend(small)
    if not by_step:
        return []
    n_small, n_all = statistics.median(small_counts), statistics.median(totals)
    if n_small < SMALL_BUCKET_MIN_COUNT or n_small < SMALL_BUCKET_MIN_SHARE * n_all:
        return []
    comm = median_or_none(list(step_comm.values()))
    lat = a.bandwidth.latency_us
    share = (n_all * lat / comm) if (lat and comm) else None
    sev = Severity.WARNING if share is not None and share >= LATENCY_SHARE_WARN else Severity.INFO
    ranks = sorted({rk for rk, _ in by_step})
    return [Finding(
        "buckets-latency-bound", sev,
        f"{n_small:g} of {n_all:g} gradient buckets per step are under 1 MiB: latency-bound all_reduces",
        ranks=ranks,
        evidence={**cost(n_all * lat if lat else None, _step_us(a)),
                  "small_buckets_per_step": n_small, "buckets_per_step": n_all,
                  "small_bucket_median_kib": round((median_or_none([float(s) for s in sizes]) or 0) / 1024, 1),
                  "fitted_latency_us": lat, "latency_share_of_comm": None if share is None else round(share, 3)},
        advice=_cap_advice(w, "Raise the bucket size so each all_reduce moves enough bytes: "
                           f"{ddp_option(ddp_config(a), 'bucket_cap_mb', 25)} (the default) or more.",
                           _exposed_noise_us(a), ddp_config(a)),
    )]


def rule_first_bucket_late(a: Analysis, w: WhatIf | None) -> list[Finding]:
    if not _exposed_worth_it(a):
        return []
    bw = {(r.rank, s.step): s for r in a.ranks for s in r.per_step}
    first: dict[tuple[int, int], float] = {}
    for b in a.buckets:
        key = (b.rank, b.step)
        if key not in first or b.start_us < first[key]:
            first[key] = b.start_us
    shares: dict[int, list[float]] = defaultdict(list)
    for key, start in first.items():
        st = bw.get(key)
        if st is None or st.backward_start_us is None or st.backward_end_us is None:
            continue
        span = st.backward_end_us - st.backward_start_us
        if span > 0:
            shares[key[0]].append((start - st.backward_start_us) / span)
    # A share over 1 means the first all_reduce started after backward ended: said as such, never as "454%".
    iv = bootstrap([min(1.0, x) * 100.0 for v in shares.values() for x in v])
    if iv is None:
        return []
    threshold = 100 * FIRST_BUCKET_LATE_SHARE
    if not iv.above(threshold):
        return [undecided("first-bucket-late", "first all_reduce, % of the way through backward", iv, threshold,
                          a)] if iv.undecided(threshold) else []
    late = {rk: min(1.0, statistics.median(v)) for rk, v in shares.items()
            if statistics.median(v) > FIRST_BUCKET_LATE_SHARE}
    if not late:
        return []
    cfg = ddp_config(a) or DDPModule()
    title = ("The first gradient all_reduce starts only after backward has ended" if iv.value >= 100.0 else
             f"The first gradient all_reduce starts {iv.value:.0f}% of the way through backward")
    exposed = median_or_none([s.exposed_comm_us for r in a.ranks for s in r.per_step if r.rank in late])
    return [Finding(
        "first-bucket-late", Severity.WARNING, title,
        ranks=sorted(late),
        evidence={**cost(exposed, _step_us(a)), "first_allreduce_at_backward_pct": iv.to_json(),
                  "by_rank_pct": {str(k): round(100 * v, 1) for k, v in sorted(late.items())},
                  "bucket_cap_mb": cfg.bucket_cap_mb, "threshold_pct": threshold},
        advice=_cap_advice(w, _smaller_cap_advice(cfg, sizes_known=_bucket_sizes_known(a)), _exposed_noise_us(a), cfg),
    )]


# Said instead of a bucket size when neither the trace nor a DDP description gives the buckets' bytes.
SIZES_UNKNOWN_ADVICE = (
    "How large the gradient buckets are is not in these traces (no DDP description, no tensor shapes), so whether a "
    "smaller `bucket_cap_mb` would split them, or leave one small bucket as it is, cannot be told from them: "
    "`ddpdoctor profile` records the bucket layout and runs the bucket what-if (or record with "
    "`record_shapes=True`)."
)


def _bucket_sizes_known(a: Analysis) -> bool:
    """The buckets' bytes come from the trace (shapes) or from a DDP description (RUN/ranks/*/info.json)."""
    cfg = ddp_config(a) or DDPModule()
    return bool(cfg.parameter_bytes or cfg.buckets or any(b.bytes for b in a.buckets))


def _smaller_cap_advice(cfg: DDPModule | None, tail: bool = False, sizes_known: bool = True) -> str:
    """A smaller cap than the current one, or, at 1 MiB already, the reason a smaller cap will not help; without the
    buckets' sizes, that no cap can be advised and what would tell."""
    if not sizes_known:
        return SIZES_UNKNOWN_ADVICE
    cap = cfg.bucket_cap_mb if cfg else None
    if isinstance(cap, (int, float)) and cap <= 1:
        if tail:
            return ("Buckets are already 1 MiB: the tail is the queue of all_reduces still waiting when backward "
                    f"ends; more compute per step (larger batch) or fewer bytes ({comm_hook(cfg, plain='fp16_compress_hook')}) "
                    "shorten it.")
        return ("Buckets are already 1 MiB: the first bucket waits for the last layers' gradients, which are "
                "large or produced late; reorder or split those layers, or accept the late start.")
    smaller = max(1.0, float(cap) / 4) if isinstance(cap, (int, float)) else 5.0
    if tail:
        return (f"Smaller buckets make the last one (the first layers' gradients, ready last) small: "
                f"{ddp_option(cfg, 'bucket_cap_mb', smaller)}.")
    return (f"Buckets are so large that communication starts late: {ddp_option(cfg, 'bucket_cap_mb', smaller)} "
            "starts the first all_reduce earlier.")


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
                       _step_us(a)),
                  "calls": {n: len(v) for n, v in sorted(hits.items())},
                  "steps": sorted({e.step for e in all_hits}),
                  "time_ms": round(sum(float(getattr(e, "dur_us", 0.0)) for e in all_hits) / 1000, 3)},
        advice="Remove `.item()`, `.cpu()`, `torch.cuda.synchronize()` from backward hooks and the loss path "
        "before `backward()` completes; log scalars after `optimizer.step()` (or accumulate them on device).",
    )]


def rule_whatif(a: Analysis, w: WhatIf | None) -> list[Finding]:
    if not _recommends(w, _exposed_noise_us(a)) or w is None or w.saving_pct_of_step is None \
            or w.best_bucket_cap_mb is None:
        return []
    # A warning needs a model that reproduces this run better than the saving it promises.
    trusted = w.fit_error_pct_of_step is not None and w.fit_error_pct_of_step <= w.saving_pct_of_step
    sev = Severity.WARNING if w.saving_pct_of_step >= WHATIF_WARN_PCT and trusted else Severity.INFO
    return [Finding(
        "bucket-cap-whatif", sev,
        f"bucket_cap_mb={w.best_bucket_cap_mb:g} is predicted to save {ms(w.saving_us_per_step)} ms per step",
        ranks=sorted({r.rank for r in a.ranks}),
        evidence={**cost(w.saving_us_per_step, w.step_time_us), "current_bucket_cap_mb": w.current_bucket_cap_mb,
                  "current_buckets_per_step": w.current_buckets_per_step,
                  "predicted_buckets_per_step": {f"{p.bucket_cap_mb:g}": p.buckets_per_step for p in w.predictions},
                  "noise_ms": ms(_exposed_noise_us(a)),
                  "predicted_exposed_ms": {f"{p.bucket_cap_mb:g}": ms(p.exposed_comm_us) for p in w.predictions},
                  "current_predicted_exposed_ms": ms(w.current_predicted_exposed_us),
                  "current_measured_exposed_ms": ms(w.measured_exposed_us),
                  "saving_pct_of_step": round(w.saving_pct_of_step, 1),
                  "fit_error_pct_of_step": None if w.fit_error_pct_of_step is None else round(w.fit_error_pct_of_step, 1),
                  "latency_us": w.latency_us, "bytes_per_us": w.bytes_per_us,
                  "bandwidth_source": w.bandwidth_source, "grad_source": w.grad_source},
        advice=f"{ddp_option(ddp_config(a), 'bucket_cap_mb', w.best_bucket_cap_mb)}, then profile again to confirm.",
    )]


RULES: tuple[Callable[[Analysis, WhatIf | None], list[Finding]], ...] = (
    rule_no_communication, rule_exposed_comm, rule_comm_tail, rule_small_buckets, rule_first_bucket_late,
    rule_sync_in_backward, rule_ddp_flags, rule_stragglers, rule_step_variance, rule_data_wait, rule_whatif,
    rule_no_steps,
)


def perf_findings(analysis: Analysis, whatif: WhatIf | None = None) -> list[Finding]:
    """Every performance rule over ``analysis`` (the bucket what-if is computed unless given), with undecided
    figures merged into one not-measurable finding and one advice per root cause."""
    w = whatif if whatif is not None else on_transfer(bucket_whatif(analysis), analysis)
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(analysis, w))
    if _single_bucket(analysis) is not None:
        # One bucket: tail, late start, bucket sizes and the what-if all describe the same unavoidable fact.
        out = [f for f in out if f.id not in COMM_GROUP or f.id == "exposed-comm-high"]
    return group_root_causes(merge_undecided(out, analysis))


def on_transfer(w: WhatIf, a: Analysis) -> WhatIf:
    """The what-if's saving capped at the exposed transfer per step (median): what a bucket layout can win back is
    communication, not the wait for a late peer that the simulated exposed time also holds."""
    if not w.available or w.saving_us_per_step is None or not a.comm_split:
        return w
    tr = list(transfer_us(a).values())
    cap = statistics.median(tr) if tr else 0.0
    if w.saving_us_per_step <= cap:
        return w
    step = w.step_time_us or 0.0
    return replace(w, saving_us_per_step=cap, saving_pct_of_step=100.0 * cap / step if step > 0 else None)


def perf_report_parts(analysis: Analysis) -> tuple[JsonObject, list[Finding]]:
    """The ``whatif`` JSON section and the findings, computing the what-if once (for the analyze pipeline)."""
    w = on_transfer(bucket_whatif(analysis), analysis)
    return {"whatif": w.to_json()}, perf_findings(analysis, w)
