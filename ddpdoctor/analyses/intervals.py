"""Intervals for the figures findings rest on: a deterministic bootstrap over recorded steps (and ranks).

A verdict from 3 recorded steps can flip from run to run; an interval says how far a figure can be trusted, and a
finding is raised only when its whole interval clears the threshold (docs/findings.md, "Severity and intervals")."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ddpdoctor.jsontypes import JsonObject

# 90% percentile interval from 400 resamples: narrow enough to decide on 6-10 steps, and fixed-seed so that the same
# recorded run always gives the same verdict.
RESAMPLES = 400
LEVEL = 0.90
SEED = 0
# Fewer values than this and no interval means anything: the figure is "not measurable".
MIN_SAMPLES = 3
# Above this many values the resampling runs in numpy (another generator: same seed, other draws); below it, the
# per-value Python loop, whose intervals the recorded verdicts were checked against (a profile of a few ranks and
# tens of steps); a 258-step, 2-rank trace spent more time resampling than reading its 110 MB.
VECTOR_FROM = 256
# --active is never suggested above this (traces grow with every step).
MAX_SUGGESTED_ACTIVE = 50


@dataclass(frozen=True)
class Interval:
    """``value`` (the statistic over all samples) and its bootstrap interval [lo, hi] over ``n`` samples."""

    value: float
    lo: float
    hi: float
    n: int

    @property
    def measurable(self) -> bool:
        return self.n >= MIN_SAMPLES

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    def above(self, threshold: float) -> bool:
        """The whole interval is above ``threshold``."""
        return self.measurable and self.lo > threshold

    def undecided(self, threshold: float) -> bool:
        """The figure is above ``threshold`` but its interval reaches below it (or there are too few samples)."""
        return self.value > threshold and not self.above(threshold)

    def to_json(self, scale: float = 1.0, digits: int = 1) -> JsonObject:
        return {"value": round(self.value * scale, digits), "interval": [round(self.lo * scale, digits),
                round(self.hi * scale, digits)], "n": self.n}


def bootstrap(values: Sequence[float], stat: Callable[[Sequence[float]], float] = statistics.fmean,
              resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> Interval | None:
    """The percentile bootstrap interval of ``stat`` over ``values`` (None without values). Deterministic."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    point = float(stat(vals))
    if len(vals) == 1:
        return Interval(point, point, point, 1)
    n = len(vals)
    if n > VECTOR_FROM:
        stats = _resampled_np(np.asarray(vals), stat, resamples, seed)
    else:
        idx = randbelow_many(random.Random(seed), n, resamples * n)
        rows = np.asarray(vals)[idx].reshape(resamples, n).tolist()
        stats = sorted(float(stat(row)) for row in rows)
    tail = (1.0 - level) / 2.0
    lo = stats[int(math.floor(tail * (resamples - 1)))]
    hi = stats[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    return Interval(point, min(lo, point), max(hi, point), n)


def randbelow_many(rng: random.Random, n: int, count: int) -> np.ndarray:
    """``count`` draws of ``rng.randrange(n)``, the very same values in the same order, drawn in bulk: CPython's
    randrange(n) takes k = n.bit_length() bits of one 32-bit Mersenne Twister word (the word >> (32 - k)) and draws
    again while the value is >= n; getrandbits(32 * m) is the next m words, the first in the lowest bits. 0 < n <
    2**32. (Per draw, randrange is a few Python calls: 400 resamples of 24 steps took 0.1 s of an analysis.)"""
    k = n.bit_length()
    got: list[np.ndarray] = []
    have = 0
    while have < count:
        m = max(64, 2 * (count - have) + 16)  # at least half of the words are kept (n >= 2 ** (k - 1))
        words = np.frombuffer(rng.getrandbits(32 * m).to_bytes(4 * m, "little"), dtype="<u4") >> np.uint32(32 - k)
        kept = words[words < n]
        got.append(kept)
        have += len(kept)
    return np.concatenate(got)[:count].astype(np.intp)


def _resampled_np(arr: np.ndarray, stat: Callable[[Sequence[float]], float], resamples: int, seed: int
                  ) -> list[float]:
    """The sorted resampled statistics for many values (thousands of steps x ranks): numpy draws and, for the
    statistics it has, numpy reductions, so that 200,000 steps cost a second, not minutes of Python loops. Fixed
    seed: the same values give the same interval. A statistic numpy does not know is called on the resample."""
    rng = np.random.default_rng(seed)
    fast = _NUMPY_STATS.get(stat)
    out = []
    for _ in range(resamples):
        sample = arr[rng.integers(0, len(arr), size=len(arr))]
        out.append(float(fast(sample)) if fast is not None else float(stat(sample)))  # type: ignore[arg-type]
    return sorted(out)


_NUMPY_STATS: dict[Callable[..., float], Callable[[np.ndarray], float]] = {
    statistics.fmean: lambda a: float(a.mean()), statistics.mean: lambda a: float(a.mean()),
    statistics.median: lambda a: float(np.median(a)),
}


def suggested_active(iv: Interval, threshold: float, steps: int) -> int:
    """How many steps would shrink the interval (∝ 1/√n) to clear ``threshold``, as a --active value."""
    gap = abs(iv.value - threshold)
    if iv.half_width <= 0 or gap <= 0 or not iv.measurable:
        return min(MAX_SUGGESTED_ACTIVE, max(10, 3 * max(1, steps)))
    need = math.ceil(steps * (iv.half_width / gap) ** 2 * 1.2)
    return int(min(MAX_SUGGESTED_ACTIVE, max(steps + 2, need)))


def bootstrap_mean_diff(base: Sequence[float], new: Sequence[float], resamples: int = RESAMPLES,
                        level: float = LEVEL, seed: int = SEED) -> Interval | None:
    """mean(new) - mean(base) and its percentile bootstrap interval, each side resampled on its own (two runs' steps
    are not paired). Deterministic like ``bootstrap``; ``n`` is the smaller side. None when a side has no value."""
    import numpy as np

    b = np.asarray([float(v) for v in base if v is not None and math.isfinite(v)], dtype=float)
    x = np.asarray([float(v) for v in new if v is not None and math.isfinite(v)], dtype=float)
    if not len(b) or not len(x):
        return None
    point = float(x.mean() - b.mean())
    n = min(len(b), len(x))
    if n == 1:
        return Interval(point, point, point, 1)
    rng = np.random.default_rng(seed)
    diffs = np.sort(x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
                    - b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1))
    tail = (1.0 - level) / 2.0
    lo = float(diffs[int(math.floor(tail * (resamples - 1)))])
    hi = float(diffs[int(math.ceil((1.0 - tail) * (resamples - 1)))])
    return Interval(point, min(lo, point), max(hi, point), n)
