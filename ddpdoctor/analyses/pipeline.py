"""INTERIM (replaced by the analyze work): per-rank steps and step times straight from the traces."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def analyze_run(run: RunDir) -> Report:
    ranks = []
    for path in run.trace_files():
        data = json.loads(gzip.open(path).read() if path.suffix == ".gz" else Path(path).read_text())
        steps = [e for e in data["traceEvents"] if _STEP.match(str(e.get("name", ""))) and e.get("ph") == "X"]
        durs = [float(e["dur"]) for e in steps]
        ranks.append({
            "rank": data.get("distributedInfo", {}).get("rank"),
            "steps": sorted(int(_STEP.match(e["name"]).group(1)) for e in steps),
            "step_time_us": {"median": statistics.median(durs) if durs else None},
        })
    return Report(command="analyze", sections={"ranks": ranks})
