"""How fast `ddpdoctor logs` reads a big log, as a ratio to one regex pass over the same text (the floor any
line-oriented parser pays). Prints figures; asserts nothing.

    python benchmarks/logs_parse.py [--lines 300000]
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path

from ddpdoctor.logs.explain import explain_texts

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "logs"


def synthetic_log(n: int, ranks: int = 8) -> str:
    """n interleaved training lines from `ranks` ranks (torchrun --tee prefixes), then a real recorded failure."""
    rnd = random.Random(0)
    lines = [f"[default{i % ranks}]:[rank{i % ranks}]: step {i // ranks} loss {rnd.random():.4f} lr 0.001 "
             f"throughput {rnd.uniform(900, 1100):.1f} samples/s" for i in range(n)]
    return "\n".join(lines) + "\n" + (FIX / "raise_slow_tee.log").read_text()


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=300_000)
    args = ap.parse_args()
    text = synthetic_log(args.lines)
    peer = re.compile(r"Traceback|WorkNCCL|Detected mismatch|Timed out waiting")
    t_peer = best_of(lambda: [peer.search(line) for line in text.splitlines()])
    findings: list = []
    t_ours = best_of(lambda: findings.__setitem__(slice(None), explain_texts({"big.log": text})))
    mb = len(text.encode()) / 2**20
    print(f"log: {args.lines} lines, {mb:.1f} MiB; findings: {[f.id for f in findings]}")
    print(f"one-regex scan (peer): {t_peer:.2f} s  ({mb / t_peer:.0f} MiB/s)")
    print(f"ddpdoctor logs:        {t_ours:.2f} s  ({mb / t_ours:.0f} MiB/s)  ratio {t_ours / t_peer:.1f}x the peer")


if __name__ == "__main__":
    main()
