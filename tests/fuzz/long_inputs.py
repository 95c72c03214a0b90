"""The issue-26 inputs at their full size, written to disk as a stream (never whole in memory), and the real CLI run
on each untraced, with its wall time and peak memory (tests/fuzz/README.md, "Full size").

The traced growth tests (test_fuzz_growth.py) show the growth on deterministic counts at sizes a tracer can reach;
these are the sizes the issue reported hanging, run as a user runs them:

* ``analyze`` on one rank's trace of 200,000 ProfilerSteps (item 6; the traced test stops at 50,000);
* ``topo`` on an NCCL log with one 108 KB line (item 7);
* ``logs`` on a 2,000,000-line, ~130 MB log ending in a real failure (item 8).

    python -m tests.fuzz.long_inputs            # the full sizes: prints time and peak memory of each
    python -m tests.fuzz.long_inputs --small    # the CI sizes (seconds)
    python -m tests.fuzz.long_inputs analyze --steps=50000    # one command, one size changed"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[2]
FAILURE_LOG = REPO / "tests" / "fixtures" / "logs" / "raise.log"
NCCL_LOG = REPO / "tests" / "fixtures" / "nccl" / "h100_forced_nvls_few_channels.log"

FULL = {"steps": 200_000, "line_bytes": 108_000, "log_lines": 2_000_000}
SMALL = {"steps": 2_000, "line_bytes": 2_000, "log_lines": 20_000}


def _event(name: str, ts: float, dur: float, tid: int = 10, cat: str = "cpu_op", **args: object) -> str:
    return json.dumps({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": round(ts, 3),
                       "dur": round(dur, 3), "args": args}, separators=(",", ":"))


def write_many_steps_trace(path: Path, steps: int, rank: int = 0, world: int = 2) -> Path:
    """A gloo rank's trace of ``steps`` ProfilerSteps (the shape of tests/fuzz/test_fuzz_growth.py's ``_trace``: a
    slow warm-up, then step times that vary by up to 40 %), written event by event."""
    rnd = random.Random(rank)
    with open(path, "w") as f:
        info = {"backend": "gloo", "rank": rank, "world_size": world,
                "pg_config": [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]}
        f.write(json.dumps({"schemaVersion": 1, "host_name": "h", "distributedInfo": info})[:-1] + ',"traceEvents":[')
        f.write('{"ph":"M","name":"thread_name","pid":1,"tid":10,"args":{"name":"thread 10 (python)"}},'
                '{"ph":"M","name":"thread_name","pid":1,"tid":20,"args":{"name":"thread 20 (pt_gloo_runloop)"}}')
        base = 0.0
        for s in range(steps):
            d = 100 + rnd.random() * 40 + (300 if s < 5 else 0)
            k = d / 100
            ev = [
                _event(f"ProfilerStep#{s + 1}", base, d, cat="user_annotation"),
                _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 5 * k,
                       cat="user_annotation"),
                _event("DistributedDataParallel.forward", base + 5 * k, 25 * k, cat="user_annotation"),
                _event("autograd::engine::evaluate_function: AddmmBackward0", base + 30 * k, 30 * k),
                _event("torch::autograd::AccumulateGrad", base + 50 * k, 5 * k, **{"Input Dims": [[10]]}),
                _event("c10d::allreduce_", base + 55 * k, 1, **{"Input Dims": [[[100]], []]}),
                _event("gloo:all_reduce", base + 56 * k, 24 * k, tid=20, cat="user_annotation",
                       **{"Input Dims": [[100]], "Input type": ["float"]}),
                _event("Optimizer.step#SGD.step", base + 85 * k, 10 * k, cat="user_annotation"),
            ]
            f.write("," + ",".join(ev))
            base += d
        f.write("]}")
    return path


def write_long_nccl_line(path: Path, line_bytes: int) -> Path:
    """A real NCCL_DEBUG=INFO log followed by one channel line of ``line_bytes`` bytes."""
    head = "h100-a:9001:9030 [0] NCCL INFO Channel 00/04 : "
    body = " ".join(str(i % 8) for i in range(max(1, (line_bytes - len(head)) // 2)))
    path.write_text(NCCL_LOG.read_text() + head + body[: max(0, line_bytes - len(head))] + "\n")
    return path


def write_many_lines_log(path: Path, lines: int) -> Path:
    """``lines`` lines of two ranks' training output (~65 bytes each), then a real failure (raise.log)."""
    with open(path, "w") as f:
        chunk: list[str] = []
        for i in range(lines):
            chunk.append(f"[default{i % 2}]:[rank{i % 2}]: step {i} loss {1 / (i + 1):.6f} lr 0.1 grad_norm "
                         f"1.{i % 997:03d}\n")
            if len(chunk) == 10_000:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))
        f.write(FAILURE_LOG.read_text())
    return path


