"""What turns performance rules into verdicts a user can trust: the cost of each finding per step, intervals that
must clear their thresholds ("not measurable from N steps" otherwise), one advice per root cause, and the marking of
findings that come from a run that did not finish (docs/findings.md, "Severity and intervals")."""

from __future__ import annotations

import dataclasses
import re

from ddpdoctor.analyses.intervals import Interval, suggested_active
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.schema import Manifest

NOT_MEASURABLE = "not-measurable"
# Findings that are all consequences of one root cause: gradient communication that backward does not hide. The
# first present in this order carries the advice; the others point to it.
COMM_GROUP = ("exposed-comm-high", "comm-tail-after-backward", "first-bucket-late", "buckets-latency-bound",
              "bucket-cap-whatif")
# Every id the performance rules raise (docs/findings.md, area "perf").
PERF_IDS = (*COMM_GROUP, "sync-in-backward", "find-unused-parameters-unneeded", "static-graph-would-help",
            "find-unused-parameters-on", "gradient-as-bucket-view-off", "straggler-rank", "step-time-variance",
            "step-time-rank-skew", "data-loading-wait", "rank-no-communication", NOT_MEASURABLE, "no-profiler-steps")
def cost(cost_us_per_step: float | None, step_us: float | None) -> dict[str, float | None]:
    """The evidence fields every performance finding carries: what it costs per step, in ms and in % of the step."""
    if cost_us_per_step is None:
        return {"cost_ms_per_step": None, "cost_pct_of_step": None}
    pct = None if not step_us else round(min(100.0, 100.0 * cost_us_per_step / step_us), 1)
    return {"cost_ms_per_step": round(cost_us_per_step / 1000.0, 3), "cost_pct_of_step": pct}


def step_samples(a: Analysis) -> int:
    """Recorded steps per rank (the most any rank has): what a verdict rests on."""
    return max((len(r.per_step) for r in a.ranks), default=0)


def undecided(rule_id: str, what: str, iv: Interval, threshold: float, a: Analysis, unit: str = "%") -> Finding:
    """A placeholder the rules return when a figure is over its threshold but its interval is not; merged into one
    ``not-measurable`` finding by ``merge_undecided``."""
    steps = step_samples(a)
    return Finding(NOT_MEASURABLE, Severity.INFO, what, evidence={
        "rule": rule_id, "figure": iv.to_json(), "threshold": threshold, "unit": unit, "steps": steps,
        "suggested_active": suggested_active(iv, threshold, steps)})


def merge_undecided(findings: list[Finding], a: Analysis) -> list[Finding]:
    """All undecided placeholders as one info finding: which rules could not decide, and how many steps would."""
    parts = [f for f in findings if f.id == NOT_MEASURABLE]
    rest = [f for f in findings if f.id != NOT_MEASURABLE]
    if not parts:
        return rest
    steps = step_samples(a)
    k = max(int(f.evidence.get("suggested_active") or 0) for f in parts)
    rules = {str(f.evidence["rule"]): {key: f.evidence[key] for key in ("figure", "threshold", "unit")} | {
        "what": f.title} for f in parts}
    return [*rest, Finding(
        NOT_MEASURABLE, Severity.INFO,
        f"Not measurable from {steps} step(s): {', '.join(rules)} (over the threshold, but not across the "
        "interval of the recorded steps)",
        ranks=sorted({r.rank for r in a.ranks}),
        evidence={"steps": steps, "rules": rules},
        advice=f"Record more steps to decide: `ddpdoctor profile --active {k} ...`.",
    )]


def _advice_key(advice: str) -> str:
    """Two advices are the same when they recommend the same bucket_cap_mb (in DDP's or a framework's spelling:
    `DDP(model, bucket_cap_mb=5)`, `TrainingArguments(ddp_bucket_cap_mb=5)`, `DDPStrategy(bucket_cap_mb=5)`), or say
    the same words."""
    m = re.search(r"bucket_cap_mb=([0-9.]+)\)", advice)
    return f"cap={m.group(1)}" if m else advice


def group_root_causes(findings: list[Finding]) -> list[Finding]:
    """Findings of one root cause (communication not hidden) say an advice once: the first of the group that gives
    it keeps it, the others name that finding instead."""
    present = [f for f in findings if f.id in COMM_GROUP]
    if len(present) < 2:
        return findings
    lead = min(present, key=lambda f: COMM_GROUP.index(f.id))
    said: dict[str, str] = {}
    for f in sorted(present, key=lambda f: COMM_GROUP.index(f.id)):
        if f.advice:
            said.setdefault(_advice_key(f.advice), f.id)
    out = []
    for f in findings:
        if f.id not in COMM_GROUP:
            out.append(f)
            continue
        ev = {**f.evidence, "related": [g.id for g in present if g is not f]} if f is lead else \
            {**f.evidence, "root_cause": lead.id}
        owner = said.get(_advice_key(f.advice)) if f.advice else None
        advice = f.advice if owner in (None, f.id) else f"See {owner}."
        out.append(dataclasses.replace(f, advice=advice, evidence=ev))
    return out


def mark_incomplete(findings: list[Finding], outcome: str) -> list[Finding]:
    """Performance findings of a run that crashed, hung or was stopped describe the steps before that: say so, and
    make them info, so that the failure leads the report."""
    out = []
    for f in findings:
        if f.id not in PERF_IDS:
            out.append(f)
            continue
        out.append(dataclasses.replace(
            f, severity=Severity.INFO, title=f"{f.title} (from an incomplete run: {outcome})",
            evidence={**f.evidence, "incomplete_run": outcome}))
    return out


def failure_outcome(findings: list[Finding], run_status: str | None = None) -> str | None:
    """"crashed", "hung", "interrupted", "stopped" when the job did not finish as it should, else None."""
    if run_status in ("interrupted", "stopped"):
        return run_status
    by_id = {f.id: f for f in findings}
    stop = by_id.get("job-stopped") or by_id.get("job-interrupted")
    if stop is not None:
        # h13's job-stopped names the signal: SIGINT is the user's Ctrl-C.
        return "interrupted" if stop.id == "job-interrupted" or stop.evidence.get("signal") == "SIGINT" else "stopped"
    if "hang" in by_id:
        return "hung"
    if set(by_id) & {"rank-crashed", "collective-mismatch", "rank-no-status", "run-unfinished"}:
        return "crashed"
    return None


def apply_outcome(findings: list[Finding], run_status: str | None = None) -> list[Finding]:
    """Failure first: a crashed, hung, interrupted or stopped run marks its performance findings as incomplete."""
    outcome = failure_outcome(findings, run_status)
    return mark_incomplete(findings, outcome) if outcome else findings


def run_status_of(manifest: Manifest | None) -> str | None:
    """How the launch says the run ended when ddpdoctor itself was stopped: "interrupted" (SIGINT) or "stopped"
    (manifest ``ended`` how "signal", written by the launcher)."""
    ended = manifest.ended if manifest else None
    if ended is not None and ended.how == "signal":
        return "interrupted" if ended.signal == "SIGINT" else "stopped"
    return None
