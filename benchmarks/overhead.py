"""What ddpdoctor's probes cost on the steps they do not profile: step time under plain torchrun vs under
`ddpdoctor profile` (profiling window excluded) or `ddpdoctor run` (heartbeats, collective wrappers, monitor),
the same job, alternated in one session; plus the per-call cost of the wrappers.

    python benchmarks/overhead.py [--command profile|run] [--rounds 3] [--steps 60]

Prints the median step time of each launcher and their ratio (targets: profile < 1.01, run < 1.005). On a shared
2-core machine the run-to-run noise is larger than that: the spread of the plain runs is printed beside the ratio."""

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
sys.path.insert(0, str(REPO))  # this checkout's ddpdoctor, for the in-process wrapper measurement
JOB = Path(__file__).with_name("overhead_job.py")
SKIP = {"run": 5, "profile": 10}  # DDP builds its buckets in the first steps; profile records steps 3-5
DRAIN = (
    "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\nc, _ = s.accept()\nwhile c.recv(1 << 16):\n    pass\n"
)


def _step_times(text: str, skip: int) -> list[float]:
    for line in text.splitlines():
        if "STEP_TIMES " in line:
            return json.loads(line.split("STEP_TIMES ", 1)[1])[skip:]
    raise SystemExit(f"no STEP_TIMES in output:\n{text[-2000:]}")


def plain(steps: int, command: str) -> list[float]:
    for _ in range(3):  # --standalone picks a free port; on a busy machine a launch occasionally fails
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB),
             "--steps", str(steps)], capture_output=True, text=True)
        if out.returncode == 0:
            return _step_times(out.stdout, SKIP[command])
    raise SystemExit(f"plain torchrun failed:\n{out.stderr[-3000:]}")


def watched(steps: int, command: str, tmp: Path) -> list[float]:
    run_dir = tmp / f"run{time.time_ns()}"
    subprocess.run(
        [sys.executable, "-m", "ddpdoctor", command, "--nproc-per-node", "2", "-q", "--out", str(run_dir), str(JOB),
         "--steps", str(steps)], capture_output=True, text=True, cwd=REPO, check=False)
    return _step_times((run_dir / "ranks" / "rank0" / "stdout.log").read_text(), SKIP[command])


def wrapper_cost_us(n: int = 2000) -> tuple[float, float, float, float]:
    """Per-call cost of a 1-element all_reduce in a 1-rank gloo group and of a tiny backward(), without and with
    the heartbeat probe installed (connected to a listener): (all_reduce plain, wrapped, backward plain, wrapped)."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.probes.heartbeat import HeartbeatProbe
    from ddpdoctor.probes.steps import StepTracker

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29617")
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1)

    w = torch.ones(4, requires_grad=True)

    def timed(fn: object) -> float:
        for _ in range(200):
            fn()  # type: ignore[operator]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        return (time.perf_counter() - t0) / n * 1e6

    def bench() -> float:
        return timed(lambda: dist.all_reduce(t))

    def bench_backward() -> float:
        return timed(lambda: (w * 2).sum().backward())

    base = min(bench() for _ in range(3))
    base_bw = min(bench_backward() for _ in range(3))
    # A listener in another process that reads and discards, as the monitor does: the send is part of the cost.
    drain = subprocess.Popen([sys.executable, "-c", DRAIN], stdout=subprocess.PIPE, text=True)
    port = int(drain.stdout.readline())  # type: ignore[union-attr]
    probe = HeartbeatProbe(f"127.0.0.1:{port}", 0, 1, StepTracker(),
                           Path(tempfile.mkdtemp()) / "stacks.txt")
    probe.install()
    deadline = time.time() + 5
    while probe._sock is None and time.time() < deadline:
        time.sleep(0.01)
    wrapped_bw = min(bench_backward() for _ in range(3))
    wrapped = min(bench() for _ in range(3))
    probe.finish({})
    drain.kill()
    dist.destroy_process_group()
    return base, wrapped, base_bw, wrapped_bw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--command", choices=["profile", "run"], default="profile")
    a = ap.parse_args()
    plain_meds: list[float] = []
    watched_meds: list[float] = []
    plain_p10: list[float] = []  # the fastest 10% of steps: least inflated by other processes on the machine
    watched_p10: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            # Alternate so that load drifting on the machine hits both launchers alike.
            first, second = (plain, watched) if r % 2 == 0 else (watched, plain)
            for fn in (first, second):
                times = plain(a.steps, a.command) if fn is plain else watched(a.steps, a.command, Path(tmp))
                (plain_meds if fn is plain else watched_meds).append(statistics.median(times))
                (plain_p10 if fn is plain else watched_p10).append(sorted(times)[len(times) // 10])
    p, w = statistics.median(plain_meds), statistics.median(watched_meds)
    print(f"plain torchrun  median step {p * 1e3:.3f} ms  (rounds: {', '.join(f'{x * 1e3:.3f}' for x in plain_meds)})")
    print(f"ddpdoctor {a.command:<8}median step {w * 1e3:.3f} ms  (rounds: {', '.join(f'{x * 1e3:.3f}' for x in watched_meds)})")
    spread = (max(plain_meds) - min(plain_meds)) / p if p else 0.0
    print(f"ratio ddpdoctor/plain = {w / p:.4f}  (overhead {100 * (w / p - 1):+.2f}%; plain run-to-run spread "
          f"{100 * spread:.2f}%)")
    p10p, p10w = statistics.median(plain_p10), statistics.median(watched_p10)
    print(f"10th-percentile step: plain {p10p * 1e3:.3f} ms, ddpdoctor {p10w * 1e3:.3f} ms, ratio {p10w / p10p:.4f}")
    base, wrapped, base_bw, wrapped_bw = wrapper_cost_us()
    print(f"1-element all_reduce, 1 rank: {base:.1f} us plain, {wrapped:.1f} us wrapped "
          f"(+{wrapped - base:.1f} us per collective call)")
    print(f"tiny backward(): {base_bw:.1f} us plain, {wrapped_bw:.1f} us wrapped (+{wrapped_bw - base_bw:.1f} us per call)")
    # overhead_job.py makes one user collective and one backward() per step.
    per_step_us = max(0.0, wrapped - base) + max(0.0, wrapped_bw - base_bw)
    print(f"per-step cost of the probe in this job: {per_step_us:.1f} us = {100 * per_step_us / (p * 1e6):.3f}% "
          f"of the plain median step (the heartbeat thread itself: ~1 send/s)")


if __name__ == "__main__":
    main()
