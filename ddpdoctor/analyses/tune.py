"""`ddpdoctor tune`'s measurements, pure: each variant's step time with its interval, the paired difference from
the baseline, whether the setting was in effect, and how far the loss moved (docs/tune.md defines every figure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpdoctor.analyses.intervals import Interval, bootstrap
from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import WhatIf
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import AppliedSetting, DDPModule, FSDPUnit

BASELINE = "baseline"
# The constructor options a variant may set, with the type each value has; and comm_hook=<name> (torch's default
# hooks). probes/tune.py applies them; the rules (findings/tune.py) and `--try` name them.
OPTIONS: dict[str, type] = {
    "bucket_cap_mb": float,
    "gradient_as_bucket_view": bool,
    "static_graph": bool,
    "find_unused_parameters": bool,
}
COMM_HOOKS = ("fp16", "bf16")
# FSDP2's knobs (issue 37 item 5), set by probes/tune.py on the script's FSDP modules after its first iteration:
# forward_prefetch=N: each unit's forward all-gathers the next N units' parameters (set_modules_to_forward_prefetch),
# 0 is FSDP2's default (none); backward_prefetch=N: each unit's backward the N units before it
# (set_modules_to_backward_prefetch; FSDP2's default is 1, and an empty list restores it, so N >= 1);
# reshard_after_forward: every unit but the root (set_reshard_after_forward(v, recurse=False)).
FSDP_OPTIONS: dict[str, type] = {
    "forward_prefetch": int,
    "backward_prefetch": int,
    "reshard_after_forward": bool,
}
# One variant: OPTION -> value for the OPTIONS it changes (a float cap or a bool) and "comm_hook" -> a name of
# COMM_HOOKS; {} is the baseline. It is the probe's input (tune.json "setting") and the report's "options".
Setting = dict[str, float | bool | str]
# A loss that moves by less than this share of the baseline's (at the same iteration) is "the same numerics". Two
# launches of the same setting with a seeded script give bit-identical losses on gloo; NCCL may sum in another order
# for another bucket layout, a few 1e-7 per step.
LOSS_REL_TOL = 1e-4
# A launch whose iterations spread (interquartile range / median) more than DISTURBED_FACTOR times the baseline
# launches' usual spread, and more than DISTURBED_MIN_SPREAD, was disturbed (other load on the machine): on the
# 2-core machine shared by 8 test suites, an A/A tune (the same setting as a "variant") was called 8 ms slower twice
# in a row because bursts of load fell on both of the variant's launches; their iterations spread 0.9 of the median,
# the baseline's 0.1.
DISTURBED_FACTOR = 3.0
DISTURBED_MIN_SPREAD = 0.25


@dataclass(frozen=True)
class Trial:
    """One launch of one setting: the job's time of each measured iteration (ms; the mean over ranks, warm-up
    iterations left out), rank 0's loss of every iteration, and whether the setting was in effect."""

    label: str
    round: int
    order: int  # position in the launch sequence (0 = first)
    step_ms: tuple[float, ...]
    losses: tuple[float | None, ...] = ()
    in_effect: bool = True
    effect: str = ""  # what the recorded layout showed ("5 buckets, as the what-if replays bucket_cap_mb=1")
    exit_code: int = 0
    buckets: int | None = None


@dataclass(frozen=True)
class Numerics:
    """How far a variant's loss moved from the baseline's: the largest relative difference over the iterations both
    recorded (``rel_diff``), against ``tolerance``; ``None`` when the baseline's own launches disagree by more
    than the tolerance (an unseeded script): the data cannot decide."""

    rel_diff: float | None
    baseline_rel_spread: float | None
    tolerance: float
    iterations: int
    changed: bool | None
    nonfinite: bool = False

    @property
    def state(self) -> str:
        """"identical" (bit for bit), "within tolerance", "changed", "not finite" or "undecided"."""
        if self.nonfinite:
            return "not finite"
        if self.changed is None:
            return "undecided"
        if self.changed:
            return "changed"
        return "identical" if self.rel_diff == 0 else "within tolerance"

    def to_json(self) -> JsonObject:
        return {"state": self.state, "loss_rel_diff": self.rel_diff, "baseline_rel_spread": self.baseline_rel_spread,
                "tolerance": self.tolerance, "iterations": self.iterations, "changed": self.changed,
                "nonfinite": self.nonfinite}


