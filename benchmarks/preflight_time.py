"""How long a 2-rank CPU preflight takes, against its peer: a bare torchrun launch of a script that only joins a
gloo process group (the start-up cost no preflight can avoid). Prints seconds and the ratio; asserts nothing.

    python benchmarks/preflight_time.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
PEER = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    return time.perf_counter() - started, proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        peer = Path(tmp) / "peer.py"
        peer.write_text(PEER)
        pre, bare, inside = [], [], []
        for i in range(args.repeat):
            t, proc = _timed([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              str(peer)])
            bare.append(t)
            out = Path(tmp) / f"run{i}"
            t, proc = _timed([sys.executable, "-m", "ddpdoctor", "preflight", "--nproc-per-node", "2", "--out",
                              str(out), "--json"])
            pre.append(t)
            rec = json.loads((out / "ranks" / "rank0" / "preflight.json").read_text())
            inside.append(sum(c.get("seconds", 0.0) for c in rec["checks"].values()))
            if proc.returncode not in (0, 1):
                print(proc.stderr[-2000:], file=sys.stderr)
    print(f"bare torchrun + gloo init (2 ranks): median {median(bare):.2f} s  {[round(x, 2) for x in bare]}")
    print(f"ddpdoctor preflight (2 ranks, CPU):  median {median(pre):.2f} s  {[round(x, 2) for x in pre]}")
    print(f"  of which the checks inside rank 0:  median {median(inside):.2f} s")
    print(f"ratio preflight / bare launch: {median(pre) / median(bare):.2f}")


if __name__ == "__main__":
    main()
