"""Parse speed of `ddpdoctor logs` on a large multi-rank log, in lines/s, and as a ratio to one regex pass over the
same text (the floor any line-oriented parser pays). Prints figures; asserts nothing.

The log: RANKS ranks on NODES nodes (torch >= 2.2 `[rankN]:` prefixes, glog timestamps on the C++ lines, NCCL_DEBUG=INFO
lines, tqdm-like training lines), then rank 5 runs out of memory and every other rank's watchdog times out. Measured
twice: as one file, and as one file per node (merged on their timestamps).

    python benchmarks/logs_parse.py [--lines 400000] [--ranks 16] [--nodes 2]
"""

from __future__ import annotations

import argparse
import random
import re
import time

from ddpdoctor.logs.explain import explain_texts


def synthetic_logs(n: int, ranks: int, nodes: int) -> dict[str, str]:
    rnd = random.Random(0)
    per_node = max(1, ranks // nodes)
    out: dict[str, list[str]] = {f"node{k}.log": [] for k in range(nodes)}
    for i in range(n):
        r = i % ranks
        host = f"gpu-node-{r // per_node:03d}"
        node = out[f"node{min(r // per_node, nodes - 1)}.log"]
        second = i // ranks
        kind = i % 10
        if kind == 0:
            node.append(f"{host}:{4000 + r}:{4100 + r} [{r % per_node}] NCCL INFO Channel {second % 32:02d}/0 : "
                        f"{r}[{r % per_node}] -> {(r + 1) % ranks}[{(r + 1) % per_node}] via P2P/CUMEM/read")
        elif kind == 1:
            node.append(f"[rank{r}]:[I1122 10:{second // 60 % 60:02d}:{second % 60:02d}.{i % 1000:03d}000 "
                        f"ProcessGroupNCCL.cpp:912] [PG ID 0 PG GUID 0(default_pg) Rank {r}] ProcessGroupNCCL "
                        f"heartbeat ok")
        else:
            node.append(f"[rank{r}]: step {second} loss {rnd.random():.4f} lr 0.001 throughput "
                        f"{rnd.uniform(900, 1100):.1f} samples/s")
    culprit = 5 % ranks
    out[f"node{min(culprit // per_node, nodes - 1)}.log"] += [
        f"[rank{culprit}]: Traceback (most recent call last):",
        f'[rank{culprit}]:   File "/job/train.py", line 212, in <module>',
        f"[rank{culprit}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU "
        f"{culprit % per_node} has a total capacity of 79.15 GiB of which 1.02 GiB is free."]
    for r in range(ranks):
        if r != culprit:
            out[f"node{min(r // per_node, nodes - 1)}.log"].append(
                f"[rank{r}]:[E1122 11:10:00.{r:03d}000000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
                f"collective operation timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                f"Timeout(ms)=600000) ran for 600031 milliseconds before timing out.")
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def best_of(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    per_node = synthetic_logs(args.lines, args.ranks, args.nodes)
    one = {"job.log": "".join(per_node.values())}
    n_lines = one["job.log"].count("\n")
    mb = len(one["job.log"].encode()) / 2**20
    peer = re.compile(r"Traceback|WorkNCCL|Detected mismatch|Timed out waiting|NCCL WARN")
    t_peer = best_of(lambda: [peer.search(line) for line in one["job.log"].splitlines()], args.repeat)
    findings: list = []
    t_one = best_of(lambda: findings.__setitem__(slice(None), explain_texts(one)), args.repeat)
    summary = [(f.id, f.ranks[:4]) for f in findings]
    t_nodes = best_of(lambda: explain_texts(per_node), args.repeat)
    print(f"log: {n_lines} lines, {mb:.1f} MiB, {args.ranks} ranks on {args.nodes} nodes; findings: {summary}")
    print(f"one-regex scan (floor):       {t_peer:.2f} s  {n_lines / t_peer:,.0f} lines/s")
    print(f"ddpdoctor logs, one file:     {t_one:.2f} s  {n_lines / t_one:,.0f} lines/s  ({mb / t_one:.1f} MiB/s, "
          f"{t_one / t_peer:.1f}x the floor)")
    print(f"ddpdoctor logs, {args.nodes} node files: {t_nodes:.2f} s  {n_lines / t_nodes:,.0f} lines/s")


if __name__ == "__main__":
    main()
