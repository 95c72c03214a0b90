"""A 1,024-rank run directory for the views of big jobs, built in about a second: the real analysis of a
recorded 2-rank gloo run (tests/fixtures/analyze/gloo_2rank_mlp), its ranks repeated to 1,024 with step times set
by hand, and every rank's trace a hard link to a copy of the recorded trace of its parity (symbolic links are refused,
hard links are plain files). The ranks, by median step time against the recorded one:
  - 0-895: within +-2% (typical);
  - 896-1023 (the last 16 nodes of 8): 10% slower (a class "5-15% slower");
  - 513: 60% slower, and the report's straggler."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.reports.analyze import assemble

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "analyze" / "gloo_2rank_mlp"
RANKS = 1024
STRAGGLER = 513
SLOW_CLASS = range(896, 1024)


def factor(rank: int) -> float:
    """The rank's step time as a multiple of the recorded one."""
    if rank == STRAGGLER:
        return 1.6
    if rank in SLOW_CLASS:
        return 1.10
    return 1.0 + ((rank * 37) % 9 - 4) / 200.0  # -2% .. +2%, deterministic


def _scaled(entry: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    out = copy.deepcopy(entry)
    f = factor(rank)
    out["rank"], out["world_size"] = rank, world
    out["step_time_us"] = {k: (v * f if isinstance(v, (int, float)) else v) for k, v in out["step_time_us"].items()}
    for step in out.get("per_step") or []:
        step["dur_us"] = step["dur_us"] * f
    return out


def big_run(dest: Path, ranks: int = RANKS) -> Path:
    """A run directory (report.json and traces/) of ``ranks`` ranks under ``dest``."""
    data = assemble(analyze_paths([FIXTURE])).to_json()
    recorded = sorted(data["ranks"], key=lambda r: r["rank"])
    sources = sorted((FIXTURE / "traces").glob("rank*.pt.trace.json.gz"))
    traces = dest / "traces"
    traces.mkdir(parents=True, mode=0o700)
    data["ranks"] = [_scaled(recorded[r % len(recorded)], r, ranks) for r in range(ranks)]
    data["inputs"] = []
    # One copy of each recorded trace inside dest, and every rank's file a hard link to its copy (never to the
    # repo's fixture itself, which a link would let a test change).
    copies = [shutil.copyfile(src, dest / f"source{i}.trace.json.gz") for i, src in enumerate(sources)]
    for r in range(ranks):
        path = traces / f"rank{r}.pt.trace.json.gz"
        try:
            os.link(copies[r % len(copies)], path)
        except OSError:  # a file system without hard links: a copy
            shutil.copyfile(copies[r % len(copies)], path)
        data["inputs"].append({"path": str(path), "rank": r, "rank_source": "filename", "device": "cpu",
                               "events": 1})
    data["stragglers"] = {**data.get("stragglers", {}), "ranks": [STRAGGLER]}
    data["clock_offsets_us"] = {str(r): 0.0 for r in range(ranks)}
    (dest / "report.json").write_text(json.dumps(data))
    return dest
