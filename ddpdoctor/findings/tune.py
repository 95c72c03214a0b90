"""`ddpdoctor tune`'s rules: which variants of DDP's options are worth measuring for this model (and why the others
are not), and the findings of the measured comparison (docs/tune.md, docs/findings.md area "tune")."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.analyses.bucket_replay import MIB
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.tune import (
    BASELINE,
    FSDP_OPTIONS,
    OPTIONS,
    Setting,
    TuneResult,
    VariantResult,
    gpu_hours_per_day,
)
from ddpdoctor.analyses.whatif import WhatIf
from ddpdoctor.findings.framework_advice import comm_hook, ddp_option, framework_of
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DDPModule, FSDPUnit

# Exposed communication below this share of a step leaves a compression hook little to win: it halves the bytes
# but adds two casts per bucket.
COMM_HOOK_MIN_SHARE = 0.05
# A measured gain of at least this share of the step (its whole interval) is a warning: the job pays it every step.
WARNING_SHARE = 0.05
MAX_VARIANTS = 4
HOOK_LINE = {
    "fp16": "model.register_comm_hook(None, default_hooks.fp16_compress_hook)",
    "bf16": "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
}
HOOK_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"


@dataclass
class Candidate:
    """One variant considered: a single change of DDP's options (or a --try), chosen to be measured or skipped."""

    setting: Setting
    source: str  # "what-if", "rule" or "--try"
    chosen: bool
    why: str
    predicted_ms: float | None = None  # predicted change of the step (exposed communication), ms; None: no model
    expected_buckets: float | None = None
    option: str = ""  # what was considered, when no setting can be named (the what-if did not run)

    @property
    def label(self) -> str:
        return label_of(self.setting) if self.setting else self.option

    def to_json(self) -> JsonObject:
        return {"setting": self.label, "options": dict(self.setting), "source": self.source, "chosen": self.chosen,
                "why": self.why, "predicted_ms": self.predicted_ms}


@dataclass
class Plan:
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def chosen(self) -> list[Candidate]:
        return [c for c in self.candidates if c.chosen]


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def label_of(setting: Setting) -> str:
    return ",".join(f"{k}={_fmt(v)}" for k, v in setting.items()) or BASELINE


def code_line(setting: Setting, cfg: DDPModule | None = None) -> str:
    """The exact change to make in the script; in the framework's own terms when a framework built the DDP module
    (``cfg``: the DDP description, whose ``built_by`` names it)."""
    if any(k in FSDP_OPTIONS for k in setting):
        return fsdp_code_line(setting)
    hook = setting.get("comm_hook")
    if framework_of(cfg):
        parts = [ddp_option(cfg, k, v) for k, v in setting.items() if k in OPTIONS]
        return " and ".join(parts + ([comm_hook(cfg, str(hook))] if hook else []))
    opts = ", ".join(f"{k}={_fmt(v)}" for k, v in setting.items() if k in OPTIONS)
    parts = [f"`DDP(model, {opts})`"] if opts else []
    if hook:
        parts.append(f"`{HOOK_IMPORT}` and, after building DDP, `{HOOK_LINE.get(str(hook), hook)}`")
    return " and ".join(parts)


