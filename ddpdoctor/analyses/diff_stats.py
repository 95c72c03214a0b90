"""`diff`'s statistics: a figure's change between two runs with its interval, and the minimum effect that tells a
change from noise (docs/diff.md, "Noise is not a regression"). Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddpdoctor.analyses.intervals import MIN_SAMPLES, Interval, bootstrap_mean_diff
from ddpdoctor.jsontypes import JsonObject

# Noise is not a regression: a change is reported only when its 90% interval excludes zero AND its size is at least
# the minimum effect: MIN_EFFECT_PCT of the base step, MIN_EFFECT_US, and NOISE_SD times the pooled standard deviation
# of the figure's steps within each run. The last term is the shared host's doing: 8 profiles of one unchanged 2-rank
# job on the loaded 2-core test machine had mean steps from 7.1 to 16.3 ms as the host's load changed between them, and
# their 28 pairs differed by up to 1.6 pooled standard deviations (one pair in 28 by 1.6, five over 1.4), while a 15 ms
# sleep in one rank's data loading moved the step by 2.07 to 4.94 (docs/diff.md, "Noise").
MIN_EFFECT_PCT = 5.0
MIN_EFFECT_US = 200.0
NOISE_SD = 2.0


@dataclass(frozen=True)
class Delta:
    """A per-step mean on each side and the change, with its interval; ``significant``: the interval excludes 0
    and the change is at least the minimum effect."""

    base_us: float
    new_us: float
    change: Interval
    significant: bool
    pct_of_step: float | None  # change / base step (job mean), %
    min_effect_us: float  # the smallest change counted for this figure (MIN_EFFECT_*, NOISE_SD)

    def to_json(self) -> JsonObject:
        return {"base_ms": round(self.base_us / 1e3, 3), "new_ms": round(self.new_us / 1e3, 3),
                "delta_ms": self.change.to_json(scale=1e-3, digits=3), "pct_of_step": self.pct_of_step,
                "significant": self.significant, "min_effect_ms": round(self.min_effect_us / 1e3, 3)}


def pooled_sd(base: list[float], new: list[float]) -> float:
    """sqrt of the mean of the two sides' sample variances (0 where a side has fewer than 2 values)."""
    var = [statistics.variance(v) if len(v) >= 2 else 0.0 for v in (base, new)]
    return float((sum(var) / 2.0) ** 0.5)


def delta(base: list[float], new: list[float], base_step_us: float, floor_us: float) -> Delta | None:
    """The change of one figure; ``floor_us``: the minimum effect from the step's size (MIN_EFFECT_*)."""
    iv = bootstrap_mean_diff(base, new)
    if iv is None:
        return None
    excludes_zero = iv.n >= MIN_SAMPLES and (iv.lo > 0 or iv.hi < 0)
    pct = round(100.0 * iv.value / base_step_us, 1) if base_step_us > 0 else None
    minimum = max(floor_us, NOISE_SD * pooled_sd(base, new))
    return Delta(statistics.fmean(base), statistics.fmean(new), iv, excludes_zero and abs(iv.value) >= minimum,
                 pct, minimum)
