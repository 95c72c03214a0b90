"""Rules of `ddpdoctor diff` (docs/findings.md, area "diff"): a slower step is a warning with its cost per step, a
faster one info, a change of DDP's bucket layout info; changes inside the noise floor are no finding."""

from __future__ import annotations

from ddpdoctor.analyses.diff import Contributor, RunDiff
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_verdict import cost

DIFF_IDS = ("diff-step-slower", "diff-step-faster", "diff-not-measurable", "diff-bucket-layout")
# Contributors a finding names (the terminal shows the same few).
TOP = 5

LABEL = {"compute": "compute", "exposed_comm": "exposed communication", "data_wait": "data wait", "idle": "idle",
         "data": "data loading", "forward": "forward", "backward": "backward", "optimizer": "optimizer and tail",
         "comm_wait": "waiting for a peer", "comm_transfer": "transfer"}


def phrase(c: Contributor) -> str:
    """"data wait on rank 1 +20.1 ms" (ranks shown as a count beyond four)."""
    ranks = c.ranks
    where = f"rank {ranks[0]}" if len(ranks) == 1 else \
        f"ranks {','.join(map(str, ranks))}" if len(ranks) <= 4 else f"{len(ranks)} ranks (most on {c.rank})"
    wait = f" (waiting for rank {','.join(map(str, c.waiting_for))})" if c.waiting_for else ""
    return f"{LABEL.get(c.component, c.component)} on {where} {c.delta.change.value / 1e3:+.1f} ms{wait}"


def related_changes(d: RunDiff, contributors: list[Contributor]) -> list[dict[str, object]]:
    """The recorded differences that could plausibly move the contributors' parts (named, not blamed)."""
    comps = {c.component for c in contributors}
    return [{"key": ch.key, "base": ch.base, "new": ch.new} for ch in d.changes if comps & set(ch.explains)]


def diff_findings(d: RunDiff) -> list[Finding]:
    out: list[Finding] = []
    step, iv = d.step, d.step.change
    top = d.contributors[:TOP]
    evidence = {
        "delta_ms": iv.to_json(scale=1e-3, digits=3), "base_step_ms": round(step.base_us / 1e3, 3),
        "new_step_ms": round(step.new_us / 1e3, 3), "min_effect_ms": round(d.min_effect_us / 1e3, 3),
        "steps": {"base": d.base_steps, "new": d.new_steps},
        "contributors": [c.to_json() for c in top], "related_changes": related_changes(d, top),
        "operators": [o.to_json() for o in d.operators[:3]],
    }
    ranks = sorted({r for c in top for r in c.ranks})
    because = f": {'; '.join(phrase(c) for c in top[:3])}" if top else ""
    if step.significant and iv.value > 0:
        out.append(Finding(
            "diff-step-slower", Severity.WARNING,
            f"Step time {iv.value / 1e3:+.1f} ms ({step.pct_of_step:+.1f}%) against {d.base}{because}",
            ranks=ranks, evidence={**cost(iv.value, step.base_us), "cost_pct_of_step": step.pct_of_step, **evidence},
            advice="Look at the contributors first, then at what else changed between the runs "
            "(`ddpdoctor diff BASE NEW -v`); a change listed there is a lead, not a proof."))
    elif step.significant:
        out.append(Finding(
            "diff-step-faster", Severity.INFO,
            f"Step time {iv.value / 1e3:+.1f} ms ({step.pct_of_step:+.1f}%) against {d.base}{because}",
            ranks=ranks, evidence={**cost(iv.value, step.base_us), "cost_pct_of_step": step.pct_of_step,
                                   **evidence}))
    elif abs(iv.value) >= d.min_effect_us:
        # Over the size floor but not a change: the interval reaches 0, or the runs' own step-to-step spread is as
        # large (the host's load between two runs moves a whole run's steps together).
        why = "its interval includes no change" if iv.lo <= 0 <= iv.hi else \
            f"within the runs' own spread (a change counts from {step.min_effect_us / 1e3:.2f} ms)"
        out.append(Finding(
            "diff-not-measurable", Severity.INFO,
            f"Step time {iv.value / 1e3:+.1f} ms against {d.base}, but {why}",
            evidence={**evidence, "min_effect_ms": round(step.min_effect_us / 1e3, 3)},
            advice="Profile both on an otherwise idle host, or record more steps on both sides "
            "(`ddpdoctor profile --active 20 ...`)."))
    b = d.buckets
    if b is not None and b.layout_changed:
        out.append(Finding(
            "diff-bucket-layout", Severity.INFO,
            f"DDP's bucket layout changed: {len(b.base_layout_bytes) or len(b.rows)} bucket(s) "
            f"-> {len(b.new_layout_bytes) or len(b.rows)} (bucket_cap_mb {b.base_cap_mb} -> {b.new_cap_mb})",
            evidence={"bucket_cap_mb": {"base": b.base_cap_mb, "new": b.new_cap_mb},
                      "layout_bytes": {"base": b.base_layout_bytes, "new": b.new_layout_bytes}}))
    return out
