"""How `ddpdoctor diff`'s analysis grows with ranks and steps: synthetic runs of 64 and 512 ranks (and 20 and 80 steps,
4 collectives per step per rank), each side timed through analyses.diff.diff + findings, in this process.

    python benchmarks/diff_scale.py [--ranks 64 512] [--steps 20 80]

Prints the time of each size and its ratio to the smallest: linear growth doubles the time when ranks or steps double
(8x ranks -> about 8x); anything quadratic shows as 64x. Nothing here asserts: timings are noisy on a shared machine."""

from __future__ import annotations

import argparse
import random
import time

from ddpdoctor.analyses.diff import diff
from ddpdoctor.analyses.results import Analysis, CollectiveCall, RankMetrics, StepMetrics
from ddpdoctor.findings.diff import diff_findings


def run(ranks: int, steps: int, slow: float, seed: int) -> Analysis:
    rng = random.Random(seed)
    metrics, calls = [], []
    for r in range(ranks):
        per = []
        for s in range(steps):
            dur = 10_000.0 + rng.gauss(0, 300) + (slow if r == 1 else 0.0)
            per.append(StepMetrics(step=s, start_us=s * 20_000.0, dur_us=dur, compute_us=6_000.0, comm_us=2_000.0,
                                   overlap_us=0.0, overlap_pct=0.0, exposed_comm_us=2_000.0, idle_us=500.0,
                                   backward_start_us=s * 20_000.0 + 3_000, backward_end_us=s * 20_000.0 + 7_000,
                                   comm_in_backward_us=0.0, data_wait_us=300.0 + (slow if r == 1 else 0.0)))
            for k in range(4):
                calls.append(CollectiveCall(rank=r, index=s * 4 + k, step=s, op="all_reduce", group="0", seq=s * 4 + k,
                                            bytes=(1 << 20) * (k + 1), start_us=0.0, dur_us=400.0 + rng.random(),
                                            end_us=400.0, start_rel_backward_us=None, algbw_gbps=None, busbw_gbps=1.0))
        metrics.append(RankMetrics(rank=r, world_size=ranks, device="cpu", backend="gloo", steps=steps,
                                   step_ids=list(range(steps)), step_time_us={"median": 10_000.0}, compute_us=0.0,
                                   comm_us=0.0, overlap_us=0.0, overlap_pct=None, exposed_comm_us=0.0,
                                   exposed_comm_pct=None, idle_us=0.0, memory_us=0.0, backward_us=0.0,
                                   comm_in_backward_us=0.0, data_wait_us=0.0, per_step=per))
    return Analysis(inputs=[], window="all", ranks=metrics, calls=calls)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--steps", type=int, nargs="+", default=[20, 80])
    args = ap.parse_args()
    first = None
    for ranks in args.ranks:
        for steps in args.steps:
            base, new = run(ranks, steps, 0.0, 1), run(ranks, steps, 3_000.0, 2)
            t0 = time.perf_counter()
            d = diff(base, new)
            findings = diff_findings(d)
            t = time.perf_counter() - t0
            first = first or t
            print(f"ranks {ranks:5d} steps {steps:3d}: {t:7.2f} s ({t / first:5.1f}x the first size); "
                  f"{[f.id for f in findings]}, lead {d.contributors[0].component} on rank {d.contributors[0].rank}")


if __name__ == "__main__":
    main()
