"""The bucket what-if as advice and as a finding: when it recommends a bucket_cap_mb, the advice the overlap
findings give, and the saving capped at what a bucket layout can win back (docs/whatif.md)."""

from __future__ import annotations

import statistics
from dataclasses import replace

from ddpdoctor.analyses.intervals import bootstrap
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import WhatIf, ddp_config
from ddpdoctor.findings.framework_advice import comm_hook, ddp_option
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_balance import ms
from ddpdoctor.findings.perf_verdict import cost
from ddpdoctor.rundir.schema import DDPModule

# The bucket what-if is reported when its predicted saving reaches 2% of a step (info) or 10% (warning).
WHATIF_INFO_PCT = 2.0
WHATIF_WARN_PCT = 10.0


def recommends(w: WhatIf | None, noise_us: float = 0.0) -> bool:
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


def exposed_noise_us(a: Analysis) -> float:
    """Half the interval of exposed transfer per step: a predicted saving below it cannot be told from noise."""
    iv = bootstrap(list(transfer_us(a).values()) if any(r.comm_us > 0 for r in a.ranks) else [])
    return iv.half_width if iv is not None and iv.measurable else 0.0


def cap_advice(whatif: WhatIf | None, fallback: str, noise_us: float = 0.0, cfg: DDPModule | None = None) -> str:
    """The what-if's cap when it recommends one, else ``fallback`` (without the what-if), or why no cap helps; said
    in the terms of the framework that built DDP (``cfg``: the DDP description)."""
    if not recommends(whatif, noise_us):
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


def rule_whatif(a: Analysis, w: WhatIf | None) -> list[Finding]:
    if not recommends(w, exposed_noise_us(a)) or w is None or w.saving_pct_of_step is None \
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
                  "noise_ms": ms(exposed_noise_us(a)),
                  "predicted_exposed_ms": {f"{p.bucket_cap_mb:g}": ms(p.exposed_comm_us) for p in w.predictions},
                  "current_predicted_exposed_ms": ms(w.current_predicted_exposed_us),
                  "current_measured_exposed_ms": ms(w.measured_exposed_us),
                  "saving_pct_of_step": round(w.saving_pct_of_step, 1),
                  "fit_error_pct_of_step": None if w.fit_error_pct_of_step is None else round(w.fit_error_pct_of_step, 1),
                  "latency_us": w.latency_us, "bytes_per_us": w.bytes_per_us,
                  "bandwidth_source": w.bandwidth_source, "grad_source": w.grad_source},
        advice=f"{ddp_option(ddp_config(a), 'bucket_cap_mb', w.best_bucket_cap_mb)}, then profile again to confirm.",
    )]


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
