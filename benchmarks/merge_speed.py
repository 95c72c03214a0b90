"""Speed and memory of `--merge` against the analysis of the same traces (issue 17.3: merge <= 2x the analysis
time, peak memory <= 2x the largest trace).

    python benchmarks/merge_speed.py [--mb 110]

Builds two ~MB-sized uncompressed traces (rank0, rank1) under benchmarks/out/merge-2rank/ from time-shifted copies
of the 2-rank gloo fixture (benchmarks/analyze_speed.py's builder), then runs, each in a fresh process whose peak
RSS comes from os.wait4:
  1. `python -m ddpdoctor analyze DIR --json --workers 1` (the analysis of both traces, one process);
  2. the merge alone of the same two traces into merged.json.gz, with the analysis's clock offsets;
  3. `python -m ddpdoctor analyze DIR --merge merged.json.gz` end to end.
Prints times, ratios and peak RSS / largest trace. Nothing asserts: timings are noisy on a shared machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_speed import DEFAULT_SOURCE, OUT, build, measure  # noqa: E402

MERGE = """
import json, sys, time
from pathlib import Path
from ddpdoctor.renderers.merge import merge_traces
t = time.perf_counter()
offsets = json.loads(sys.argv[3])
merge_traces(sorted(Path(sys.argv[1]).glob("rank*.pt.trace.json")), Path(sys.argv[2]), offsets)
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=110.0)
    args = ap.parse_args()
    folder = OUT / "merge-2rank"
    for rank in (0, 1):
        dest = folder / f"rank{rank}.pt.trace.json"
        if not dest.exists() or dest.stat().st_size < args.mb * 1e6:
            build(sorted(DEFAULT_SOURCE.glob(f"rank{rank}.*"))[0], args.mb, dest)
    sizes = [p.stat().st_size / 1e6 for p in sorted(folder.glob("rank*.pt.trace.json"))]
    largest = max(sizes)
    py = sys.executable
    print(f"traces: {folder} ({' + '.join(f'{s:.1f}' for s in sizes)} MB, uncompressed)")

    an_wall, an_rss, out = measure([py, "-m", "ddpdoctor", "analyze", str(folder), "--json", "--workers", "1"])
    offsets = json.loads(out).get("clock_offsets_us") or {}
    print(f"analyze (both traces, 1 worker): {an_wall:6.2f} s  peak RSS {an_rss:6.0f} MB")

    merged = folder.parent / "merge-2rank.merged.json.gz"
    mg_wall, mg_rss, out = measure([py, "-c", MERGE, str(folder), str(merged), json.dumps(offsets)])
    print(f"merge alone: {mg_wall:6.2f} s (in-process {float(out.strip()):.2f} s)  peak RSS {mg_rss:6.0f} MB "
          f"({mg_rss / largest:.2f}x the largest trace; target <= 2x)  -> {merged.stat().st_size / 1e6:.1f} MB gz")
    print(f"  merge / analysis time: {mg_wall / an_wall:.2f}x  (target <= 2x)")

    e2e_wall, e2e_rss, _ = measure([py, "-m", "ddpdoctor", "analyze", str(folder), "--merge", str(merged)])
    print(f"analyze --merge end to end: {e2e_wall:6.2f} s  peak RSS {e2e_rss:6.0f} MB")


if __name__ == "__main__":
    main()
