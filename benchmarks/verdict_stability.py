"""How stable are profile's verdicts? Profile one script N times and print how often the verdicts agree.

A verdict is the report's status plus the set of finding ids. Agreement is the share of runs whose verdict equals
the most common one (1.0: every run said the same).

    python benchmarks/verdict_stability.py tests/scenarios/healthy.py --runs 5 [-- extra profile flags]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def verdict(report: dict) -> tuple[str, tuple[str, ...]]:
    return report.get("status", "?"), tuple(sorted({f["id"] for f in report.get("findings", [])}))


def profile_once(script: Path, out: Path, flags: list[str]) -> dict:
    cmd = [sys.executable, "-m", "ddpdoctor", "profile", "--nproc-per-node", "2", "--out", str(out), "--overwrite",
           "-q", "--json", "--fail-on", "none", *flags, script.name]
    res = subprocess.run(cmd, cwd=script.parent, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    try:
        return json.loads(res.stdout)
    except ValueError:
        return {"status": f"exit {res.returncode}", "findings": []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("script", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args, extra = ap.parse_known_args()
    args.flags = [a for a in extra if a != "--"]  # extra profile flags, e.g. -- --active 10
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            v = verdict(profile_once(args.script.resolve(), Path(tmp) / f"run{i}", args.flags))
            verdicts.append(v)
            print(f"run {i + 1}: {v[0]:8s} {', '.join(v[1]) or '-'}", flush=True)
    counts = collections.Counter(verdicts)
    top, n = counts.most_common(1)[0]
    print(f"agreement: {n}/{len(verdicts)} = {n / len(verdicts):.2f} (most common: {top[0]}, {', '.join(top[1]) or '-'})")
    statuses = collections.Counter(v[0] for v in verdicts)
    print(f"status agreement: {statuses.most_common(1)[0][1]}/{len(verdicts)}; statuses: {dict(statuses)}")


if __name__ == "__main__":
    main()
