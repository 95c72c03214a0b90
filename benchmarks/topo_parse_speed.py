"""Parse speed of `ddpdoctor topo` on a synthetic NCCL log, against reading the same file's lines (the floor).

Prints lines/s and the ratio parse/readlines for growing sizes, to show the parser stays linear.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpdoctor.topo.diagnose import diagnose, read_inputs  # noqa: E402

TEMPLATE = [
    "[rank{r}]:node{n}:{pid}:{pid} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {p}[{pd}] via P2P/CUMEM/read",
    "[rank{r}]:node{n}:{pid}:{pid} [{d}] NCCL INFO Channel {c:02d}/0 : {r}[{d}] -> {q}[{d}] [send] via NET/IB/{d}/GDRDMA",
    "[rank{r}]:epoch 3 step {c} loss 0.123 lr 1e-4",
    "[rank{r}]:node{n}:{pid}:{pid} [{d}] NCCL INFO comm 0x1 rank {r} nRanks 1024 nNodes 128 localRanks 8 localRank {d} MNNVL 0",
]


def make(path: Path, n_lines: int) -> None:
    with path.open("w") as fh:
        for i in range(n_lines):
            r = i % 1024
            n, d = r // 8, r % 8
            fh.write(TEMPLATE[i % 4].format(r=r, n=n, d=d, pid=1000 + r, c=i % 32, p=n * 8 + (d + 1) % 8,
                                            pd=(d + 1) % 8, q=(r + 8) % 1024) + "\n")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for n in (50_000, 200_000, 800_000):
            path = Path(tmp) / f"log{n}.txt"
            make(path, n)
            t0 = time.perf_counter()
            sum(1 for _ in path.read_text().splitlines())
            floor = time.perf_counter() - t0
            t0 = time.perf_counter()
            inputs = read_inputs([path], [])
            sections, findings = diagnose(inputs.log, inputs.systems)
            took = time.perf_counter() - t0
            print(f"{n:>8} lines: parse+diagnose {took:6.2f}s ({n / took:9.0f} lines/s), "
                  f"readlines {floor:5.3f}s, ratio {took / floor:6.1f}x, nodes={sections['summary']['nodes']}")


if __name__ == "__main__":
    main()
