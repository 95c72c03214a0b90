"""Overhead of ddpdoctor's probes on the steps it does not profile: plain torchrun vs `ddpdoctor profile`.

Runs the same 2-rank gloo workload alternately under both launchers (several rounds, same run), drops the
first --skip iterations (start-up, DDP bucket rebuild and the whole profiling window), and prints the
median iteration time of each and their ratio. Usage: python benchmarks/overhead.py [--rounds 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "overhead_workload.py"


def one_run(kind: str, steps: int, tmp: Path, i: int) -> list[float]:
    out = tmp / f"{kind}-{i}.json"
    wl = [str(WORKLOAD), "--steps", str(steps), "--out", str(out)]
    if kind == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *wl]
    else:
        cmd = [sys.executable, "-m", "ddpdoctor", "profile", "--nproc-per-node", "2", "-q",
               "--out", str(tmp / f"run-{i}"), *wl]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE.parent)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20, help="iterations dropped at the start (profiling window is 0-5)")
    args = ap.parse_args()
    per_kind: dict[str, list[float]] = {"torchrun": [], "ddpdoctor": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            for kind in ("torchrun", "ddpdoctor") if i % 2 == 0 else ("ddpdoctor", "torchrun"):
                per_kind[kind] += one_run(kind, args.steps, Path(d), i)[args.skip:]
    plain = statistics.median(per_kind["torchrun"])
    doc = statistics.median(per_kind["ddpdoctor"])
    print(f"iterations measured per launcher: {len(per_kind['torchrun'])}")
    print(f"plain torchrun     median iteration {plain * 1e3:8.3f} ms")
    print(f"ddpdoctor profile  median iteration {doc * 1e3:8.3f} ms  (outside the profiling window)")
    print(f"ratio ddpdoctor/torchrun = {doc / plain:.4f}  (overhead {100 * (doc / plain - 1):+.2f}%)")


if __name__ == "__main__":
    main()
