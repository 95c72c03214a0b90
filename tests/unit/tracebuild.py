"""Tiny hand-built profiler traces for the analyze tests (numbers in docs/metrics.md are worked out from these)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

MAIN, GLOO = 10, 20


def x(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", pid: int = 1, **args: Any) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def meta(tid: int, label: str) -> dict:
    return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": label}}


def cpu_step(base: float, data: float, fwd: tuple, bwd: tuple, acc: tuple, enq: float, comm: tuple, opt: tuple,
             wait: tuple | None = None) -> list[dict]:
    ev = [
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, data, cat="user_annotation"),
        x("DistributedDataParallel.forward", *fwd, cat="user_annotation"),
        x("autograd::engine::evaluate_function: AddmmBackward0", *bwd),
        x("torch::autograd::AccumulateGrad", *acc, **{"Input Dims": [[10]], "Input type": ["float"]}),
        x("c10d::allreduce_", enq, 1, **{"Input Dims": [[[100]], []], "Input type": ["TensorList", ""]}),
        x("gloo:all_reduce", *comm, tid=GLOO, cat="user_annotation", **{"Input Dims": [[100]], "Input type": ["float"]}),
        x("Optimizer.step#SGD.step", *opt, cat="user_annotation"),
    ]
    if wait:
        ev.append(x("aten::_wait_tensor", *wait))
    return ev


def cpu_trace(rank: int = 0, delay: tuple[float, float] = (0.0, 0.0), offset: float = 0.0,
              host: str = "h", dist: bool = True) -> dict:
    """Two ProfilerSteps of a gloo rank. Step 1 [0,100): data [0,5) fwd [5,30) bwd [30,60) comm [56+d,80)
    opt [85,95). Step 2 [100,200): fwd [105,140) bwd [140,170) comm [150+d,190) wait [170,190) opt [190,198)."""
    d1, d2 = delay
    ev = [meta(MAIN, f"thread {MAIN} (python)"), meta(GLOO, f"thread {GLOO} (pt_gloo_runloop)"),
          x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("ProfilerStep#2", 100, 100, cat="user_annotation")]
    ev += cpu_step(0, 5, (5, 25), (30, 30), (50, 5), 55, (56 + d1, 24 - d1), (85, 10))
    ev += cpu_step(100, 0, (105, 35), (140, 30), (160, 5), 149, (150 + d2, 40 - d2), (190, 8), wait=(170, 20))
    for e in ev:
        if "ts" in e:
            e["ts"] += offset
    doc: dict[str, Any] = {"schemaVersion": 1, "host_name": host, "traceEvents": ev}
    if dist:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2,
                                  "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}
    return doc


def gpu_trace(rank: int = 0, kernel_prefix: str = "ncclDevKernel_") -> dict:
    """Two steps [0,100) and [100,200) on the CPU; kernels (launch -> [start,end)):
    gemm 10->[20,50), AllReduce 20->[40,70) (1000 floats, group of 4), memcpy 30->[70,75),
    elementwise 110->[120,160), AllReduce 120->[150,200), AllGather 150->[205,215)."""
    def launch(ts: float, corr: int) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": ts, "dur": 2,
                "args": {"correlation": corr}}

    def kern(name: str, ts: float, dur: float, corr: int, cat: str = "kernel", stream: int = 7, **a: Any) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": stream, "device": 0, **a}}

    ev = [
        x("ProfilerStep#1", 0, 100, tid=2, cat="user_annotation"),
        x("ProfilerStep#2", 100, 100, tid=2, cat="user_annotation"),
        launch(10, 1), launch(20, 2), launch(30, 3), launch(110, 4), launch(120, 5), launch(150, 6),
        kern("void gemm_kernel<float>", 20, 30, 1),
        kern(f"{kernel_prefix}AllReduce_Sum_f32_RING_LL", 40, 30, 2, stream=13, **{
            "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
            "Group size": 4, "Process Group Name": "0"}),
        kern("Memcpy DtoD (Device -> Device)", 70, 5, 3, cat="gpu_memcpy"),
        kern("void elementwise_kernel", 120, 40, 4),
        kern(f"{kernel_prefix}AllReduce_Sum_f32_RING_LL", 150, 50, 5, stream=13),
        kern(f"{kernel_prefix}AllGather_RING_LL", 205, 10, 6, stream=13),
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "hand-built"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4}, "traceEvents": ev}


def write(path: Path, doc: Any, gz: bool | None = None) -> Path:
    data = json.dumps(doc).encode()
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path