@dataclass
class VariantResult:
    label: str
    launches: int
    step: Interval | None  # median step time (ms) over the pooled measured iterations of its launches
    diff: Interval | None  # median of paired (variant - baseline) iteration times, same round, same iteration (ms)
    launch_medians: list[float] = field(default_factory=list)
    faster_every_round: bool = False  # every launch faster than its neighbouring baseline launches
    in_effect: bool = True
    effect: str = ""
    numerics: Numerics | None = None
    failed: list[int] = field(default_factory=list)  # exit codes of its launches that failed
    buckets: int | None = None  # DDP's buckets as its first launch recorded them (after the rebuild)
    # faster, slower, no measurable difference, undecided, not measured, not applied, failed
    verdict: str = "not measured"
    why: str = ""
    winner: bool = False


@dataclass
class TuneResult:
    baseline: VariantResult
    variants: list[VariantResult]
    launch_spread_ms: float | None  # launch noise: the largest difference of consecutive baseline launches
    order: list[str]  # the labels in launch order


def _median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _rel_diff(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[float | None, int, bool]:
    """max |a_i - b_i| / max(|b_i|, tiny) over the iterations both have; whether a value was not finite."""
    worst: float | None = None
    n = 0
    nonfinite = False
    for x, y in zip(a, b, strict=False):
        if x is None or y is None:
            continue
        if not (isinstance(x, (int, float)) and isinstance(y, (int, float))) or not (math.isfinite(x) and
                                                                                    math.isfinite(y)):
            nonfinite = nonfinite or not (isinstance(x, (int, float)) and math.isfinite(x))
            continue
        n += 1
        d = abs(x - y) / max(abs(y), 1e-12)
        worst = d if worst is None else max(worst, d)
    return worst, n, nonfinite


def neighbours(t: Trial, baseline: Sequence[Trial]) -> list[Trial]:
    """The baseline launches just before and just after ``t`` in the launch order (one at an edge): the launches
    that shared the machine's state with it."""
    before = [b for b in baseline if b.order < t.order]
    after = [b for b in baseline if b.order > t.order]
    out = ([max(before, key=lambda b: b.order)] if before else []) + ([min(after, key=lambda b: b.order)] if after
                                                                      else [])
    return out


def numerics(variant: Sequence[Trial], baseline: Sequence[Trial], tolerance: float = LOSS_REL_TOL) -> Numerics:
    """The variant's loss against its neighbouring baseline launches'; the baseline's own spread (its launches
    against its first) decides whether the comparison can."""
    if not baseline or not baseline[0].losses:
        return Numerics(None, None, tolerance, 0, None)
    first = baseline[0]
    spreads = [_rel_diff(b.losses, first.losses)[0] for b in baseline[1:]]
    spread = max((s for s in spreads if s is not None), default=None)
    worst: float | None = None
    n = 0
    nonfinite = False
    for t in variant:
        for ref in neighbours(t, baseline) or [first]:
            d, k, bad = _rel_diff(t.losses, ref.losses)
            nonfinite = nonfinite or bad
            n = max(n, k)
            if d is not None:
                worst = d if worst is None else max(worst, d)
    if nonfinite:
        return Numerics(worst, spread, tolerance, n, True, True)
    if worst is None:
        return Numerics(None, spread, tolerance, 0, None)
    if spread is not None and spread > tolerance:
        return Numerics(worst, spread, tolerance, n, None)
    return Numerics(worst, spread, tolerance, n, worst > tolerance)


def _paired(variant: Sequence[Trial], baseline: Sequence[Trial]) -> tuple[list[float], list[int]]:
    """Iteration j of a variant launch minus the mean of iteration j of its neighbouring baseline launches (a
    linear drift cancels in the mean of the launch before and after); and per variant launch the side its median
    fell on against the mean of its neighbours' medians (-1 faster, +1 slower, 0 equal)."""
    diffs: list[float] = []
    sides: list[int] = []
    for t in variant:
        refs = [b for b in neighbours(t, baseline) if b.step_ms]
        if not refs or not t.step_ms:
            continue
        for j, x in enumerate(t.step_ms):
            at = [b.step_ms[j] for b in refs if j < len(b.step_ms)]
            if at:
                diffs.append(x - sum(at) / len(at))
        mine, theirs = statistics.median(t.step_ms), statistics.fmean(statistics.median(b.step_ms) for b in refs)
        sides.append((mine > theirs) - (mine < theirs))
    return diffs, sides


def launch_noise(baseline: Sequence[Trial]) -> float | None:
    """The largest difference between the medians of two consecutive baseline launches: what relaunching the
    same setting changes over the distance between a variant's neighbours (None with fewer than 2 launches)."""
    meds = [statistics.median(b.step_ms) for b in sorted(baseline, key=lambda b: b.order) if b.step_ms]
    return max((abs(a - b) for a, b in zip(meds, meds[1:], strict=False)), default=None)


def _measure(label: str, trials: Sequence[Trial]) -> VariantResult:
    pooled = [x for t in trials for x in t.step_ms]
    medians = [statistics.median(t.step_ms) for t in trials if t.step_ms]
    return VariantResult(label, len(trials), bootstrap(pooled, statistics.median) if pooled else None, None,
                         medians, in_effect=all(t.in_effect for t in trials),
                         effect="; ".join(dict.fromkeys(t.effect for t in trials if t.effect)),
                         failed=[t.exit_code for t in trials if t.exit_code],
                         buckets=next((t.buckets for t in trials if t.buckets is not None), None))


def relative_spread(values: Sequence[float]) -> float | None:
    """(q75 - q25) / median of a launch's iteration times (None under 4 iterations)."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    med = statistics.median(values)
    return (q[2] - q[0]) / med if med > 0 else None


def disturbed(variant: Sequence[Trial], baseline: Sequence[Trial]) -> list[int]:
    """The launches (their order) among a variant's and its neighbouring baseline launches whose iterations spread
    far more than the baseline launches usually do: a comparison that rests on them cannot decide."""
    usual = [u for b in baseline if (u := relative_spread(b.step_ms)) is not None]
    if not usual:
        return []
    limit = max(DISTURBED_FACTOR * statistics.median(usual), DISTURBED_MIN_SPREAD)
    out: set[int] = set()
    for t in variant:
        for launch in (t, *neighbours(t, baseline)):
            spread = relative_spread(launch.step_ms)
            if spread is not None and spread > limit:
                out.add(launch.order)
    return sorted(out)


def judge(v: VariantResult, base: VariantResult, noise_ms: float | None, sides: Sequence[int],
          disturbed_launches: Sequence[int] = ()) -> None:
    """The honesty rule: a variant is faster (a winner) only when its step-time interval lies wholly below the
    baseline's, the interval of the paired difference lies below 0, each of its launches was faster than its
    neighbouring baseline launches, and the gain exceeds the launch noise (two consecutive baseline launches'
    largest difference). Slower is the mirror rule; anything else is no measurable difference, with the reason."""
    if v.failed or base.failed:
        which = "its" if v.failed else "the baseline's"
        v.verdict, v.why = "failed", f"{which} launch(es) failed (exit {', '.join(map(str, v.failed or base.failed))})"
        return
    if not v.in_effect:
        v.verdict, v.why = "not applied", f"the setting was not in effect ({v.effect or 'see the trial launches'})"
        return
    if v.step is None or base.step is None or not v.step.measurable or not base.step.measurable or v.diff is None:
        v.verdict, v.why = "not measured", "fewer than 3 measured iterations in a variant or the baseline"
        return
    gain = -v.diff.value
    noise = noise_ms if noise_ms is not None else 0.0
    if disturbed_launches:
        v.verdict = "undecided"
        v.why = (f"launch(es) {', '.join(str(i + 1) for i in disturbed_launches)} were disturbed (their iterations "
                 "spread far more than the baseline's usually do: other load on the machine?); rerun on a quiet "
                 "machine or with more --rounds")
        return
    v.faster_every_round = bool(sides) and all(x < 0 for x in sides)
    slower_every_launch = bool(sides) and all(x > 0 for x in sides)
    if v.step.hi < base.step.lo and v.diff.hi < 0 and v.faster_every_round and gain > noise:
        v.verdict, v.winner = "faster", True
        v.why = "its interval clears the baseline's, in every launch, by more than the launch noise"
    elif v.step.lo > base.step.hi and v.diff.lo > 0 and slower_every_launch and -gain > noise:
        v.verdict, v.why = "slower", "its interval lies above the baseline's, in every launch, beyond the launch noise"
    else:
        v.verdict = "no measurable difference"
        if not (v.step.hi < base.step.lo or v.step.lo > base.step.hi):
            v.why = "its interval overlaps the baseline's"
        elif v.diff.lo <= 0 <= v.diff.hi:
            v.why = "the interval of the paired difference contains 0"
        elif not (v.faster_every_round or slower_every_launch):
            v.why = "its launches were not all on the same side of their neighbouring baseline launches"
        else:
            v.why = f"the difference ({abs(gain):.3f} ms) is within the launch noise ({noise:.3f} ms)"


def compare(trials: Sequence[Trial], tolerance: float = LOSS_REL_TOL) -> TuneResult:
    """Every label's launches against the baseline's (the trials labelled ``BASELINE``)."""
    by_label: dict[str, list[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.order):
        by_label.setdefault(t.label, []).append(t)
    base_trials = by_label.pop(BASELINE, [])
    base = _measure(BASELINE, base_trials)
    base.verdict, base.why = "baseline", "the script's own settings"
    noise = launch_noise(base_trials)
    out = []
    for label, ts in by_label.items():
        v = _measure(label, ts)
        diffs, sides = _paired(ts, base_trials)
        v.diff = bootstrap(diffs, statistics.median) if diffs else None
        v.numerics = numerics(ts, base_trials, tolerance)
        judge(v, base, noise, sides, disturbed(ts, base_trials))
        out.append(v)
    return TuneResult(base, out, noise, [t.label for t in sorted(trials, key=lambda t: t.order)])


def gpu_hours_per_day(diff_ms: float, baseline_ms: float, gpus_total: int) -> float:
    """GPU-hours a day saved (negative: lost) by a step ``diff_ms`` shorter or longer, for a job on
    ``gpus_total`` GPUs that runs all day: the same work then takes (1 + diff/baseline) of the time."""
    return -gpus_total * 24.0 * diff_ms / baseline_ms if baseline_ms > 0 else 0.0


@dataclass
class Preparation:
    """What tune's profiled launch says about the model: its DDP options, the what-if, the rules' flags."""

    analysis: Analysis
    cfg: DDPModule | None
    whatif: WhatIf
    flag_ids: set[str]
    grad_counts: list[int]
    fsdp_units: list[FSDPUnit] = field(default_factory=list)  # FSDP2's units (rank 0's record): tune of FSDP2's knobs


def job_step_ms(step_times_s_by_rank: Sequence[Sequence[float | None]], first: int, last: int) -> list[float]:
    """The job's time of iterations ``first``..``last - 1``: per iteration the mean over the ranks that recorded
    it, in ms. Ranks wait for each other in every all_reduce, so their iteration times agree up to where each
    iteration's boundary falls; the mean over ranks is the job's. A rank's unknown time (null) is left out."""
    out = []
    for i in range(first, last):
        vals = [float(t) for r in step_times_s_by_rank if i < len(r) and (t := r[i]) is not None]
        if vals:
            out.append(1000.0 * sum(vals) / len(vals))
    return out


def in_effect(setting: Setting, modules: Sequence[DDPModule], applied: Sequence[AppliedSetting],
              errors: Sequence[str]) -> tuple[bool, str, int | None]:
    """Whether a trial ran with its setting, from what its ranks recorded: the DDP module's options and bucket
    layout (info.json, after DDP's rebuild) and the hook the probe registered (tune.json). Returns (in effect,
    what was seen, buckets)."""
    if not modules:
        return False, "the script built no DistributedDataParallel in this launch", None
    m = modules[0]
    buckets = len(m.buckets) or None
    seen = []
    ok = True
    for key in OPTIONS:
        if key not in setting:
            continue
        got, want = getattr(m, key), setting[key]
        same = (got is not None and abs(float(got) - float(want)) < 1e-3) if key == "bucket_cap_mb" else got == want
        ok = ok and same
        seen.append(f"{key}={got} recorded" + ("" if same else f" (asked {want})"))
    hook = setting.get("comm_hook")
    if hook:
        hooked = bool(applied) and all(a.comm_hook == hook for a in applied)
        ok = ok and hooked and not errors
        seen.append(f"{hook} hook registered" if hooked else f"{hook} hook not registered")
    seen.extend(errors)
    if buckets is not None:
        seen.append(f"{buckets} bucket(s)")
    return ok, ", ".join(seen), buckets


def fsdp_in_effect(setting: Setting, units: Sequence[FSDPUnit], applied: Sequence[AppliedSetting],
                   errors: Sequence[str]) -> tuple[bool, str]:
    """Whether an FSDP2 trial ran with its setting, from what its rank recorded after the probe set it (info.json's
    units, described at iteration 3: each unit's prefetch lists and reshard_after_forward). Returns (in effect,
    what was seen)."""
    inner = [u for u in units if not u.is_root]
    if not inner:
        return False, "the script built no FSDP2 unit in this launch"
    seen = []
    ok = bool(applied) and not errors
    for key, value in setting.items():
        if key == "forward_prefetch":
            got = max(len(u.forward_prefetch) for u in inner)
            same = got == int(value)
        elif key == "backward_prefetch":
            got = max(len(u.backward_prefetch) for u in inner)
            same = got == int(value)
        elif key == "reshard_after_forward":
            kept = sorted({str(u.reshard_after_forward) for u in inner})
            got = kept[0] if len(kept) == 1 else "/".join(kept)  # type: ignore[assignment]
            same = kept == [str(bool(value))]
        else:
            continue
        ok = ok and same
        seen.append(f"{key}={got} recorded" + ("" if same else f" (asked {value})"))
    seen.extend(errors)
    seen.append(f"{len(inner)} unit(s)")
    return ok, ", ".join(seen)
