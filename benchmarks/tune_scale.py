"""How `ddpdoctor tune`'s analysis grows with ranks and iterations: the job's iteration times from every rank's
step times, then the comparison (bootstraps of pooled and paired iterations), for synthetic trials of two sizes.

    python benchmarks/tune_scale.py

Prints seconds per size and the ratio against the small size: linear growth shows as a ratio near the ratio of
the inputs (ranks x iterations), never its square."""

from __future__ import annotations

import random
import time

from ddpdoctor.analyses.tune import BASELINE, Trial, compare, job_step_ms


def one(ranks: int, iterations: int, variants: int = 3, rounds: int = 2) -> float:
    rng = random.Random(0)
    labels = [(r, label) for r in range(rounds) for label in [BASELINE, *(f"v{i}" for i in range(variants))]]
    # Every rank's step times of every launch, made before the clock starts: only the analysis is timed.
    data = [[[0.02 + rng.random() * 0.002 for _ in range(iterations + 5)] for _ in range(ranks)] for _ in labels]
    start = time.perf_counter()
    trials = [Trial(label, r, i, tuple(job_step_ms(times, 5, iterations + 5)))
              for i, ((r, label), times) in enumerate(zip(labels, data, strict=True))]
    compare(trials)
    return time.perf_counter() - start


def main() -> None:
    small = one(64, 20)
    for ranks, iterations in ((64, 20), (1024, 20), (1024, 80)):
        t = one(ranks, iterations)
        size = ranks * iterations / (64 * 20)
        print(f"{ranks:5d} ranks x {iterations:3d} iterations: {t:.3f} s  ({t / small:.1f}x the time for {size:.0f}x "
              "the input)")


if __name__ == "__main__":
    main()
