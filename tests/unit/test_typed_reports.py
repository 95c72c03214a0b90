"""The report pipeline stays typed (issue 25): `dict[str, Any]` in analyses/, findings/, reports/, renderers/,
rundir/, commands/ and report.py only where the data is untyped by nature, and the ceilings only go down.

The boundaries left, by package:
- findings/: a finding's evidence (model.py, and the rules that build one up key by key: sync.py, perf.py,
  perf_wholetrace.py, failure.py); the hang and crash rules (hang.py) and the job rules (job.py) read the rank
  status and heartbeat dicts the job layer also builds (job/state.py), typed with it in the same step;
- reports/: a saved hang section's raw JSON (sections.py);
- renderers/: none (a finding's evidence shown and a trace's raw distributedInfo and event args are read as
  ``Mapping[str, object]``; the TensorBoard scalars render the typed PerfSection);
- rundir/: the raw-JSON readers kept for tools and the status/sync rules above (artefacts.load_dict,
  manifest.load, loaders.rank_statuses, loaders.rank_sync_files);
- commands/: click's keyword arguments (pop_live, pop_watcher, pop_launch_spec), a check's evidence (preflight.py);
- report.py: ``Report.sections``, the merged JSON view of the public API (``ddpdoctor.check_sync(...).sections``).
A JSON document written out is a ``ddpdoctor.jsontypes.JsonObject`` (checked: only JSON values go in), not counted
here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "ddpdoctor"
CEILINGS = {
    "analyses": 0,
    # evidence maps x5 (model, sync, perf, perf_wholetrace, failure); the rank status and heartbeat dicts of the
    # hang/crash rules (hang.py x23) and the job rules (job.py x3), shared with job/state.py; the job layer's rank
    # rows of head-lost (failure.py)
    "findings": 33,
    "reports": 1,  # a saved hang section's raw JSON (sections.py)
    "renderers": 0,
    "rundir": 6,  # the raw readers: artefacts.load_dict, manifest.load, loaders.rank_statuses/rank_sync_files x2
    "commands": 4,  # click's keyword arguments x3, a preflight check's evidence
    "report.py": 2,  # Report.sections: the merged JSON view of the public API
}
# rundir/schema_base.py keeps ``Json = Any`` for the fields msgspec copies without reading (versions, options, a beat's
# collective, Flight Recorder dumps): msgspec needs a runtime type there, and no code reads them as typed data.
ALIAS_ALLOWED = {"rundir/schema_base.py"}
_ANY_DICT = re.compile(r"dict\[str, Any\]")


def _count(where: str) -> int:
    root = PKG / where
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    return sum(len(_ANY_DICT.findall(p.read_text())) for p in files)


@pytest.mark.parametrize("where", sorted(CEILINGS))
def test_the_report_pipeline_stays_typed(where: str) -> None:
    assert _count(where) <= CEILINGS[where], (
        f"ddpdoctor/{where} has {_count(where)} `dict[str, Any]` (ceiling {CEILINGS[where]}): type the new one "
        "(a dataclass, a msgspec Struct, or a TypedDict for a JSON document passed through)")


def test_a_json_alias_does_not_stand_in_for_types() -> None:
    """`Json = Any`-style aliases hide untyped dicts from the count above: the report pipeline has none."""
    alias = re.compile(r"^\w+\s*(?::\s*TypeAlias)?\s*=\s*(?:Any|dict\[str, Any\])\s*(?:#.*)?$", re.M)
    found = {str(p.relative_to(PKG)): alias.findall(p.read_text())
             for where in CEILINGS for p in ((PKG / where).rglob("*.py") if (PKG / where).is_dir() else [PKG / where])}
    assert {k: v for k, v in found.items() if v and k not in ALIAS_ALLOWED} == {}
