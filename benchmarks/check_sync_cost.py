"""What checking 5 steps costs, in steps of the bundled example model (2 gloo ranks): `python benchmarks/check_sync_cost.py`.

Each rank alternates two phases, ``--repeats`` times: build the example's DDP model and DataLoader and run
5 steps plain; then the same with check-sync's probe installed (fingerprints of gradients, parameters and
buffers, the DataLoader recorder, and writing sync.json/data.json at the end). The cost is

    (median checked 5 steps - median plain 5 steps) / median plain steady step

in units of one training step; issue 6 asks for at most about 2. Both phases run in the same processes,
interleaved, so machine noise hits them alike.

A third phase measures a step past ``--steps`` while check-sync waits for a second epoch (the DataLoader
recorder only: the ranks agreed at ``--steps`` how many more steps to run): ``data_phase_step_extra_pct``, the
median such step against the median plain step at the same positions (steps 2-4)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _build(width: int, layers: int):
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(0)
    mods: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 10))
    model = DDP(nn.Sequential(*mods))
    n = 12 * 32 * 2
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, loader, opt


def _five_steps(width: int, layers: int) -> tuple[float, list[float]]:
    import torch.nn as nn

    model, loader, opt = _build(width, layers)
    loss_fn = nn.CrossEntropyLoss()
    step_times = []
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        s = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        step_times.append(time.perf_counter() - s)
        if i == 4:
            break
    return time.perf_counter() - t0, step_times


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(REPO))
    from ddpdoctor.probes.steps import StepTracker
    from ddpdoctor.probes.sync import install_check_sync
    from ddpdoctor.rundir.layout import RunDir

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain, checked, steady, check_s, data_phase, plain_tail = [], [], [], [], [], []
    _five_steps(args.width, args.layers)  # warm-up: first-use costs of torch and gloo
    for _ in range(args.repeats):
        dist.barrier()
        total, steps = _five_steps(args.width, args.layers)
        plain.append(total)
        steady.extend(steps[1:])
        plain_tail.extend(steps[2:])  # the same steps the data phase is measured on (step 1 rebuilds buckets)
        dist.barrier()
        tracker = StepTracker()
        tracker.install()
        probe = install_check_sync(RunDir(Path(args.out)), rank, dist.get_world_size(), {"steps": 0}, tracker)
        t0 = time.perf_counter()
        _five_steps(args.width, args.layers)
        probe.finish({})  # writes sync.json and data.json, as the end of a check does
        checked.append(time.perf_counter() - t0)
        check_s.append(probe.check_seconds)
        tracker.uninstall()
        dist.barrier()
        # Past --steps 1, waiting for a second epoch that is 12 steps away: every later step is a data-phase step.
        tracker = StepTracker()
        tracker.install()
        probe = install_check_sync(RunDir(Path(args.out)), rank, dist.get_world_size(),
                                   {"steps": 1, "data_steps": 10**6}, tracker)
        _, steps = _five_steps(args.width, args.layers)
        data_phase.extend(steps[2:])  # step 1 ends by creating check-sync's group: a one-off
        probe.uninstall()
        tracker.uninstall()
    if rank == 0:
        step = statistics.median(steady)
        extra = statistics.median(checked) - statistics.median(plain)
        print(json.dumps({
            "model": f"example MLP 64-{args.width}x{args.layers - 1}-10, batch 32, 2 gloo ranks",
            "repeats": args.repeats,
            "plain_5_steps_s": round(statistics.median(plain), 4),
            "checked_5_steps_s": round(statistics.median(checked), 4),
            "plain_step_s": round(step, 4),
            "fingerprint_time_in_hooks_s": round(statistics.median(check_s), 4),
            "extra_s": round(extra, 4),
            "extra_in_steps": round(extra / step, 2),
            "plain_step_2_to_4_s": round(statistics.median(plain_tail), 4),
            "data_phase_step_s": round(statistics.median(data_phase), 4),
            "data_phase_step_extra_pct": round((statistics.median(data_phase) / statistics.median(plain_tail) - 1) * 100, 1),
        }), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               "--worker", "--out", tmp, "--repeats", str(args.repeats), "--width", str(args.width),
               "--layers", str(args.layers)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(proc.returncode)
        result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    for k, v in result.items():
        print(f"{k:32s} {v}")
    verdict = "within" if result["extra_in_steps"] <= 2 else "ABOVE"
    print(f"checking 5 steps costs {result['extra_in_steps']} steps' worth of time: {verdict} the 2-step budget")


if __name__ == "__main__":
    main()
