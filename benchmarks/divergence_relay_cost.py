"""What --on-divergence stop costs a step across nodes (issue 38, job/divergence_relay.py): two launchers of 2 ranks
on this machine (`--nnodes 2`, as tests/e2e/test_divergence.py's two-node launch), tests/scenarios/diverge.py with
no fault, once in warn mode (nothing held) and once in stop mode (each optimizer step held until the head's word
came back through the job store), alternated ``--rounds`` times. Each rank records when each step's loss was known;
the figure is the median step interval of stop mode minus warn mode's (rank 0, steps 3 on: start-up left out).

    python benchmarks/divergence_relay_cost.py [--steps 30] [--rounds 2]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _intervals(mode: str, steps: int, out: Path) -> list[float]:
    import torch

    from tests.e2e.test_multinode import finish, start_nodes

    env = {"DIVERGE_FAULT": "none", "DIVERGE_STEPS": str(steps), "DIVERGE_OUT": str(out / "weights"),
           "SCENARIO_GLOO_TIMEOUT": "60", "DDPDOCTOR_DIVERGENCE_HOLD_S": "60"}
    procs = start_nodes("run", "diverge.py", out / "run", 2, 2, "--on-divergence", mode, "--hang-timeout", "60",
                        "--startup-timeout", "300", env=env)
    results = finish(procs, 600)
    if any(code != 0 for code, _, _ in results):
        raise SystemExit(f"{mode}: a launcher failed: " + " | ".join(se[-800:] for _, _, se in results))
    at = torch.load(out / "weights" / "rank0.pt")["at"]
    return [at[s + 1] - at[s] for s in range(3, steps)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    per: dict[str, list[float]] = {"warn": [], "stop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("warn", "stop"):
                per[mode] += _intervals(mode, args.steps, Path(tmp) / f"{mode}{r}")
    warn, stop = statistics.median(per["warn"]), statistics.median(per["stop"])
    print(f"two launchers of 2 ranks, {args.steps} steps x {args.rounds} rounds: median step {warn * 1e3:.1f} ms in "
          f"warn mode, {stop * 1e3:.1f} ms in stop mode: the hold costs {(stop - warn) * 1e3:.1f} ms a step "
          f"(stop mode's p90 {statistics.quantiles(per['stop'], n=10)[-1] * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
