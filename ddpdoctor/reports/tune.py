"""`tune`'s report: the measured variants (the `variants` section, docs/json.md), the plan with the reason
for each variant chosen or skipped, the experiment's design, and the findings."""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.analyses.intervals import Interval
from ddpdoctor.analyses.tune import (
    Preparation,
    Setting,
    Trial,
    TuneResult,
    VariantResult,
    compare,
    gpu_hours_per_day,
)
from ddpdoctor.findings.model import Finding
from ddpdoctor.findings.tune import Plan, code_line, tune_findings
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import TuneSection
from ddpdoctor.rundir.schema import DDPModule


@dataclass(frozen=True)
class TuneDesign:
    """The experiment as the command set it up (with the launches and their order: the "design" object of
    docs/json.md's `tune`)."""

    warmup: int
    steps: int
    rounds: int
    profile_run: str
    trials_dir: str

    def to_json(self, launches: int, order: list[str]) -> JsonObject:
        return {"warmup": self.warmup, "steps": self.steps, "rounds": self.rounds, "profile_run": self.profile_run,
                "trials_dir": self.trials_dir, "launches": launches, "order": order}


@dataclass(frozen=True)
class ScriptHashes:
    """The script's hash before and after the trials (the "script" object: nothing changed the user's file)."""

    path: str
    sha256_before: str | None
    sha256_after: str | None

    @property
    def unchanged(self) -> bool:
        return self.sha256_before is not None and self.sha256_before == self.sha256_after

    def to_json(self) -> JsonObject:
        return {"path": self.path, "sha256_before": self.sha256_before, "sha256_after": self.sha256_after,
                "unchanged": self.unchanged}


def _iv(iv: Interval | None) -> list[float] | None:
    return None if iv is None else [round(iv.lo, 3), round(iv.hi, 3)]


def _val(iv: Interval | None) -> float | None:
    return None if iv is None else round(iv.value, 3)


def variant_json(v: VariantResult, base: VariantResult, predicted_ms: float | None, setting: Setting,
                 gpus_total: int | None, expected_buckets: float | None = None,
                 cfg: DDPModule | None = None) -> JsonObject:
    """One row of ``variants`` (docs/json.md): ms throughout, intervals [lo, hi] at 90%."""
    gph: JsonObject | None = None
    if gpus_total and v.diff is not None and base.step is not None and base.step.value > 0:
        gph = {"value": round(gpu_hours_per_day(v.diff.value, base.step.value, gpus_total), 2),
               "interval": sorted(round(gpu_hours_per_day(x, base.step.value, gpus_total), 2)
                                  for x in (v.diff.lo, v.diff.hi)),
               "gpus_total": gpus_total}
    return {
        "setting": v.label,
        "options": setting,
        "step_ms": _val(v.step),
        "interval": _iv(v.step),
        "n": v.step.n if v.step else 0,
        "baseline": {"step_ms": _val(base.step), "interval": _iv(base.step)},
        "diff_ms": _val(v.diff),
        "diff_interval": _iv(v.diff),
        "predicted_ms": predicted_ms,
        "winner": v.winner,
        "verdict": v.verdict,
        "why": v.why,
        "launches": v.launches,
        "launch_medians_ms": [round(x, 3) for x in v.launch_medians],
        "in_effect": v.in_effect,
        "effect": v.effect,
        "buckets": v.buckets,
        "baseline_buckets": base.buckets,
        "expected_buckets": expected_buckets,
        "numerics": v.numerics.to_json() if v.numerics else None,
        "change": code_line(setting, cfg),
        "gpu_hours_per_day": gph,
    }


def assemble(trials: list[Trial], plan: Plan, prep: Preparation, design: TuneDesign, script: ScriptHashes,
             tolerance: float, gpus_total: int | None = None) -> Report:
    """The tune report from the trials as read back (commands/tune_trials.py), the plan and the profiled launch's
    preparation: the comparison (analyses/tune.py), its findings (findings/tune.py), the sections and notes."""
    result = compare(trials, tolerance)
    findings = tune_findings(result, plan.candidates, gpus_total, prep.cfg)
    return _report(result, plan, prep, findings, design, script, trials, gpus_total)


def _fsdp_options(prep: Preparation) -> JsonObject:
    """The script's own FSDP2 settings (rank 0's units but the root): prefetch depths, reshard_after_forward."""
    inner = [u for u in prep.fsdp_units if not u.is_root]
    return {"units": len(inner),
            "forward_prefetch": max((len(u.forward_prefetch) for u in inner), default=0),
            "backward_prefetch": max((len(u.backward_prefetch) for u in inner), default=0),
            "reshard_after_forward": sorted({str(u.reshard_after_forward) for u in inner})}


def _report(result: TuneResult, plan: Plan, prep: Preparation, findings: list[Finding], design: TuneDesign,
            script: ScriptHashes, trials: list[Trial], gpus_total: int | None) -> Report:
    by_label = {c.label: c for c in plan.candidates}
    base = result.baseline
    variants = []
    for v in result.variants:
        cand = by_label.get(v.label)
        variants.append(variant_json(v, base, cand.predicted_ms if cand else None, cand.setting if cand else {},
                                     gpus_total, cand.expected_buckets if cand else None, prep.cfg))
    cfg = prep.cfg or DDPModule()
    w = prep.whatif
    section: JsonObject = {
        "baseline": {"setting": "baseline", "step_ms": _val(base.step), "interval": _iv(base.step),
                     "n": base.step.n if base.step else 0, "launch_medians_ms": [round(x, 3) for x in base.launch_medians],
                     "launch_spread_ms": None if result.launch_spread_ms is None else round(result.launch_spread_ms, 3),
                     "effect": base.effect,
                     "options": _fsdp_options(prep) if getattr(prep, "fsdp_units", None) else
                     {"bucket_cap_mb": cfg.bucket_cap_mb, "gradient_as_bucket_view": cfg.gradient_as_bucket_view,
                      "static_graph": cfg.static_graph, "find_unused_parameters": cfg.find_unused_parameters}},
        "candidates": [c.to_json() for c in plan.candidates],
        "design": design.to_json(len(trials), result.order),
        "whatif": {"available": w.available, "reason": w.reason, "current_bucket_cap_mb": w.current_bucket_cap_mb,
                   "best_bucket_cap_mb": w.best_bucket_cap_mb,
                   "saving_ms_per_step": None if w.saving_us_per_step is None else round(w.saving_us_per_step / 1000, 3)},
        "script": script.to_json(),
    }
    notes = [f"{len(trials)} trial launches of {design.warmup} + {design.steps} iterations "
             f"({design.rounds} round(s), each variant between two baseline launches: {' '.join(result.order)}); "
             f"the first {design.warmup} iterations of each are left out; figures are medians with 90% "
             "intervals (docs/tune.md)"]
    if script.unchanged:
        notes.append(f"the script was not changed (sha256 {str(script.sha256_before)[:12]} before and after)")
    steps = design.steps
    short = sorted({len(t.step_ms) for t in trials if len(t.step_ms) < steps})
    if short:
        notes.append(f"some launches measured only {', '.join(map(str, short))} of the {steps} iterations asked: the "
                     f"script ended before --warmup + --steps = {design.warmup + steps} iterations")
    return Report("tune", parts=[TuneSection.from_json({"variants": variants, "tune": section})], findings=findings,
                  notes=notes)
