"""docs/json.md against real output: every key `analyze --json` prints is documented, and the documented
schema_version is the one printed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ddpdoctor.commands.analyze import command as analyze
from ddpdoctor.report import SCHEMA_VERSION, Report

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "analyze" / "gloo_2rank_mlp"
# Maps whose keys are data (ranks, op names, finding ids' evidence), not contract names.
DATA_KEYED = ("by_op", "evidence", "starts_us", "ends_us", "lateness_us", "caused_wait_us", "last_arrival_count",
              "step_time_us_by_rank", "clock_offsets_us")


def _documented() -> set[str]:
    text = (ROOT / "docs" / "json.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    return {name for block in blocks for name in re.findall(r'"([a-z_][a-z0-9_]*)"', block)}


def _keys(value: Any, parent: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if parent in DATA_KEYED:
                continue
            out.add(k)
            out |= _keys(v, k)
    elif isinstance(value, list):
        for item in value:
            out |= _keys(item, parent)
    return out


def test_every_key_of_analyze_json_is_documented():
    res = CliRunner().invoke(analyze, [str(RUN), "--json"])
    assert res.exit_code in (0, 1), res.output
    report = json.loads(res.output)
    assert report["schema_version"] == SCHEMA_VERSION
    printed = _keys(report)
    assert {"whatif", "ddp", "ranks", "collectives", "stragglers"} <= printed
    missing = printed - _documented()
    assert not missing, f"keys printed by analyze --json but not in docs/json.md: {sorted(missing)}"


def test_schema_version_is_in_every_report_and_documented():
    assert Report(command="logs").to_json()["schema_version"] == SCHEMA_VERSION
    assert f'"schema_version": {SCHEMA_VERSION}' in (ROOT / "docs" / "json.md").read_text()