def parse_try(text: str) -> list[Setting]:
    """``--try 'bucket_cap_mb=50,100'``: one variant per value; ``--try gradient_as_bucket_view=True``;
    ``--try comm_hook=fp16``. Raises ValueError naming what is wrong."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not values.strip():
        raise ValueError(f"--try {text!r}: expected OPTION=VALUE[,VALUE...]")
    out: list[Setting] = []
    for raw in values.split(","):
        v = raw.strip()
        if key == "comm_hook":
            from ddpdoctor.analyses.tune import COMM_HOOKS

            if v not in COMM_HOOKS:
                raise ValueError(f"--try {text!r}: comm_hook is one of {', '.join(COMM_HOOKS)}")
            out.append({"comm_hook": v})
        elif key in ("forward_prefetch", "backward_prefetch"):
            lowest = 0 if key == "forward_prefetch" else 1
            if not v.isdigit() or not lowest <= int(v) <= 16:
                raise ValueError(f"--try {text!r}: {key} is a number of units from {lowest} to 16")
            out.append({key: int(v)})
        elif key == "reshard_after_forward":
            if v.lower() not in ("true", "false"):
                raise ValueError(f"--try {text!r}: {key} is True or False")
            out.append({key: v.lower() == "true"})
        elif key not in OPTIONS:
            raise ValueError(f"--try {text!r}: unknown option {key!r} (one of "
                             f"{', '.join([*OPTIONS, 'comm_hook', *FSDP_OPTIONS])})")
        elif OPTIONS[key] is bool:
            if v.lower() not in ("true", "false"):
                raise ValueError(f"--try {text!r}: {key} is True or False")
            out.append({key: v.lower() == "true"})
        else:
            try:
                cap = float(v)
            except ValueError:
                raise ValueError(f"--try {text!r}: {key} is a number of MB") from None
            if not 0 < cap <= 10_000:
                raise ValueError(f"--try {text!r}: {key} must be in (0, 10000]")
            out.append({key: cap})
    return out


def fsdp_code_line(setting: Setting) -> str:
    """The change that gives an FSDP2 setting, on the script's units in forward order (``units``: the modules it
    called fully_shard on, the root left out)."""
    parts = []
    n = setting.get("forward_prefetch")
    if n is not None:
        parts.append("after fully_shard, `for i, u in enumerate(units): "
                     f"u.set_modules_to_forward_prefetch(units[i + 1:i + 1 + {_fmt(n)}])`" if n else
                     "no `set_modules_to_forward_prefetch` call (FSDP2's default)")
    n = setting.get("backward_prefetch")
    if n is not None:
        parts.append("after fully_shard, `for i, u in enumerate(units): "
                     f"u.set_modules_to_backward_prefetch(units[max(0, i - {_fmt(n)}):i][::-1])`")
    if "reshard_after_forward" in setting:
        parts.append(f"`fully_shard(unit, reshard_after_forward={setting['reshard_after_forward']})` on each unit "
                     "but the root")
    return " and ".join(parts)


def fsdp_plan(units: list[FSDPUnit], tries: list[Setting], max_variants: int = MAX_VARIANTS) -> Plan:
    """FSDP2's variants: the user's --try first, then forward prefetch one unit deep when no unit prefetches, and
    reshard_after_forward=False when the units reshard (each skipped one says why). ``units``: rank 0's record."""
    inner = [u for u in units if not u.is_root]
    out = [Candidate(dict(t), "--try", True, "asked with --try") for t in tries]
    if len(inner) < 2:
        out.append(Candidate({"forward_prefetch": 1}, "rule", False,
                             f"{len(inner)} unit(s) besides the root: no next unit to prefetch"))
    elif not any(u.forward_prefetch for u in inner):
        out.append(Candidate({"forward_prefetch": 1}, "rule", True,
                             f"none of the {len(inner)} units prefetches in forward: each unit's all-gather starts "
                             "when its forward needs it (fsdp-no-prefetch)"))
    else:
        deepest = max(len(u.forward_prefetch) for u in inner)
        out.append(Candidate({"forward_prefetch": deepest + 1}, "rule", False,
                             f"the units prefetch {deepest} unit(s) ahead already; measure a deeper one with "
                             f"--try forward_prefetch={deepest + 1}"))
    resharding = [u for u in inner if u.reshard_after_forward is True]
    if resharding:
        mib = sum(u.bytes - u.sharded_bytes for u in resharding) / MIB
        out.append(Candidate({"reshard_after_forward": False}, "rule", True,
                             f"{len(resharding)} unit(s) free their parameters after forward and all-gather them "
                             f"again in backward; keeping them costs {mib:.1f} MiB more per rank"))
    else:
        out.append(Candidate({"reshard_after_forward": False}, "rule", False,
                             "no unit reshards after forward (reshard_after_forward is off already)"))
    return _capped(out, max_variants)