@dataclass
class Figure:
    label: str
    input_bytes: int
    make_s: float
    wall_s: float
    cpu_s: float  # user + system of the command (and its workers): what a loaded machine does not inflate
    peak_rss_mb: float
    exit_code: int
    status: str | None  # the report's status word (None: no JSON came back)

    def line(self) -> str:
        return (f"{self.label:<34} input {self.input_bytes / 1e6:8.1f} MB  wall {self.wall_s:7.1f} s  cpu "
                f"{self.cpu_s:7.1f} s  peak "
                f"{self.peak_rss_mb:7.0f} MB  exit {self.exit_code}  status {self.status}  (generated in "
                f"{self.make_s:.1f} s)")


def run_cli(args: list[str], timeout: float) -> tuple[int, str | None, float, float, float]:
    """One `python -m ddpdoctor ARGS` in a child of its own: exit code, the report's status word (None: no JSON came
    back), wall s, CPU s, the peak RSS (MB). The report (300 MB at 200,000 steps) goes to a file, read once for its
    status: this process never holds it as text, so `/usr/bin/time -v` of this harness shows the command's peak."""
    # A fresh child per run: RUSAGE_CHILDREN's maxrss is the largest of all children so far, so measure through
    # a wrapper that reports only its own child's figure.
    wrapper = ("import resource,subprocess,sys,time;t=time.time();p=subprocess.run(sys.argv[1:]);"
               "w=time.time()-t;u=resource.getrusage(resource.RUSAGE_CHILDREN);"
               "sys.stderr.write(f'\\n@@figures {w} {u.ru_maxrss} {u.ru_utime+u.ru_stime}\\n');sys.exit(p.returncode)")
    with tempfile.TemporaryFile() as out:
        proc = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "ddpdoctor", *args],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=timeout, cwd=REPO)
        out.seek(0)
        status = _status(out.read())
    wall, rss, cpu = 0.0, 0.0, 0.0
    for ln in proc.stderr.splitlines():
        if ln.startswith("@@figures "):
            w, r, c = ln.split()[1:4]
            wall, rss, cpu = float(w), int(r) / 1024, float(c)
    return proc.returncode, status, wall, cpu, rss


class _Status(msgspec.Struct):
    status: object = None


def _status(out: bytes) -> str | None:
    """The report's status word; None when it is not one JSON object (msgspec checks the whole text, and skips
    every field but this one instead of building it)."""
    try:
        return str(msgspec.json.decode(out, type=_Status).status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


CASES: dict[str, tuple[Callable[[Path, dict[str, int]], Path], Callable[[Path], list[str]]]] = {
    "analyze, steps": (
        lambda d, s: write_many_steps_trace(d / "rank0.pt.trace.json", s["steps"]),
        lambda p: ["analyze", "--json", str(p)]),
    "topo, line_bytes": (
        lambda d, s: write_long_nccl_line(d / "nccl.log", s["line_bytes"]),
        lambda p: ["topo", "--json", str(p)]),
    "logs, log_lines": (
        lambda d, s: write_many_lines_log(d / "job.log", s["log_lines"]),
        lambda p: ["logs", "--json", str(p)]),
}


def measure(sizes: dict[str, int], timeout: float = 1800.0, only: str | None = None) -> list[Figure]:
    """Generate each input at ``sizes`` in a temporary folder, run its command, and return the figures."""
    out: list[Figure] = []
    for label, (make, args) in CASES.items():
        if only and only not in label:
            continue
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-long-") as tmp:
            t = time.time()
            path = make(Path(tmp), sizes)
            made = time.time() - t
            code, status, wall, cpu, rss = run_cli(args(path), timeout)
            command, key = label.split(", ")
            out.append(Figure(f"{command}, {key}={sizes[key]:,}", path.stat().st_size, made, wall, cpu, rss, code,
                              status))
    return out


def main() -> None:
    sizes = dict(SMALL if "--small" in sys.argv else FULL)
    for arg in sys.argv[1:]:  # --steps=50000, --log_lines=500000, --line_bytes=27000: one size changed
        key, _, value = arg[2:].partition("=")
        if key in sizes and value.isdigit():
            sizes[key] = int(value)
    only = next((a for a in sys.argv[1:] if not a.startswith("--")), None)
    print(f"sizes: {sizes}  (load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)")
    for fig in measure(sizes, only=only):
        print(fig.line(), flush=True)


if __name__ == "__main__":
    main()
