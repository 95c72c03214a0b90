"""The rule of `profile`'s own window: a script that ended before the profiled steps (how many iterations it saw,
which flags would fit; docs/profile.md). reports/profile.py applies it to the ranks' status files."""

from __future__ import annotations

from typing import Protocol

from ddpdoctor.findings.model import Finding, Severity


class WindowSchedule(Protocol):
    """The profiler schedule the rule judges (probes/config.py's Schedule; the rule needs only these)."""

    wait: int
    warmup: int
    active: int
    auto: bool
    min_active: int

    def needed(self) -> int: ...


def fitting_flags(seen: int) -> str:
    """Schedule flags that fit a script of ``seen`` iterations (skip the first, DDP's bucket-building one, if it can)."""
    if seen >= 3:
        return f"--wait 1 --warmup 0 --active {seen - 1}"
    return f"--wait 0 --warmup 0 --active {max(1, seen)}"


def window_finding(seen: int, schedule: WindowSchedule, ranks: list[int], traced: bool) -> Finding | None:
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
