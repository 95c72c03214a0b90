"""What `profile` says about its own window: a script that ended before the profiled steps (how many iterations it
saw, which flags would fit), and ranks that stopped once the window was written (docs/profile.md)."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.model import FAILURE_IDS, Finding, Severity
from ddpdoctor.probes.config import Schedule
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.report import rank_statuses


def fitting_flags(seen: int) -> str:
    """Schedule flags that fit a script of ``seen`` iterations (skip the first, DDP's bucket-building one, if it can)."""
    if seen >= 3:
        return f"--wait 1 --warmup 0 --active {seen - 1}"
    return f"--wait 0 --warmup 0 --active {max(1, seen)}"


def window_finding(seen: int, schedule: Schedule, ranks: list[int], traced: bool) -> Finding | None:
    """A warning when the script ran fewer iterations than wait + warmup + active."""
    need = schedule.needed()
    if seen >= need or seen <= 0:
        return None
    what = "only part of the window was recorded" if traced else "nothing was profiled"
    return Finding(
        "profile-window-not-reached", Severity.WARNING,
        f"The script ran {seen} iteration(s), fewer than the {need} the profile needs "
        f"(wait {schedule.wait} + warmup {schedule.warmup} + active "
        f"{f'auto, at least {schedule.min_active}' if schedule.auto else schedule.active}): {what}",
        ranks=ranks,
        evidence={"iterations_seen": seen, "wait": schedule.wait, "warmup": schedule.warmup,
                  "active": schedule.active, "needed": need, "traces_written": traced},
        advice=f"Profile with `{fitting_flags(seen)}` (or run the script for more iterations).",
    )


def window_verdict(report: Report, run: RunDir, schedule: Schedule) -> None:
    """Add the window finding and the "stopped after the window" note to ``report`` (in place)."""
    statuses = {r: s for r, s in rank_statuses(run).items() if isinstance(s, dict)}
    if not statuses:
        return
    seen = min(int(s.get("steps_completed") or 0) for s in statuses.values())
    # A job that failed ended early because it failed: that finding says it, not the window.
    failed = any(f.id in FAILURE_IDS for f in report.findings) or any(
        s.get("exit_code") not in (0, None) for s in statuses.values())
    f = None if failed else window_finding(seen, schedule, sorted(statuses), bool(run.trace_files()))
    if f is not None:
        report.findings.append(f)
    stopped: list[Any] = [s.get("stopped_after_window") for s in statuses.values() if s.get("stopped_after_window")]
    if stopped:
        report.notes.append(f"ranks stopped after the profiled window (iteration {max(stopped)}); "
                            "`--run-to-completion` keeps training")
