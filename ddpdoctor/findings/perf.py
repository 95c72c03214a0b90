"""Performance findings: the overlap rules (exposed communication, its tail, bucket sizes, the first bucket) and
the walk of every performance rule over an Analysis (docs/findings.md explains every threshold)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ddpdoctor.analyses.bucket_replay import MIB
from ddpdoctor.analyses.intervals import bootstrap
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import CANDIDATE_CAPS_MB, WhatIf, bucket_whatif, ddp_config
from ddpdoctor.findings.framework_advice import comm_hook, ddp_option
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_balance import (
    median_or_none,
    median_step_us,
    ms,
    rule_data_wait,
    rule_step_variance,
    rule_stragglers,
    run_step_us,
)
from ddpdoctor.findings.perf_ddp_flags import rule_ddp_flags
from ddpdoctor.findings.perf_sync_in_backward import rule_sync_in_backward
from ddpdoctor.findings.perf_verdict import (
    COMM_GROUP,
    cost,
    group_root_causes,
    merge_undecided,
    undecided,
)
from ddpdoctor.findings.perf_whatif import cap_advice, exposed_noise_us, on_transfer, rule_whatif, transfer_us
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
        **cost(exposed_us, run_step_us(a)),
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
    if a.fsdp:  # FSDP2: the cause is per unit (findings/perf_fsdp.py); DDP's knobs do not apply
        return [Finding(
            "exposed-comm-high", Severity.WARNING,
            f"Communication not hidden by compute takes {iv.value:.0f}% of step time{waiting}",
            ranks=[r.rank for r in hot], evidence=evidence,
            advice="The FSDP2 unit inventory (fsdp_units) shows which unit's all-gather or reduce-scatter is "
                   "exposed, and the fsdp-* findings say why (no prefetch, a synchronous wait, the first unit's "
                   "unavoidable all-gather) and what to change.",
        )]
    return [Finding(
        "exposed-comm-high", Severity.WARNING,
        f"Communication not hidden by compute takes {iv.value:.0f}% of step time{waiting}",
        ranks=[r.rank for r in hot], evidence=evidence,
        advice=cap_advice(w, "See the overlap findings for the cause; larger per-rank batches (more compute per "
                          f"byte) or fp16 gradient compression ({comm_hook(ddp_config(a))}) shrink what must be "
                          "hidden.", exposed_noise_us(a), ddp_config(a)),
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
    per_rank = {rk: m for rk, v in tails.items() if (m := median_or_none(v)) is not None}
    return [Finding(
        "comm-tail-after-backward", Severity.WARNING,
        f"The last bucket's all_reduce runs {ms(tail_us)} ms after backward has ended",
        ranks=ranks,
        evidence={**_priced(a, per_rank, tail_us), "tail_pct_of_step": iv.to_json(), "tail_ms_median": evidence_ms,
                  "tail_pct_of_step_by_rank": shares,
                  "last_bucket_mb": None if lb is None else round(lb / MIB, 2), "threshold_pct": TAIL_WARN_PCT},
        advice=cap_advice(w, _smaller_cap_advice(ddp_config(a), tail=True, sizes_known=_bucket_sizes_known(a)),
                          exposed_noise_us(a), ddp_config(a)),
    )]


def _without_waiting(a: Analysis, per_rank: dict[int, float]) -> tuple[float | None, float | None]:
    """(what a figure costs per step with the wait for a straggler removed, the part removed): a rank that waits for
    a straggler sees its own bucket transfer plus the wait; the straggler itself (the rank the others wait for) sees
    the transfer alone. Without a flagged straggler the median over ranks, nothing removed."""
    if not per_rank:
        return None, None
    everyone = statistics.median(per_rank.values())
    late = [per_rank[r] for r in (a.stragglers.ranks if a.stragglers else []) if r in per_rank]
    if not late or len(late) == len(per_rank):
        return everyone, None
    own = statistics.median(late)
    return own, max(0.0, everyone - own)


def _priced(a: Analysis, per_rank: dict[int, float], fallback: float | None) -> dict[str, float | None]:
    """The finding's cost per step with the waiting part removed, and that part, named in the evidence."""
    own, removed = _without_waiting(a, per_rank)
    out = cost(own if removed is not None else fallback, run_step_us(a))
    out["waiting_for_straggler_removed_ms_per_step"] = None if removed is None else ms(removed)
    return out


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
        evidence={**cost(n_all * lat if lat else None, run_step_us(a)),
                  "small_buckets_per_step": n_small, "buckets_per_step": n_all,
                  "small_bucket_median_kib": round((median_or_none([float(s) for s in sizes]) or 0) / 1024, 1),
                  "fitted_latency_us": lat, "latency_share_of_comm": None if share is None else round(share, 3)},
        advice=cap_advice(w, "Raise the bucket size so each all_reduce moves enough bytes: "
                          f"{ddp_option(ddp_config(a), 'bucket_cap_mb', 25)} (the default) or more.",
                          exposed_noise_us(a), ddp_config(a)),
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
    per_rank = {r.rank: m for r in a.ranks
                if (m := median_or_none([s.exposed_comm_us for s in r.per_step])) is not None}
    return [Finding(
        "first-bucket-late", Severity.WARNING, title,
        ranks=sorted(late),
        evidence={**_priced(a, per_rank, exposed), "first_allreduce_at_backward_pct": iv.to_json(),
                  "by_rank_pct": {str(k): round(100 * v, 1) for k, v in sorted(late.items())},
                  "bucket_cap_mb": cfg.bucket_cap_mb, "threshold_pct": threshold},
        advice=cap_advice(w, _smaller_cap_advice(cfg, sizes_known=_bucket_sizes_known(a)), exposed_noise_us(a), cfg),
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
    from ddpdoctor.findings.perf_fsdp import fsdp_findings

    out.extend(fsdp_findings(analysis))  # FSDP2 units' exposed communication and its cause
    if _single_bucket(analysis) is not None:
        # One bucket: tail, late start, bucket sizes and the what-if all describe the same unavoidable fact.
        out = [f for f in out if f.id not in COMM_GROUP or f.id == "exposed-comm-high"]
    return group_root_causes(merge_undecided(out, analysis))



def perf_report_parts(analysis: Analysis) -> tuple[JsonObject, list[Finding]]:
    """The ``whatif`` JSON section and the findings, computing the what-if once (for the analyze pipeline)."""
    w = on_transfer(bucket_whatif(analysis), analysis)
    return {"whatif": w.to_json()}, perf_findings(analysis, w)
