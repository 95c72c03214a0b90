"""What the profiler stop's settle costs (probes/profiler.settle_comm_threads): a real 2-rank gloo DDP job calls it
after every iteration and compares the wait with the iteration itself, measured in the same run.

    python benchmarks/settle_cost.py [--steps 200]

In a profile it runs once per window (before the stop that ends a recording), so per-iteration figures here are an
upper bound."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def worker(steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.probes.profiler import settle_comm_threads

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waits, iters = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(torch.randn(8, 64)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iters.append(time.perf_counter() - t0)
        waits.append(settle_comm_threads())
    waits.sort()
    it = statistics.median(iters)
    if dist.get_rank() == 0:
        med, p99 = statistics.median(waits), waits[int(0.99 * (len(waits) - 1))]
        print(f"settle after {steps} iterations: median {med * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, "
              f"max {waits[-1] * 1e3:.3f} ms; iteration median {it * 1e3:.3f} ms; "
              f"median settle / iteration = {med / it:.3f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if "RANK" in os.environ:
        worker(args.steps)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
           "--steps", str(args.steps)]
    raise SystemExit(subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode)


if __name__ == "__main__":
    main()
