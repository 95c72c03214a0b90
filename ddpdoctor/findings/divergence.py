"""``divergence``: ranks whose per-step fingerprints differ (probes/divergence.py, job/divergence.py): the step, the
rank(s) that differ from the rest, and what differs (docs/findings.md#hangs-divergence)."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.model import Finding, Severity

ADVICE = {
    "loss": "A NaN/inf loss on one rank is all-reduced into every replica: find why that rank's batch or state "
            "differs (its data, a division by a zero count, an overflow); stop on it with `--on-divergence stop`.",
    "dry": "One rank's training DataLoader ran out first: its shard or loader is shorter. Give every rank as many "
           "batches (DistributedSampler, drop_last=True), or let the ranks that run out join the others "
           "(torch.distributed.algorithms.Join).",
    "epoch": "The ranks read different epochs of their training DataLoader: a shorter shard restarted first, or an "
             "epoch counter kept per rank; give every rank as many batches and drive epochs by one shared count.",
    "opt": "One rank took a different number of optimizer steps: a rank-local decision (a NaN check, a loss "
           "threshold, a scaler) must be made on all-reduced values, so every rank decides the same.",
    "colls": "One rank issued a different number of collectives in this step: a rank-local `continue`, a skipped "
             "optimizer step or a branch on rank-local data; make the decision on all-reduced values.",
    "ops": "The ranks' torch.distributed calls differ (op, sizes, dtype or reduce op): a branch on rank-local data "
           "or shapes; make every rank call the same collectives in the same order.",
    "gnorm": "One rank's gradient norm went NaN/inf while the others' stayed finite: a gradient that is not averaged "
             "(a parameter outside DDP, a norm taken before an all-reduce) overflowed or met a NaN there; check that rank's batch and "
             "its mixed-precision scaling, and stop on it with `--on-divergence stop`.",
    "grads": "The ranks build gradients for different parameters: a layer frozen or unfrozen (requires_grad) on some "
             "ranks only, e.g. a freeze schedule keyed on rank-local state; change requires_grad on every rank at the "
             "same step (DDP then also needs the same buckets: freeze before wrapping, or find_unused_parameters).",
    "graphs": "torch.compile recompiled on some ranks only: mark the dynamic dimension (torch._dynamo.mark_dynamic), "
              "pad shapes equally on every rank, and read TORCH_LOGS=recompiles for the guard that failed.",
}


def divergence_findings(doc: Any) -> list[Finding]:
    """``doc``: RUN/divergence.json as the monitor wrote it (job/divergence.py)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("step"), int):
        return []
    items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
    first = str(items[0].get("field")) if items else ""
    ranks = [r for r in doc.get("ranks") or [] if isinstance(r, int)]
    stopped = " (the job was stopped: --on-divergence stop)" if doc.get("on_divergence") == "stop" else ""
    return [Finding(
        "divergence", Severity.ERROR, f"Ranks diverged at step {doc['step']}: {doc.get('reason')}{stopped}",
        ranks=ranks,
        evidence={"step": doc["step"], "ranks": ranks, "ranks_count": doc.get("ranks_count"),
                  "others_count": doc.get("others_count"), "items": items, "job": doc.get("job"),
                  "on_divergence": doc.get("on_divergence")},
        advice=ADVICE.get(first, ADVICE["colls"]))]