def _capped(out: list[Candidate], max_variants: int) -> Plan:
    """One plan's choices, each label measured once and at most ``max_variants`` of them (DDP's and FSDP2's)."""
    seen: set[str] = set()
    n = 0
    for c in out:
        if c.chosen and c.label in seen:
            c.chosen, c.why = False, "already measured (asked twice)"
        elif c.chosen and n >= max_variants:
            c.chosen, c.why = False, f"over --max-variants {max_variants} ({c.why})"
        elif c.chosen:
            n += 1
        seen.add(c.label)
    return Plan(out)


def gradients_per_step(a: Analysis) -> list[int]:
    """The distinct numbers of parameters that got a gradient in a recorded step (one number: a static graph)."""
    per_step: dict[tuple[int, int], int] = defaultdict(int)
    for g in a.grad_ready:
        if g.step is not None:
            per_step[(g.rank, g.step)] += 1
    return sorted(set(per_step.values()))


def plan(cfg: DDPModule | None, whatif: WhatIf | None, flag_ids: set[str], grad_counts: list[int],
         tries: list[Setting], max_variants: int = MAX_VARIANTS) -> Plan:
    """The variants to measure: the user's --try first, then what the what-if and the rules say can matter for
    this model; each skipped one says why."""
    cfg = cfg or DDPModule()
    out: list[Candidate] = []
    preds = {p.bucket_cap_mb: p for p in (whatif.predictions if whatif and whatif.available else [])}
    current_us = whatif.current_predicted_exposed_us if whatif and whatif.available else None

    def predicted(cap: float) -> tuple[float | None, float | None]:
        p = preds.get(float(cap))
        if p is None or current_us is None:
            return None, None
        return round((p.exposed_comm_us - current_us) / 1000.0, 3), p.buckets_per_step

    for t in tries:
        same = all(getattr(cfg, k) == v for k, v in t.items() if k in OPTIONS) and "comm_hook" not in t
        why = "asked with --try" + (" (the script's own setting: an A/A check of the noise)" if same else "")
        pred, nb = predicted(float(t["bucket_cap_mb"])) if "bucket_cap_mb" in t else (None, None)
        out.append(Candidate(dict(t), "--try", True, why, pred, nb))
    out.extend(_rule_candidates(cfg, whatif, flag_ids, grad_counts, predicted))
    return _capped(out, max_variants)


