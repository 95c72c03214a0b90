"""The checks that run over the process group, inside every rank: correctness, latency, bandwidth, compute, clocks.

Each returns {"status", "summary", "evidence"} for this rank; ddpdoctor.preflight.merge compares the ranks."""

from __future__ import annotations

import time
from typing import TypedDict

import torch
import torch.distributed as dist

from ddpdoctor.preflight.checks import FAIL, PASS, SKIPPED
from ddpdoctor.preflight.nccltable import make_row, sweep_sizes
from ddpdoctor.preflight.record import CheckOutcome

ELEMENTS = 1031  # an odd length, so a bug that drops a tail or a chunk shows up


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> Mismatch | None:
    if torch.equal(got.cpu(), want.cpu()):
        return None
    bad = (got.cpu() != want.cpu()).nonzero()
    i = tuple(int(x) for x in bad[0])
    return {"index": list(i), "got": float(got.cpu()[i]), "expected": float(want.cpu()[i]), "wrong": int(bad.shape[0])}


class Mismatch(TypedDict, total=False):
    """The first wrong element of a collective's output: where, what came, what was due, how many are wrong."""

    index: list[int]
    got: float
    expected: float
    wrong: int
    slot: int  # all_gather: whose slot


def collectives(device: torch.device) -> CheckOutcome:
    """all_reduce, all_gather, broadcast and reduce_scatter with values each rank can predict, checked here."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ar = torch.arange(ELEMENTS, dtype=torch.float32, device=device)
    results: dict[str, Mismatch | None] = {}
    skipped: dict[str, str] = {}

    # all_reduce(sum) of (arange + rank + 1): arange * n + n(n+1)/2
    t = ar + (rank + 1)
    dist.all_reduce(t)
    results["all_reduce"] = _first_mismatch(t, ar * n + n * (n + 1) / 2)

    # all_gather: slot r holds arange + 1000 r
    outs = [torch.empty_like(ar) for _ in range(n)]
    dist.all_gather(outs, ar + 1000 * rank)
    gathered: Mismatch | None = None
    for r, o in enumerate(outs):
        if m := _first_mismatch(o, ar + 1000 * r):
            gathered = {**m, "slot": r}
            break
    results["all_gather"] = gathered

    # broadcast from the last rank (not rank 0, so a path other than the usual root is exercised)
    src = n - 1
    t = ar * 3 + 7 if rank == src else torch.full_like(ar, -1)
    dist.broadcast(t, src=src)
    results["broadcast"] = _first_mismatch(t, ar * 3 + 7)

    # reduce_scatter: rank i sends chunk j = arange + 100 i + j; rank r gets sum_i (arange + 100 i + r)
    inp = torch.cat([ar + 100 * rank + j for j in range(n)])
    out = torch.empty_like(ar)
    try:
        dist.reduce_scatter_tensor(out, inp)
        results["reduce_scatter"] = _first_mismatch(out, ar * n + 100 * n * (n - 1) / 2 + n * rank)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        if "not supported" not in str(exc).lower() and "not implemented" not in str(exc).lower():
            raise
        skipped["reduce_scatter"] = f"{dist.get_backend()} does not implement it here: {str(exc).splitlines()[0][:200]}"
    _sync(device)
    wrong = {op: m for op, m in results.items() if m is not None}
    evidence = {"ops_checked": sorted(results), "elements": ELEMENTS, "world_size": n, "mismatches": wrong,
                "skipped_ops": skipped}
    if wrong:
        return {"status": FAIL, "summary": "wrong values from " + ", ".join(sorted(wrong)), "evidence": evidence}
    summary = f"{len(results)} collectives correct" + (f" ({', '.join(skipped)} skipped)" if skipped else "")
    return {"status": PASS, "summary": summary, "evidence": evidence}


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(x) for x in t.cpu()]


def allreduce_latency(device: torch.device, max_latency_us: float | None, iters: int = 50) -> CheckOutcome:
    """Mean time of a one-element all_reduce (the slowest rank's), after a warm-up."""
    t = torch.zeros(1, dtype=torch.float32, device=device)
    for _ in range(5):
        dist.all_reduce(t)
    _sync(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    _sync(device)
    mine = (time.perf_counter() - started) / iters * 1e6
    latency = _max_over_ranks([mine], device)[0]
    evidence = {"latency_us": round(latency, 2), "bytes": 4, "iters": iters, "max_latency_us": max_latency_us}
    if max_latency_us is not None and latency > float(max_latency_us):
        return {"status": FAIL, "summary": f"{latency:.0f} us > {float(max_latency_us):g} us", "evidence": evidence}
    return {"status": PASS, "summary": f"{latency:.1f} us per 4-byte all_reduce", "evidence": evidence}


def _iters(size: int) -> int:
    # Enough repetitions to average out jitter on small messages, 2 on the big ones to stay within a minute.
    return max(2, min(20, (16 << 20) // size))


def bandwidth_sweep(device: torch.device, max_size: int, min_size: int = 1024) -> CheckOutcome:
    """nccl-tests' all_reduce_perf, out of place: per size the mean time of the slowest rank, algbw and busbw.

    The comparison with --min-busbw happens in the parent (merge), which knows the threshold."""
    n = dist.get_world_size()
    sizes = sweep_sizes(min_size, max(min_size, max_size))
    times: list[float] = []
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up: connections and buffers for this size
        _sync(device)
        dist.barrier()
        k = _iters(size)
        started = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(buf)
        _sync(device)
        times.append((time.perf_counter() - started) / k * 1e6)
        del buf
    slowest = _max_over_ranks(times, device)
    rows = [make_row(s, t, n) for s, t in zip(sizes, slowest, strict=True)]
    table = [{**r.__dict__, "time_us": round(r.time_us, 2), "algbw_gbps": round(r.algbw_gbps, 4),
              "busbw_gbps": round(r.busbw_gbps, 4)} for r in rows]
    evidence = {"world_size": n, "rows": table, "time_is": "mean per iteration, slowest rank"}
    return {"status": PASS, "summary": f"{len(rows)} sizes measured", "evidence": evidence}


def compute(device: torch.device, blocks: int = 5) -> CheckOutcome:
    """Matmul throughput of this rank: best of ``blocks`` timed blocks (best-of hides one-off jitter)."""
    if device.type == "cuda":
        return _compute(device, 4096, torch.float16, 10, blocks)
    # On CPU one thread per rank: ranks of a host share its cores, and each rank's default thread pool would make
    # them fight (oversubscription), which shows up as a "slow rank" that is only contention. Per-core speed is
    # what distinguishes a bad host.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compute(device, 256, torch.float32, 10, blocks)
    finally:
        torch.set_num_threads(threads)


def _compute(device: torch.device, dim: int, dtype: torch.dtype, per_block: int, blocks: int) -> CheckOutcome:
    a = torch.randn(dim, dim, dtype=dtype, device=device)
    b = torch.randn(dim, dim, dtype=dtype, device=device)
    torch.matmul(a, b)
    _sync(device)
    dist.barrier()  # every rank computes at the same time, as in training
    best = float("inf")
    for _ in range(blocks):
        started = time.perf_counter()
        for _ in range(per_block):
            torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    gflops = 2 * dim**3 * per_block / best / 1e9
    evidence = {"gflops": round(gflops, 2), "dim": dim, "dtype": str(dtype).replace("torch.", ""),
                "matmuls_per_block": per_block, "blocks": blocks, "best_block_s": round(best, 6)}
    return {"status": PASS, "summary": f"{gflops:.1f} GFLOP/s", "evidence": evidence}


def clock_skew(device: torch.device, rounds: int = 5) -> CheckOutcome:
    """Rank 0 exchanges time.time() with every rank: offset = t_peer - (t_send + t_back) / 2, from the round with
    the shortest round trip (its error is at most half that round trip)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(1, dtype=torch.float64, device=device)
    offsets: dict[str, dict[str, float]] = {}
    for peer in range(1, n):
        if rank == 0:
            best: tuple[float, float] | None = None
            for _ in range(rounds):
                t0 = time.time()
                dist.send(torch.tensor([t0], dtype=torch.float64, device=device), dst=peer)
                dist.recv(buf, src=peer)
                t1 = time.time()
                rtt, offset = t1 - t0, float(buf.item()) - (t0 + t1) / 2
                if best is None or rtt < best[0]:
                    best = (rtt, offset)
            assert best is not None
            offsets[str(peer)] = {"offset_ms": round(best[1] * 1e3, 3), "rtt_ms": round(best[0] * 1e3, 3)}
        elif rank == peer:
            for _ in range(rounds):
                dist.recv(buf, src=0)
                dist.send(torch.tensor([time.time()], dtype=torch.float64, device=device), dst=0)
    if rank != 0:
        return {"status": SKIPPED, "summary": "measured by rank 0", "evidence": {}}
    if n == 1:
        return {"status": PASS, "summary": "one rank: nothing to compare", "evidence": {"offsets": {}}}
    worst = max(offsets.items(), key=lambda kv: abs(kv[1]["offset_ms"]))
    return {"status": PASS, "summary": f"max |offset| {abs(worst[1]['offset_ms']):.2f} ms (rank {worst[0]})",
            "evidence": {"offsets": offsets}}


