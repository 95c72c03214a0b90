"""The one place an end-to-end test forgives torch's teardown abort (docs/findings.md#job-aborted-after-finish).

torch 2.13's gloo now and then aborts a rank at interpreter exit ("terminate called without an active exception",
SIGABRT) after the rank finished its script and wrote exit status 0; torchrun then exits 1, and ddpdoctor reports
`aborted-after-finish` (a warning) and exits 1, as it must. A test that launches a real job and expects it to end
cleanly calls ``settle`` on what it got: when, and only when, that finding explains the job's exit code (every rank
wrote exit status 0; no error finding beside it: warnings are advice, not a broken job), it gets back the report and the exit code the
run would have had without the abort, and goes on to assert everything else as before. Any other failure, or the
finding beside another problem, reaches the test's own assertions unchanged."""

from __future__ import annotations

import copy
from typing import Any

ABORT = "aborted-after-finish"
_RANK = {"info": 0, "warning": 1, "error": 2}


def _doc(report: Any) -> dict[str, Any]:
    return copy.deepcopy(report if isinstance(report, dict) else report.to_json())


def teardown_abort(report: Any) -> dict[str, Any] | None:
    """The report's `aborted-after-finish` finding (as JSON), or None."""
    return next((f for f in _doc(report).get("findings") or [] if f.get("id") == ABORT), None)


def settle(returncode: int | None, report: Any, fail_on: str = "error") -> tuple[int | None, dict[str, Any]]:
    """(exit code, report JSON) with a teardown abort, alone, taken out; everything else as it was.

    ``returncode``: the command's exit code (None for the Python API, which has none); ``report``: its --json
    document or a Report. The abort is forgiven only when its finding is there, the job's exit code is 1 as it
    says, the command exited 1, and no error finding sits beside it: then the finding is
    dropped, the job's exit code becomes 0 and the status and exit code are what the remaining findings make them."""
    doc = _doc(report)
    found = teardown_abort(doc)
    if found is None:
        return returncode, doc
    others = [f for f in doc["findings"] if f.get("id") != ABORT]
    if (returncode not in (None, 1) or (doc.get("job") or {}).get("exit_code") != 1
            or found["evidence"].get("job_exit_code") != 1
            or any(_RANK.get(f.get("severity"), 0) >= 2 for f in others)):
        return returncode, doc  # something else is wrong too: the test sees all of it
    doc["findings"] = others
    doc["job"]["exit_code"] = 0
    worst = max((_RANK.get(f.get("severity"), 0) for f in others), default=0)
    doc["status"] = {2: "error", 1: "warning"}.get(worst, "ok")
    code = None if returncode is None else int(fail_on != "none" and worst >= _RANK[fail_on])
    return code, doc


def settle_cli(proc: Any, report: dict[str, Any], args: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """``settle`` for a CLI run: sets ``proc.returncode`` to the settled code (its --fail-on read from ``args``)
    and returns the settled report."""
    args = list(args)
    fail_on = args[args.index("--fail-on") + 1] if "--fail-on" in args[:-1] else "error"
    proc.returncode, doc = settle(proc.returncode, report, fail_on)
    return doc


def settle_run(proc: Any, out: Any, args: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """``settle_cli`` for a run without --json: the report the command saved as OUT/report.json."""
    import json
    from pathlib import Path

    path = Path(out) / "report.json"
    if not path.is_file():
        return {}
    return settle_cli(proc, json.loads(path.read_text()), args)