def _rule_candidates(cfg: DDPModule, whatif: WhatIf | None, flag_ids: set[str], grad_counts: list[int],
                     predicted: Any) -> list[Candidate]:
    out: list[Candidate] = []
    if whatif is None or not whatif.available:
        out.append(Candidate({}, "what-if", False,
                             f"the what-if could not run ({whatif.reason if whatif else 'no trace'})",
                             option="bucket_cap_mb"))
    elif whatif.best_bucket_cap_mb is None or whatif.best_bucket_cap_mb == whatif.current_bucket_cap_mb:
        out.append(Candidate({"bucket_cap_mb": float(whatif.current_bucket_cap_mb or 25)}, "what-if", False,
                             "the what-if predicts no other cap hides more communication than the current layout "
                             "(ties within 1% of a step keep it)"))
    else:
        cap = float(whatif.best_bucket_cap_mb)
        pred, nb = predicted(cap)
        if nb is not None and nb == whatif.current_buckets_per_step:
            out.append(Candidate({"bucket_cap_mb": cap}, "what-if", False,
                                 f"same layout as now ({_fmt(nb)} bucket(s) per step): nothing would change"))
        else:
            out.append(Candidate({"bucket_cap_mb": cap}, "what-if", True,
                                 f"the what-if's best cap: {_fmt(whatif.current_buckets_per_step)} -> {_fmt(nb)} "
                                 "bucket(s) per step", pred, nb))
    if cfg.find_unused_parameters:
        if "find-unused-parameters-unneeded" in flag_ids:
            out.append(Candidate({"find_unused_parameters": False}, "rule", True,
                                 "find_unused_parameters is on, but every parameter got a gradient in every step"))
        elif "static-graph-would-help" in flag_ids:
            out.append(Candidate({"static_graph": True}, "rule", True,
                                 "the same parameters get gradients every step: the graph looks static"))
        else:
            out.append(Candidate({"find_unused_parameters": False}, "rule", False,
                                 "find_unused_parameters is on and some parameters get no gradient (or the trace "
                                 "cannot tell): turning it off would make DDP wait for them"))
    elif cfg.static_graph:
        out.append(Candidate({"static_graph": True}, "rule", False, "static_graph is on already"))
    elif len(grad_counts) == 1:
        out.append(Candidate({"static_graph": True}, "rule", True,
                             f"the same {grad_counts[0]} parameters get gradients in every recorded step: a static "
                             "graph lets DDP skip its per-iteration bookkeeping"))
    else:
        out.append(Candidate({"static_graph": True}, "rule", False,
                             "the trace cannot show the graph is static (gradient counts per step: "
                             f"{grad_counts or 'none recorded'})"))
    if cfg.gradient_as_bucket_view is False:
        nbytes = int(cfg.parameter_bytes or 0)
        out.append(Candidate({"gradient_as_bucket_view": True}, "rule", True,
                             f"gradients are copied out of the buckets every step ({nbytes / MIB:.1f} MiB); views "
                             "skip the copy"))
    else:
        out.append(Candidate({"gradient_as_bucket_view": True}, "rule", False, "gradient_as_bucket_view is on already"))
    share = None
    if whatif is not None and whatif.available and whatif.measured_exposed_us is not None and whatif.step_time_us:
        share = whatif.measured_exposed_us / whatif.step_time_us
    hook = "fp16"  # bf16_compress_hook needs NCCL 2.10+ (torch refuses it on gloo)
    if share is None:
        out.append(Candidate({"comm_hook": hook}, "rule", False, "exposed communication was not measured"))
    elif share < COMM_HOOK_MIN_SHARE:
        out.append(Candidate({"comm_hook": hook}, "rule", False,
                             f"exposed communication is {100 * share:.1f}% of a step (< {100 * COMM_HOOK_MIN_SHARE:.0f}%)"
                             ": little for compression to win"))
    else:
        out.append(Candidate({"comm_hook": hook}, "rule", True,
                             f"exposed communication is {100 * share:.1f}% of a step: fp16 compression halves the "
                             "bytes sent (and changes numerics: measured below)"))
    return out


def _ms(x: float) -> str:
    return f"{x:+.3f}"


def measured_text(v: VariantResult) -> str:
    if v.diff is None:
        return "not measured"
    return f"measured {_ms(v.diff.value)} ± {v.diff.half_width:.3f} ms"


