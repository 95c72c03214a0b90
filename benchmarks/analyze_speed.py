"""Speed and memory of `ddpdoctor analyze` on a >= 100 MB trace, against HTA and orjson measured in the same run.

    python benchmarks/analyze_speed.py [--mb 110] [--source TRACE] [--skip-hta] [--repeat N]
    python benchmarks/analyze_speed.py --trace FILE [--skip-hta] [--repeat N]   (an existing trace, as it is; HTA
                                                                                reads the folder it is in)

Builds benchmarks/out/big-SOURCE/rank0.pt.trace.json (uncompressed) from time-shifted copies of a recorded CPU trace
(default: the 2-rank gloo fixture of the tests; each copy's ProfilerSteps renumbered), then runs, each in a fresh
process whose peak RSS comes from os.wait4:
  1. `python -m ddpdoctor analyze FILE --json` end to end (interpreter start included);
  2. HTA: TraceAnalysis(trace_dir) + get_comm_comp_overlap() (HTA's own worker processes included in its time);
  3. orjson.loads of the same bytes with the garbage collector off (parse only, the floor for any JSON reader);
  4. ddpdoctor's own read, decode, classification and per-rank analysis of the file, in CPU seconds (MB/s per core),
     in one process and as analyze reads one big trace: cut into byte ranges decoded by one process per usable core
     (their CPU seconds included).
Prints the times, ratios and peak RSS / file size. Nothing here asserts: timings are noisy on a shared machine.

ddpdoctor's own modules are byte-compiled first, as `pip install` does and as HTA's installed modules are: in an
editable install run under PYTHONDONTWRITEBYTECODE=1 every run would otherwise compile ~300 modules from source,
a start-up cost no installed copy pays."""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
DEFAULT_SOURCE = REPO / "tests" / "fixtures" / "analyze" / "gloo_2rank_mlp" / "traces"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def build(source: Path, target_mb: float, dest: Path) -> Path:
    """Concatenate shifted copies of one trace's events until the file reaches target_mb."""
    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 100.0
    # Timestamps stay as the profiler wrote them: integer microseconds (older Kineto, as in the A100 sample) shift by
    # an integer span and stay integers; a shift that made them "1661203462598509.0" would give every copy a
    # 17-digit decimal no profiler writes, which JSON readers parse on their slow, exact path.
    integral = all(isinstance(e.get("ts", 0), int) for e in events)
    if integral:
        span = math.ceil(span)
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    nsteps = max((int(m.group(1)) for e in body if (m := _STEP.match(str(e.get("name", ""))))), default=0) + 1
    per_copy = len(json.dumps(body).encode())
    copies = max(1, int(target_mb * 1e6 / per_copy) + 1)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "w") as fh:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        fh.write(json.dumps(meta)[1:-1])
        for c in range(copies):
            shifted = []
            for e in body:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e2["ts"] + c * span if integral else round(e2["ts"] + c * span, 3)
                if (m := _STEP.match(str(e2.get("name", "")))) is not None:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + c * nsteps}"
                shifted.append(e2)
            fh.write(", " + json.dumps(shifted)[1:-1])
        fh.write("]}")
    return dest


CPU_S: dict[int, float] = {}  # pid -> CPU seconds (user + system) of the process and the children it waited for


