"""Findings of `check-sync`: tensors that differ across ranks, gradients DDP never reduced, and data sharded wrong."""

from __future__ import annotations

import math
from typing import Any

from ddpdoctor.analyses.sync import EQUIVALENCE_RTOL, RTOL, SyncAnalysis, TensorCheck, TensorDiff
from ddpdoctor.findings.framework_advice import ddp_option
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.schema import Equivalence

NAMES_SHOWN = 5

_ADVICE = {
    "grad": "Gradients must be identical after DDP's all-reduce. Look for code that changes .grad on one rank after "
            "backward (clipping with a per-rank norm, manual scaling), parameters outside the DDP module, or backward "
            "passes under no_sync().",
    "param": "Parameters must stay identical. Look for code that edits weights on one rank after DDP wrapped the model "
             "(loading a checkpoint on rank 0 only, re-initialising a layer), or parameters the optimizer updates but "
             "DDP does not reduce. Wrap the model after every rank has loaded the same weights.",
}


def _fmt(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def _divergence_finding(check: TensorCheck, id_: str, severity: Severity, never_reduced_steps: set[int]) -> Finding:
    step = check.first_step
    first = [d for d in check.diverged if d.step == step]
    names = [d.name for d in first]
    ranks = sorted({r for d in first for r in d.ranks})
    kind = {"grad": "Gradients", "param": "Parameters", "buffer": "Buffers"}[check.kind]
    later = sorted({d.step for d in check.diverged})
    title = f"{kind} differ across ranks from step {step}: {', '.join(names[:3])}" + (
        f" and {len(names) - 3} more" if len(names) > 3 else "")
    if check.kind == "grad" and step in never_reduced_steps:
        title += " (this step's backward was never reduced: see grads-never-synced)"
    worst: TensorDiff = max(first, key=lambda d: d.max_rel_diff)
    evidence: dict[str, Any] = {  # an evidence map (Finding.evidence): shown and copied as it is
        "step": step,
        "parameters": names[:NAMES_SHOWN] if check.kind != "buffer" else None,
        "buffers": names[:NAMES_SHOWN] if check.kind == "buffer" else None,
        "tensors_diverged": len(first),
        "reference_rank": first[0].reference_rank,
        "ranks": ranks,
        "max_abs_diff": _fmt(max(d.max_abs_diff for d in first)),
        "max_rel_diff": _fmt(worst.max_rel_diff),
        "worst_tensor": worst.name,
        "steps_diverged": later,
        "tolerance_rel": RTOL,
    }
    evidence = {k: v for k, v in evidence.items() if v is not None}
    dims = sorted({dim for d in first for dim in d.over or []})
    if dims:  # DTensor parameters Replicate()d over mesh dims: equal only across those (HSDP replicas, TP norms)
        where = ", ".join(f"'{dim}'" for dim in dims)
        title = (f"{kind} that are Replicate() over mesh dim {where} differ across its ranks from step {step}: "
                 f"{', '.join(names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else ""))
        evidence["mesh_dims"] = dims
        evidence["compared_over"] = {d.name: d.over for d in first[:NAMES_SHOWN]}
        return Finding(id_, severity, title, ranks=ranks, evidence=evidence, advice=_REPLICATE_ADVICE)
    evidence = {k: v for k, v in evidence.items() if v is not None}
    return Finding(id_, severity, title, ranks=ranks, evidence=evidence, advice=_ADVICE.get(check.kind, ""))


_REPLICATE_ADVICE = (
    "A DTensor placed Replicate() over a mesh dim must hold the same values on every rank of that dim (HSDP's "
    "replicas; tensor parallelism's norm weights and biases). Look for a gradient of a replicated parameter that is "
    "not reduced over that dim (a Partial() gradient, pytorch/pytorch#160169: a norm inside a tensor-parallel "
    "region), an in-place edit of .to_local() on one rank, or a checkpoint loaded on one rank only.")


def _nothing_compared(analysis: SyncAnalysis) -> list[Finding]:
    """Zero comparisons is not a pass: say that nothing was checked, and why, instead of `ok`."""
    compared = (analysis.grads.comparisons + analysis.params.comparisons + analysis.buffers.comparisons
                + analysis.optimizer_steps.comparisons)
    eq = analysis.equivalence
    if compared or analysis.layouts.comparisons or len(analysis.ranks) < 2 or (eq is not None and eq.relative_error):
        return []
    return [Finding(
        "nothing-compared", Severity.WARNING,
        "check-sync compared no gradient, parameter or buffer across ranks: nothing was checked",
        ranks=analysis.ranks,
        evidence={"grad_comparisons": 0, "param_comparisons": 0, "buffer_comparisons": 0,
                  "modules": len(analysis.modules), "steps_checked": analysis.steps_checked},
        advice="Read the notes above: the fingerprint probe may have failed and switched itself off, the script may "
               "have ended before its first optimizer step, or it built nothing to compare. The data sharding "
               "checks below still stand.",
    )]


def _layout_findings(analysis: SyncAnalysis) -> list[Finding]:
    differ = analysis.layouts.differ
    if not differ:
        return []
    name, layout, ranks = differ[0]
    return [Finding(
        "shard-layout-differs", Severity.ERROR,
        f"{len(differ)} DTensor parameter(s) have another shape, mesh or placement on rank(s) {ranks} than on the "
        f"lowest rank: {name}",
        ranks=sorted({r for d in differ for r in d[2]}),
        evidence={"parameters": [d[0] for d in differ[:NAMES_SHOWN]], "reference_layout": layout,
                  "count": len(differ)},
        advice="Every rank must shard the same parameters the same way (the same fully_shard calls and "
               "parallelize_module plan on the same mesh): their collectives would not match otherwise.",
    )]


def _without_ddp(f: Finding) -> Finding:
    """The parameter divergence of a multi-rank job that built no DDP module: nothing averages gradients."""
    step = f.evidence.get("step")
    return Finding(
        "param-divergence", Severity.ERROR,
        f"Parameters differ across ranks from step {step} and no DistributedDataParallel module wraps the model: "
        "no gradient averaging happens, each rank trains its own model",
        ranks=f.ranks, evidence=dict(f.evidence, ddp=False),
        advice="Wrap the model in DistributedDataParallel after moving it to its device (the CPU path too: "
               "DDP(model) with device_ids=None on CPU and gloo), or all-reduce and average the gradients yourself "
               "before optimizer.step().",
    )


def _tolerance_finding(check: TensorCheck, id_: str) -> Finding:
    d = check.within_tolerance
    return Finding(
        id_, Severity.INFO,
        f"{len(d)} {check.kind} fingerprint(s) differ across ranks, but only within the tolerance (relative {RTOL:g})",
        ranks=sorted({r for x in d for r in x.ranks}),
        evidence={"first_step": d[0].step, "tensors": [x.name for x in d[:NAMES_SHOWN]],
                  "max_rel_diff": max(x.max_rel_diff for x in d)},
        advice="Not bitwise equal, which DDP normally guarantees; harmless at this size, but expected only on "
               "ranks with different hardware or non-deterministic kernels.",
    )


def _buffer_findings(analysis: SyncAnalysis) -> list[Finding]:
    check = analysis.buffers
    if not check.diverged:
        return [_tolerance_finding(check, "buffer-divergence")] if check.within_tolerance else []
    modules = {m.index: m for m in analysis.modules}
    step = check.first_step
    first = [d for d in check.diverged if d.step == step]
    mod = modules.get(first[0].module)
    bn = set(mod.batchnorm_buffers if mod else [])
    if mod is not None and mod.ddp is False and not any(d.over for d in first):
        return [_buffer_finding_without_ddp(check, all(d.name in bn for d in first))]
    # DDP's default (broadcast_buffers=True) when the module did not say
    broadcast = mod is None or mod.broadcast_buffers is None or mod.broadcast_buffers
    unsynced = not broadcast or not analysis.buffer_sync_by_ddp.get(first[0].module, True)
    f = _divergence_finding(check, "buffer-divergence", Severity.WARNING if unsynced else Severity.ERROR, set())
    evidence = dict(f.evidence, broadcast_buffers=broadcast, batchnorm=all(d.name in bn for d in first))
    if evidence["batchnorm"] and not broadcast:
        title = f"BatchNorm running statistics drift apart across ranks from step {step} (broadcast_buffers=False)"
        advice = ("Each rank updates running_mean/running_var from its own batches and DDP, with broadcast_buffers=False, "
                  "never copies rank 0's. Training is unaffected (BatchNorm in train mode normalises with the batch's "
                  "statistics, and gradients are still averaged), but evaluation and checkpoints use the running "
                  "statistics, so each rank would evaluate a different model. It matters if you evaluate or save on "
                  f"more than one rank or compare them: use {ddp_option(mod, 'broadcast_buffers', True)} (the default), SyncBatchNorm "
                  "(torch.nn.SyncBatchNorm.convert_sync_batchnorm), or all-reduce the buffers before evaluating.")
    elif unsynced:
        title = f"Buffers differ across ranks from step {step}; DDP does not broadcast them (broadcast_buffers=False)"
        advice = ("With broadcast_buffers=False every rank keeps its own buffers. If they should agree, use "
                  f"{ddp_option(mod, 'broadcast_buffers', True)} or synchronise them yourself.")
    else:
        title = f"Buffers differ across ranks at step {step} even though DDP had just broadcast them"
        advice = ("Something changed buffers on one rank between DDP's broadcast and the forward (a forward pre-hook, "
                  "a rank-dependent branch): find the code that writes them.")
    return [Finding("buffer-divergence", f.severity, title, ranks=f.ranks, evidence=evidence, advice=advice)]


def _buffer_finding_without_ddp(check: TensorCheck, batchnorm: bool) -> Finding:
    """Buffers that differ in a job without DDP (FSDP2, DTensor): nothing broadcasts buffers there."""
    f = _divergence_finding(check, "buffer-divergence", Severity.WARNING if batchnorm else Severity.ERROR, set())
    step = f.evidence.get("step")
    evidence = dict(f.evidence, ddp=False, batchnorm=batchnorm)
    if batchnorm:
        return Finding(
            "buffer-divergence", Severity.WARNING,
            f"BatchNorm running statistics drift apart across ranks from step {step} (no DDP: nothing broadcasts "
            "buffers)", ranks=f.ranks, evidence=evidence,
            advice="fully_shard shards parameters, never buffers, and no one broadcasts them: each rank updates "
                   "running_mean/running_var from its own batches. Training is unaffected (BatchNorm in train mode "
                   "uses the batch's statistics), but each rank would evaluate a different model and a checkpoint "
                   "keeps one rank's statistics. Use SyncBatchNorm, or all-reduce the buffers before evaluating or "
                   "saving.")
    return Finding(
        "buffer-divergence", Severity.ERROR,
        f"Buffers differ across ranks from step {step}: {', '.join(f.evidence.get('buffers') or [])} (no DDP: "
        "nothing broadcasts buffers, so the ranks ran their forwards with other values)",
        ranks=f.ranks, evidence=evidence,
        advice="fully_shard (FSDP2) and DTensor shard or replicate parameters and leave buffers as each rank made "
               "them: no broadcast keeps them equal, and the gradients the ranks reduce together then come from "
               "different models. Find the code that writes the buffer on one rank (a rank-dependent "
               "initialisation, a checkpoint or state loaded on one rank only, an in-place update in forward "
               "computed from this rank's batch), or broadcast the buffers from rank 0 once before training.")


def _optimizer_step_findings(analysis: SyncAnalysis) -> list[Finding]:
    """An optimizer that took another number of steps on some rank: that rank's parameters (its shard, under
    FSDP2, where no other rank holds the same values to compare) are updates behind or ahead."""
    check = analysis.optimizer_steps
    if not check.diverged:
        return []
    d = check.diverged[0]
    ranks = sorted({r for x in check.diverged if x.step == d.step for r in x.ranks})
    cls = analysis.optimizers[d.module] if d.module < len(analysis.optimizers) else "optimizer"
    values = analysis.optimizer_step_values

    def calls(rank: int) -> str:
        v = values.get(rank, [None])[0]
        return "?" if v is None else str(int(v))

    title = (f"The optimizer ({cls}) took another number of steps on rank{'s' if len(ranks) > 1 else ''} "
             f"{', '.join(map(str, ranks))} than on rank {d.reference_rank} from step {d.step}: "
             f"{calls(ranks[0])} step() call(s) against {calls(d.reference_rank)}")
    return [Finding(
        "optimizer-steps-differ", Severity.ERROR, title, ranks=ranks,
        evidence={"step": d.step, "optimizer": cls, "optimizer_index": d.module, "reference_rank": d.reference_rank,
                  "differs": d.name, "steps_diverged": sorted({x.step for x in check.diverged})[:20],
                  "step_calls": {str(r): (None if v[0] is None else int(v[0])) for r, v in values.items()},
                  "state_step_min_max": {str(r): v[1:] for r, v in values.items()}},
        advice="Every rank must call optimizer.step() together. A step skipped on one rank (a rank-local test of "
               "the loss or the gradient norm: under FSDP2 each rank sees only its own shard's norm) leaves that "
               "rank's parameters, or its shard of them, an update behind and Adam's bias correction out of step; "
               "no other rank holds a sharded parameter's values, so nothing else shows it. Decide a skip on every "
               "rank together (all-reduce the flag, as torch's ShardedGradScaler does with found_inf), and compute "
               "a clipping norm over the whole model (torch.nn.utils.clip_grad_norm_ on DTensor gradients does).",
    )]


def _nonfinite_findings(analysis: SyncAnalysis) -> list[Finding]:
    """NaN/inf gradients or parameters: every rank may hold the same NaN (DDP all-reduced one rank's into all), so
    the comparison across ranks passes; the job computes garbage all the same."""
    if not analysis.nonfinite:
        return []
    nf = analysis.nonfinite[0]  # gradients first: parameters go non-finite after them
    kind = {"grad": "Gradients", "param": "Parameters"}.get(nf.kind, "Tensors")
    shown = ", ".join(nf.names[:3]) + (f" and {len(nf.names) - 3} more" if len(nf.names) > 3 else "")
    title = f"{kind} are NaN or inf from step {nf.step}: {shown}"
    culprits = nf.local_ranks or nf.ranks
    if nf.local_ranks:
        title += (f" (rank{'s' if len(nf.local_ranks) > 1 else ''} {', '.join(map(str, nf.local_ranks))}: "
                  "its own gradient before DDP's all-reduce)")
    return [Finding(
        "nonfinite-values", Severity.ERROR, title, ranks=culprits, evidence={
            "kind": nf.kind, "step": nf.step, "module": nf.module, "tensors": nf.names[:NAMES_SHOWN],
            "tensors_nonfinite": len(nf.names), "ranks_holding": nf.ranks, "local_nonfinite_ranks": nf.local_ranks,
            "steps_nonfinite": nf.steps[:20],
            "also": [f"{x.kind} from step {x.step}" for x in analysis.nonfinite[1:]],
        },
        advice="DDP averages one rank's NaN or inf gradient into every rank, so the ranks still agree and the model "
               "is lost on all of them. Find what made that rank's loss non-finite (a bad sample, a log of zero, an "
               "overflow in half precision); `ddpdoctor run` names the rank whose loss went NaN first. Skip the step "
               "on every rank together (all-reduce the finiteness flag), never on one rank alone.",
    )]


def sync_findings(analysis: SyncAnalysis) -> list[Finding]:
    findings: list[Finding] = []
    never_reduced = {u.step for u in analysis.never_synced}
    for check, id_ in ((analysis.grads, "grad-divergence"), (analysis.params, "param-divergence")):
        if check.diverged:
            f = _divergence_finding(check, id_, Severity.ERROR, never_reduced)
            if (check.kind == "param" and analysis.modules and all(m.ddp is False for m in analysis.modules)
                    and not any(d.over for d in check.diverged)):
                f = _without_ddp(f)
            findings.append(f)
        elif check.within_tolerance:
            findings.append(_tolerance_finding(check, id_))
    findings.extend(_nonfinite_findings(analysis))
    findings.extend(_buffer_findings(analysis))
    findings.extend(_optimizer_step_findings(analysis))
    findings.extend(_layout_findings(analysis))
    findings.extend(_nothing_compared(analysis))
    if analysis.never_synced:
        u = analysis.never_synced
        findings.append(Finding(
            "grads-never-synced", Severity.ERROR,
            f"{len(u)} optimizer step(s) applied gradients that DDP never reduced (backward under no_sync())",
            ranks=sorted({r for x in u for r in x.ranks}),
            evidence={"steps": [x.step for x in u][:20], "module": u[0].module,
                      "unsynced_forwards_in_first_step": u[0].unsynced_forwards},
            advice="no_sync() skips the all-reduce, for gradient accumulation: the LAST micro-batch before "
                   "optimizer.step() must run outside no_sync() so DDP reduces the accumulated gradients. "
                   "Otherwise each rank steps with its own gradients and the replicas drift apart.",
        ))
    names = {m.index: m for m in analysis.modules}
    for module, unused in analysis.unused.items():
        described = names.get(module)
        findings.append(Finding(
            "unused-parameters", Severity.WARNING,
            f"{len(unused)} parameter(s) of DDP module #{module} never got a gradient in {analysis.steps_checked} steps: "
            + ", ".join(unused[:3]) + (" …" if len(unused) > 3 else ""),
            ranks=analysis.ranks,
            evidence={"module": module, "parameters": unused[:20], "count": len(unused),
                      "find_unused_parameters": described.find_unused_parameters if described else None},
            advice="Parameters outside the loss's graph cost memory and, with find_unused_parameters=True, a graph "
                   "traversal every step. Remove them, freeze them (requires_grad=False) before wrapping, or check why "
                   "the forward skips them.",
        ))
    for mod in analysis.modules:
        if mod.ignored_params:
            findings.append(Finding(
                "unused-parameters", Severity.INFO,
                f"{len(mod.ignored_params)} parameter(s) of DDP module #{mod.index} are excluded from DDP "
                "(_ddp_params_and_buffers_to_ignore): their gradients are never averaged",
                ranks=analysis.ranks, evidence={"module": mod.index, "parameters": mod.ignored_params[:20]},
                advice="Fine when you reduce them yourself; otherwise they diverge (see grad-divergence).",
            ))
    if analysis.outside_ddp:
        shown = [o for o in analysis.outside_ddp if o.rank == analysis.outside_ddp[0].rank]
        findings.append(Finding(
            "unused-parameters", Severity.WARNING,
            f"The optimizer updates {len(shown)} parameter(s) that belong to no DDP module: DDP never averages their gradients",
            ranks=sorted({o.rank for o in analysis.outside_ddp}),
            evidence={"parameters": [f"{o.name} {o.shape}" for o in shown[:10]], "count": len(shown)},
            advice="Put every trained module inside the DDP wrapper (one DDP around the whole model), or all-reduce "
                   "those gradients yourself.",
        ))
    findings.extend(_equivalence_findings(analysis.equivalence))
    return findings


def _equivalence_findings(eq: Equivalence | None) -> list[Finding]:
    if eq is None:
        return []
    if eq.skipped:
        return [Finding("ddp-equivalence", Severity.INFO, f"Equivalence check skipped: {eq.skipped}",
                        evidence={"step": eq.step})]
    errs = {k: (float(v) if v is not None else None) for k, v in (eq.relative_error or {}).items()}
    known = {k: v for k, v in errs.items() if v is not None}
    if not known:
        return [Finding("ddp-equivalence", Severity.INFO, "Equivalence check compared no gradient", evidence={"step": eq.step})]
    worst_name = max(known, key=lambda k: known[k])
    worst = known[worst_name]
    caveats = list(eq.caveats or [])
    evidence = {"step": eq.step, "world_size": eq.world_size, "batch_sizes": eq.batch_sizes,
                "max_relative_error": _fmt(worst), "worst_parameter": worst_name, "tolerance": EQUIVALENCE_RTOL,
                "relative_error": {k: _fmt(v) for k, v in list(known.items())[:50]}, "caveats": caveats}
    evidence["mode"] = eq.mode or "union batch"
    per_rank_mode = evidence["mode"] == "per-rank batches"
    if worst <= EQUIVALENCE_RTOL:
        what = (f"the average of one process's gradients on each of the {eq.world_size} ranks' batches (the "
                "model's outputs have no batch dimension, e.g. it returns its loss, so the batches were not joined)"
                if per_rank_mode else f"one process's gradient on all {eq.world_size} batches")
        return [Finding("ddp-equivalence", Severity.INFO,
                        f"DDP's averaged gradient equals {what} (largest relative error {worst:.2g}, parameter {worst_name})",
                        evidence=evidence)]
    per_rank = {k: float(v) for k, v in (eq.relative_error_per_rank_batches or {}).items() if v is not None}
    if per_rank:
        worst_rank_name = max(per_rank, key=lambda k: per_rank[k])
        evidence["max_relative_error_per_rank_batches"] = _fmt(per_rank[worst_rank_name])
        if per_rank[worst_rank_name] <= EQUIVALENCE_RTOL:
            return [Finding("ddp-equivalence", Severity.INFO,
                            f"DDP's averaged gradient equals one process's gradient over each rank's batch "
                            f"(largest relative error {per_rank[worst_rank_name]:.2g}); on the union batch it differs "
                            f"by {worst:.2g}, as BatchNorm's per-rank statistics imply", evidence=evidence,
                            advice="Expected with BatchNorm: each rank normalises with its own batch statistics. "
                                   "SyncBatchNorm normalises over the whole global batch.")]
        worst, worst_name = per_rank[worst_rank_name], worst_rank_name
    elif caveats:
        return [Finding("ddp-equivalence", Severity.INFO,
                        f"DDP's gradient differs from the single-process one (relative {worst:.2g}) as expected with "
                        + " and ".join(caveats), evidence=evidence,
                        advice="BatchNorm normalises each rank's batch with its own statistics and dropout draws other "
                               "masks, so the identity does not hold exactly; use SyncBatchNorm for batch statistics "
                               "over the whole global batch.")]
    return [Finding("ddp-equivalence", Severity.ERROR,
                    f"DDP's averaged gradient differs from one process's gradient on all batches: relative error "
                    f"{worst:.2g} on {worst_name}", ranks=[0], evidence=evidence,
                    advice="DDP promises the gradient of the whole global batch. A difference means a communication "
                           "hook, gradient manipulation between backward and step, or a model whose output for a "
                           "sample depends on other samples in the batch.")]
