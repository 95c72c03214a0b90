"""Performance rules about DDP's own flags: find_unused_parameters when nothing is unused, a static graph that
static_graph would speed up, gradients copied out of the buckets (docs/findings.md)."""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.analyses.bucket_replay import MIB
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import WhatIf, ddp_config
from ddpdoctor.findings.framework_advice import ddp_option
from ddpdoctor.findings.model import Finding, Severity

# gradient_as_bucket_view saves one gradient-sized copy per step and that much memory; below 25 MiB (one default
# bucket) the saving is under a millisecond on any GPU and not worth a finding.
GRAD_VIEW_MIN_BYTES = 25 * MIB


def rule_ddp_flags(a: Analysis, w: WhatIf | None) -> list[Finding]:
    cfg = ddp_config(a)
    if not cfg:
        return []
    out: list[Finding] = []
    n_params = cfg.parameter_tensors or len(cfg.parameters)
    per_step: dict[tuple[int, int], int] = defaultdict(int)
    for g in a.grad_ready:
        if g.step is not None:
            per_step[(g.rank, g.step)] += 1
    counts = sorted(set(per_step.values()))
    ranks = sorted({r.rank for r in a.ranks})
    steps = sorted({s for _, s in per_step})
    if cfg.find_unused_parameters:
        if counts and n_params and min(counts) >= n_params:
            out.append(Finding(
                "find-unused-parameters-unneeded", Severity.WARNING,
                "find_unused_parameters=True, but every parameter received a gradient in every step",
                ranks=ranks, evidence={"parameter_tensors": n_params, "gradients_per_step": counts, "steps": steps},
                advice=f"{ddp_option(cfg, 'find_unused_parameters', False)}: it skips a traversal of the autograd "
                "graph every step and lets gradient all_reduces start during backward.",
            ))
        elif counts and len(counts) == 1 and not cfg.static_graph:
            out.append(Finding(
                "static-graph-would-help", Severity.INFO,
                f"The same {counts[0]} of {n_params} parameters get gradients every step: the graph looks static",
                ranks=ranks,
                evidence={"parameter_tensors": n_params, "gradients_per_step": counts[0], "steps": steps},
                advice=f"{ddp_option(cfg, 'static_graph', True)} (keeping find_unused_parameters) lets DDP skip "
                "the per-step search for unused parameters after the first iteration.",
            ))
        elif not counts:
            out.append(Finding(
                "find-unused-parameters-on", Severity.INFO,
                "find_unused_parameters=True costs a graph traversal every step",
                ranks=ranks, evidence={"parameter_tensors": n_params, "gradients_per_step": None},
                advice=f"If every parameter gets a gradient, use {ddp_option(cfg, 'find_unused_parameters', False)}; "
                f"if the unused set never changes, {ddp_option(cfg, 'static_graph', True)}.",
            ))
    nbytes = int(cfg.parameter_bytes or 0)
    if cfg.gradient_as_bucket_view is False and nbytes >= GRAD_VIEW_MIN_BYTES:
        out.append(Finding(
            "gradient-as-bucket-view-off", Severity.INFO,
            f"Gradients are copied out of DDP's buckets every step ({nbytes / MIB:.0f} MiB)",
            ranks=ranks, evidence={"parameter_bytes": nbytes, "threshold_bytes": GRAD_VIEW_MIN_BYTES},
            advice=f"{ddp_option(cfg, 'gradient_as_bucket_view', True)} makes .grad views into the buckets: one copy and "
            f"{nbytes / MIB:.0f} MiB of memory less (do not detach_() or replace .grad in your code).",
        ))
    return out