def measure(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB of the process tree's largest process, stdout) of one fresh process; its CPU
    seconds (its own and its worker processes') in CPU_S[-1]: on a shared machine, wall time measures the load,
    CPU time the work."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    CPU_S[-1] = usage.ru_utime + usage.ru_stime
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[:4]} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024, out


PARSE = """
import resource, sys, time
from pathlib import Path
from ddpdoctor.analyses.pipeline import usable_cores
from ddpdoctor.traces.loader import load_raw, no_gc
from ddpdoctor.traces.split import load_trace
from ddpdoctor.traces.trace import build_trace
from ddpdoctor.analyses.rank import analyze_trace
path = Path(sys.argv[1])
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
with no_gc():
    t = time.process_time(); raw = load_raw(path); t1 = time.process_time()
    analyze_trace(build_trace(raw)); t2 = time.process_time()
    del raw
    n = usable_cores(); c, w = cpu(), time.perf_counter()
    load_trace(path, workers=n); print(t1 - t, t2 - t, n, cpu() - c, time.perf_counter() - w)
"""


ORJSON = """
import gc, sys, time, orjson
data = open(sys.argv[1], 'rb').read()
gc.disable(); t = time.process_time(); orjson.loads(data); print(time.process_time() - t)
"""
HTA = """
import sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
load = time.perf_counter() - t
try:
    print(a.get_comm_comp_overlap(visualize=False).to_dict("records"))
except Exception as exc:
    print("raised", type(exc).__name__, exc)
print(load, time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=110.0)
    ap.add_argument("--source", type=Path, default=None)
    ap.add_argument("--trace", type=Path, default=None, help="measure this uncompressed trace file as it is")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="run ddpdoctor and HTA this many times, alternating, "
                    "and compare their fastest runs (a shared machine's load comes and goes)")
    args = ap.parse_args()
    source = args.trace or args.source or sorted(DEFAULT_SOURCE.glob("rank0.*"))[0]
    big = args.trace or OUT / f"big-{source.name.split('.')[0]}" / "rank0.pt.trace.json"
    if args.trace is None and (not big.exists() or big.stat().st_size < args.mb * 1e6
                               or big.stat().st_mtime < Path(__file__).stat().st_mtime):
        build(source, args.mb, big)
    size_mb = big.stat().st_size / 1e6
    py = sys.executable
    compileall.compile_dir(REPO / "ddpdoctor", quiet=1)  # into __pycache__ (git-ignored), as pip install does
    print(f"trace: {big} ({size_mb:.1f} MB, {'as it is' if args.trace else 'built from ' + source.name})")

    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}: wall times measure the load too; "
          "CPU seconds (user + system, worker processes included) measure the work")

    dd_wall, dd_rss, out = measure([py, "-m", "ddpdoctor", "analyze", str(big), "--json"])
    dd_cpu = CPU_S[-1]
    hta_runs: list[tuple[float, float, float, str]] = []
    for _ in range(args.repeat - 1):  # the pairs alternate, so both see the same spells of load
        w, r, o = measure([py, "-m", "ddpdoctor", "analyze", str(big), "--json"])
        if w < dd_wall:
            dd_wall, dd_rss, out, dd_cpu = w, r, o, CPU_S[-1]
        if not args.skip_hta:
            w, r, o = measure([py, "-c", HTA, str(big.parent)])
            hta_runs.append((w, r, CPU_S[-1], o))
    if args.repeat > 1:
        print(f"fastest of {args.repeat} runs each (alternating):")
    rank = json.loads(out)["ranks"][0]
    print(f"ddpdoctor analyze (end to end, interpreter start included): {dd_wall:6.2f} s wall, {dd_cpu:6.2f} CPU s "
          f"= {size_mb / dd_cpu:5.0f} MB/s per core; peak RSS {dd_rss:5.0f} MB ({dd_rss / size_mb:.2f}x file); "
          f"steps={rank['steps']} overlap_pct={rank['overlap_pct']:.2f}")
    _, _, out = measure([py, "-c", PARSE, str(big)])
    parse_s, reduce_s, n, split_cpu, split_wall = (float(x) for x in out.split())
    print(f"ddpdoctor read + decode (load_raw): {parse_s:6.2f} CPU s = {size_mb / parse_s:5.0f} MB/s per core; "
          f"with classification and the rank's analysis: {reduce_s:6.2f} CPU s = {size_mb / reduce_s:5.0f} MB/s per "
          "core (target >= 150)")
    print(f"  the same trace read and classified by {n:.0f} processes (traces/split.py, as analyze does): "
          f"{split_wall:6.2f} s wall, {split_cpu:6.2f} CPU s (workers included) = {size_mb / split_cpu:5.0f} MB/s "
          "per core")

    oj_wall, oj_rss, out = measure([py, "-c", ORJSON, str(big)])
    oj = float(out.strip())
    print(f"orjson.loads, GC off (parse only): {oj:6.2f} CPU s = {size_mb / oj:5.0f} MB/s  (process {oj_wall:.2f} s, "
          f"peak RSS {oj_rss:.0f} MB)")
    print(f"  ddpdoctor's whole analysis / orjson's parse alone: {reduce_s / oj:.2f}x the CPU time")

    if not args.skip_hta:
        hta_wall, hta_rss, out = measure([py, "-c", HTA, str(big.parent)])
        hta_cpu = CPU_S[-1]
        for w, r, c, o in hta_runs:
            if w < hta_wall:
                hta_wall, hta_rss, hta_cpu, out = w, r, c, o
        lines = out.strip().splitlines()
        load_s, total_s = (float(x) for x in lines[-1].split())
        print(f"HTA load + get_comm_comp_overlap: {hta_wall:6.2f} s wall (load {load_s:.2f} s), {hta_cpu:6.2f} CPU s "
              f"= {size_mb / hta_cpu:5.1f} MB/s per core; peak RSS {hta_rss:.0f} MB (largest process); result: "
              f"{' '.join(lines[:-1])[:120]}")
        print(f"  ddpdoctor vs HTA: {hta_wall / dd_wall:.1f}x faster by wall time, {hta_cpu / dd_cpu:.1f}x by CPU "
              "time (target >= 20x)")
    print(f"peak RSS / file size: {dd_rss / size_mb:.2f}  (target <= 3)")


if __name__ == "__main__":
    main()