def tune_findings(result: TuneResult, candidates: list[Candidate], gpus_total: int | None = None,
                  cfg: DDPModule | None = None) -> list[Finding]:
    """The comparison as findings: the fastest winner (with the line to change), variants that change the loss,
    settings that did not take effect, or no winner inside the noise."""
    by_label = {c.label: c for c in candidates}
    out: list[Finding] = []
    base = result.baseline
    base_ms = base.step.value if base.step else None
    if base.failed:
        out.append(Finding("tune-trial-failed", Severity.ERROR,
                           f"The script's own settings failed in {len(base.failed)} of {base.launches} trial "
                           f"launch(es) (exit {', '.join(map(str, base.failed))}): no variant can be compared",
                           evidence={"setting": BASELINE, "exit_codes": base.failed},
                           advice="See each trial's logs under RUN/trials/ (ranks/rankR/, torchrun/)."))
    for v in result.variants:
        if v.failed:
            out.append(Finding("tune-trial-failed", Severity.WARNING,
                               f"{v.label}: {len(v.failed)} of {v.launches} launch(es) failed "
                               f"(exit {', '.join(map(str, v.failed))})",
                               evidence={"setting": v.label, "exit_codes": v.failed},
                               advice="See the launch's logs under RUN/trials/; the variant is not measured."))
        if v.verdict == "not applied":
            out.append(Finding("tune-not-applied", Severity.WARNING, f"{v.label}: {v.why}",
                               evidence={"setting": v.label, "seen": v.effect},
                               advice="Check that the script builds one DistributedDataParallel and the backend "
                               "supports the option (bf16 compression needs NCCL 2.10+)."))
        n = v.numerics
        if n is not None and n.changed:
            diff = "a loss that is not finite" if n.nonfinite else f"{n.rel_diff or 0:.2e} of the loss (relative)"
            out.append(Finding("tune-numerics-changed", Severity.WARNING,
                               f"{v.label} changes the loss: up to {diff} over {n.iterations} iterations, beyond "
                               f"the tolerance of {n.tolerance:.0e}",
                               evidence={"setting": v.label, **n.to_json()},
                               advice="Check convergence over a full run before adopting it."))
        elif n is not None and n.state == "within tolerance" and n.baseline_rel_spread == 0:
            # The baseline repeats itself bit for bit, so any difference is the variant's own arithmetic.
            out.append(Finding("tune-numerics-differ", Severity.INFO,
                               f"{v.label} changes the loss slightly: up to {n.rel_diff:.2e} (relative) over "
                               f"{n.iterations} iterations, within the tolerance of {n.tolerance:.0e}; the "
                               "baseline's own launches agree bit for bit",
                               evidence={"setting": v.label, **n.to_json()}))
    winners = sorted((v for v in result.variants if v.winner and v.diff is not None),
                     key=lambda v: v.diff.value if v.diff else 0.0)
    keep = [v for v in winners if not (v.numerics and v.numerics.changed)]
    best = keep[0] if keep else (winners[0] if winners else None)
    if best is not None and best.diff is not None and base_ms:
        gain_lo = -best.diff.hi
        sev = Severity.WARNING if gain_lo >= WARNING_SHARE * base_ms else Severity.INFO
        cand = by_label.get(best.label)
        pred = f", predicted {_ms(cand.predicted_ms)} ms" if cand and cand.predicted_ms is not None else ""
        ev: JsonObject = {"setting": best.label, "baseline_ms": round(base_ms, 3),
                              "step_ms": round(best.step.value, 3) if best.step else None,
                              "diff_ms": best.diff.to_json(digits=3), "cost_ms_per_step": round(-best.diff.value, 3),
                              "cost_pct_of_step": round(100 * -best.diff.value / base_ms, 1)}
        if gpus_total:
            ev["gpu_hours_per_day"] = round(gpu_hours_per_day(best.diff.value, base_ms, gpus_total), 2)
        changed = " (it changes the loss: see tune-numerics-changed)" if best.numerics and best.numerics.changed else ""
        out.append(Finding("tune-winner", sev,
                           f"{best.label} is faster than the script's settings: {measured_text(best)}{pred}{changed}",
                           evidence=ev, advice=f"Change the script: {code_line(by_label[best.label].setting, cfg) if cand else best.label}."))
    elif result.variants:
        noise = result.launch_spread_ms
        out.append(Finding("tune-no-winner", Severity.INFO,
                           "No variant was measurably faster than the script's settings"
                           + (f" (two consecutive launches of the script's own settings differed by up to "
                              f"{noise:.3f} ms)" if noise is not None else ""),
                           evidence={"variants": {v.label: v.verdict for v in result.variants},
                                     "launch_spread_ms": result.launch_spread_ms},
                           advice="Keep the current settings. If a smaller gain matters: more iterations per launch "
                           "(--steps) narrow the intervals, and a machine free of other jobs lowers the launch "
                           "noise."))
    return out
