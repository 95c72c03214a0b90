"""Shared inputs of the view tests: the hand-written analysis sections (ANALYSIS_CONTRACT.md) and findings."""

from __future__ import annotations

import atexit
import copy
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.report import Report

FIXTURES = Path(__file__).parent / "fixtures" / "views"
EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def sections() -> dict[str, Any]:
    """2 ranks x 3 steps, 2 buckets per step; numbers chosen by hand (see tests/fixtures/views/README.md)."""
    return copy.deepcopy(json.loads((FIXTURES / "sections_2rank.json").read_text()))


def findings() -> list[Finding]:
    return [
        Finding("comm.exposed", Severity.WARNING, "Exposed communication is 33% of step time", [0, 1],
                {"exposed_comm_pct": 32.9}, "Overlap more: try bucket_cap_mb=10"),
        Finding("straggler.rank", Severity.ERROR, "Rank 1 arrives last at 5 of 6 collectives", [1],
                {"caused_wait_us": 10600.0}, "Look at rank 1's host: data loading or a slower device"),
    ]


def evil_report() -> Report:
    """Trace-derived strings (op, group, process-group names, finding text) carrying markup."""
    s = sections()
    s["collectives"]["calls"][0]["op"] = EVIL
    s["collectives"]["calls"][1]["group"] = EVIL
    s["collectives"]["by_op"] = {EVIL: {"count": 1, "bytes": 8, "time_us": 10.0}}
    s["collectives"]["matched"][0]["op"] = EVIL
    s["run_dir"] = EVIL
    s["ddp"][0]["module_class"] = EVIL
    fs = findings() + [Finding(EVIL, Severity.INFO, EVIL, [0], {EVIL: EVIL}, EVIL)]
    return Report(command="analyze", sections=s, findings=fs, notes=[EVIL])


@functools.cache
def profiled_run() -> Path:
    """One real 2-rank `ddpdoctor profile` of the bundled MLP (1 MB buckets, so several per step), shared by the
    view e2e tests of this process; it also wrote ``extra.html`` (--html) and ``merged.json.gz`` (--merge)
    two levels up."""
    from tests.conftest import EXAMPLES, run_cli

    root = Path(tempfile.mkdtemp(prefix="ddpdoctor-views-"))
    atexit.register(shutil.rmtree, root, True)
    run = root / "logs" / "run"
    # --fail-on none: these tests are about the views; the verdict of this run is not theirs to judge.
    proc = run_cli("profile", "--nproc-per-node", "2", "--out", str(run), "-q", "--fail-on", "none",
                   "--html", str(root / "extra.html"),
                   "--merge", str(root / "merged.json.gz"),
                   str(EXAMPLES / "train_mlp.py"), "--bucket-cap-mb", "1", "--steps-per-epoch", "7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run
