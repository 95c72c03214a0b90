"""`ddpdoctor analyze` at 16, 128 and 1,024 ranks: time and peak memory, the ratio to HTA where HTA finishes, and
`--merge` at 128 ranks, each measured in a fresh process in the same run.

    python benchmarks/analyze_scale.py [--ranks 16 128 1024] [--hta-ranks 16 128] [--hta-timeout 600]

The jobs are synthetic, built from the bundled sample traces (sample_traces/mlp_gloo_2rank) by
ddpdoctor/traces/synthetic.py: each rank a recorded rank's trace renamed, 8 ranks per host with one clock per host
(shifted 1 ms per host), and one rank (the middle one) 2 ms late at every collective. They are written once under
benchmarks/out/scale-N/. Memory is the peak of the whole process tree (the CLI and its worker processes, summed
RSS sampled every 50 ms from /proc), so parallel workers cannot hide memory. The check that matters, 128 ranks at
most ~10x the cost of 16, is printed as a ratio of CPU seconds measured in this run (wall times are printed too). Nothing asserts: the machine is shared."""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "benchmarks" / "out"
SAMPLE = REPO / "sample_traces" / "mlp_gloo_2rank" / "traces"
LATE_US = 2000.0


def build(ranks: int) -> Path:
    from ddpdoctor.traces import synthetic

    dest = OUT / f"scale-{ranks}"
    if len(list(dest.glob("rank*.pt.trace.json.gz"))) == ranks:
        return dest
    sources = [synthetic.load_doc(p) for p in sorted(SAMPLE.glob("rank*.pt.trace.json.gz"))]
    synthetic.write_job(sources, ranks, dest, slow_rank=ranks // 2 + 1, late_us=LATE_US)
    return dest


def _tree_rss_mb(root: int) -> float:
    """Summed RSS of ``root`` and its descendants, from /proc (MB)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(d))
            rss[int(d)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / 1e6


CPU_S: list[float] = [0.0]  # CPU seconds (user + system) of the last measured process tree


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(argv: list[str], timeout: float | None = None) -> tuple[float, float, str, int]:
    """(wall s, peak summed RSS of the process tree in MB, stdout, exit code) of one fresh process; the CPU seconds
    of it and its workers (reaped children count in RUSAGE_CHILDREN) in CPU_S[0]: on a shared machine, wall time
    measures the load as well, CPU time the work."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        done.set()
        return float("inf"), peak[0], "", -9
    done.set()
    th.join()
    CPU_S[0] = _children_cpu() - cpu0
    return time.perf_counter() - t0, peak[0], out.decode(errors="replace"), proc.returncode


HTA = """
import sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
try:
    r = a.get_comm_comp_overlap(visualize=False)
    print("rows", len(r))
except Exception as exc:
    print("raised", type(exc).__name__, str(exc)[:80])
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 128, 1024])
    ap.add_argument("--hta-ranks", type=int, nargs="*", default=[16, 128])
    ap.add_argument("--hta-timeout", type=float, default=600.0)
    ap.add_argument("--merge-ranks", type=int, default=128)
    args = ap.parse_args()
    py = sys.executable
    compileall.compile_dir(REPO / "ddpdoctor", quiet=1)  # as pip install does (benchmarks/analyze_speed.py says why)
    usable = len(os.sched_getaffinity(0))
    print(f"machine: {os.cpu_count()} cores, {usable} usable (analyze's workers), load {os.getloadavg()[0]:.1f}")
    results: dict[int, tuple[float, float]] = {}
    for n in args.ranks:
        t = time.perf_counter()
        folder = build(n)
        built = time.perf_counter() - t
        size = sum(p.stat().st_size for p in folder.glob("*.gz")) / 1e6
        wall, rss, out, rc = measure([py, "-m", "ddpdoctor", "analyze", str(folder), "--json"])
        cpu = CPU_S[0]
        doc = json.loads(out) if out.strip() else {}
        stragglers = (doc.get("stragglers") or {}).get("ranks")
        results[n] = (cpu, rss)
        print(f"{n:5d} ranks ({size:6.1f} MB gz, built in {built:5.1f} s): analyze {wall:7.2f} s wall, {cpu:7.2f} "
              f"CPU s, peak memory {rss:5.0f} MB (process tree), exit {rc}, ranks analysed "
              f"{len(doc.get('ranks') or [])}, straggler(s) {stragglers} (made late: {n // 2 + 1})")
        if n in args.hta_ranks:
            hwall, hrss, hout, hrc = measure([py, "-c", HTA, str(folder)], timeout=args.hta_timeout)
            lines = hout.strip().splitlines()
            what = f"did not finish in {args.hta_timeout:.0f} s" if hrc == -9 else " ".join(lines[:-1])[:90]
            ratio = (f"{hwall / wall:.1f}x ddpdoctor's wall time, {CPU_S[0] / cpu:.1f}x its CPU time" if hrc != -9
                     else "-")
            print(f"      HTA TraceAnalysis + get_comm_comp_overlap: {hwall:7.2f} s wall, {CPU_S[0]:7.2f} CPU s, "
                  f"peak {hrss:5.0f} MB: {ratio}; {what}")
        if n == args.merge_ranks:
            merged = OUT / f"scale-{n}-merged.json.gz"
            mwall, mrss, _, mrc = measure([py, "-m", "ddpdoctor", "analyze", str(folder), "--merge", str(merged)])
            print(f"      analyze --merge: {mwall:7.2f} s, peak {mrss:7.0f} MB, exit {mrc}, "
                  f"{merged.stat().st_size / 1e6 if merged.exists() else 0:.1f} MB written")
    sizes = sorted(results)
    for a, b in zip(sizes, sizes[1:], strict=False):
        (ta, ma), (tb, mb) = results[a], results[b]
        print(f"{b} vs {a} ranks ({b / a:g}x the ranks): {tb / ta:.1f}x the CPU time, {mb / ma:.1f}x the peak "
              "memory")


if __name__ == "__main__":
    main()
