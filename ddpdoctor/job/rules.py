"""The one stall rule, for a job of one node or many: which ranks are stalled, whether a stall is a hang, or a
rank still busy (a long stall: checkpoint, evaluation), or one that has just moved. Pure: plain records in, a
typed decision out, so a test can hand it 32,768 synthetic ranks.

A rank that stops advancing is hung only when it is stuck. Under the default timeout a stalled rank outside any
collective whose training thread still uses CPU, does I/O or moves its Python position (``idle_s`` < STUCK_S)
is busy (so is such a rank not yet past the timeout itself, no further on than the stalled ones): the job is in a
long stall, watched on. A stalled rank whose position changed less than STUCK_S ago
has just moved (back from a long checkpoint it is in DDP's all-reduce for milliseconds with its step's start
still old): not a hang yet. An explicit --hang-timeout turns both refinements off: the user said how long."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpdoctor.job.record import RankRecord


def _floor_from_env() -> float:
    """The default timeout's floor: 60 s, or $DDPDOCTOR_DEFAULT_HANG_TIMEOUT (still a default: busy ranks are stalls)."""
    try:
        value = float(os.environ.get("DDPDOCTOR_DEFAULT_HANG_TIMEOUT", "60"))
    except ValueError:
        return 60.0
    return value if value > 0 else 60.0


MIN_HANG_TIMEOUT_S = _floor_from_env()
STEP_MULTIPLE = 10.0
# A laggard with no CPU, no I/O and no move of its Python position for this long is stuck (15 s by default).
STUCK_S = MIN_HANG_TIMEOUT_S / 4
CRASH_GRACE_S = 10.0


def auto_hang_timeout(slowest_step_s: float | None) -> float:
    """The default --hang-timeout: max(60 s, 10x the slowest step seen so far)."""
    return max(MIN_HANG_TIMEOUT_S, STEP_MULTIPLE * (slowest_step_s or 0.0))


@dataclass(frozen=True)
class Limits:
    """The rule's settings: ``hang_timeout`` None is the automatic one (auto_hang_timeout of the job's slowest step)."""

    hang_timeout: float | None
    startup_timeout: float
    stuck_s: float = STUCK_S
    crash_grace_s: float = CRASH_GRACE_S


@dataclass
class StallDecision:
    """What the rule saw: ``stalled`` ranks; of them ``busy`` (working outside any collective) and ``moving``
    (just moved); ``tearing_down``: a rank failed moments ago (the launcher is stopping the job). ``hung``: the
    job is hung now. ``timeout_s``: the timeout applied."""

    timeout_s: float
    stalled: list[int] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    moving: list[int] = field(default_factory=list)
    tearing_down: bool = False
    missing: list[int] = field(default_factory=list)  # ranks that never said hello after the start-up timeout

    @property
    def hung(self) -> bool:
        return bool(self.stalled) and not (self.busy or self.moving or self.tearing_down)


def effective_timeout(records: Iterable[RankRecord], limits: Limits) -> float:
    if limits.hang_timeout is not None:
        return limits.hang_timeout
    return auto_hang_timeout(max((r.slowest_s or 0.0 for r in records), default=0.0))


def outside_collective(rec: RankRecord) -> bool:
    """Running, past a heartbeat, and not inside a collective (DDP's bucket all-reduce during backward counts)."""
    return rec.exit is None and rec.step is not None and not rec.coll


def is_busy(rec: RankRecord, stuck_s: float) -> bool:
    """Outside any collective with its training thread active (CPU, I/O, Python position) within ``stuck_s``."""
    return outside_collective(rec) and rec.idle_s is not None and rec.idle_s < stuck_s


def just_moved(rec: RankRecord, stuck_s: float) -> bool:
    return rec.moved_s is not None and rec.moved_s < stuck_s


def decide(records: list[RankRecord], limits: Limits, since_start_s: float, world_size: int | None = None,
           extra_age_s: dict[int, float] | None = None) -> StallDecision:
    """The stall rule over every rank's record (ages as of now; ``extra_age_s``: per rank, seconds to add to its
    step age: how long ago the head received that rank's node's envelope). ``since_start_s``: the job's age."""
    timeout = effective_timeout(records, limits)
    out = StallDecision(timeout)
    if not records:
        if since_start_s > limits.startup_timeout:
            out.stalled = [-1]
        return out
    if world_size and len(records) < world_size and since_start_s > limits.startup_timeout:
        seen = {r.rank for r in records}
        out.missing = out.stalled = [r for r in range(world_size) if r not in seen]
        return out
    extra = extra_age_s or {}
    for rec in records:
        if rec.exit is not None:
            if rec.exit[1] and rec.exit_age_s is not None and rec.exit_age_s < limits.crash_grace_s:
                out.tearing_down = True
            continue
        age = rec.age_s + extra.get(rec.rank, 0.0)
        if age > (timeout if rec.step else limits.startup_timeout):
            out.stalled.append(rec.rank)
    out.stalled.sort()
    if not out.stalled or limits.hang_timeout is not None:
        return out
    by_rank = {r.rank: r for r in records}
    out.moving = [r for r in out.stalled if r in by_rank and just_moved(by_rank[r], limits.stuck_s)]
    # The busy laggard need not be past the timeout itself: its step may have started a moment after the others'
    # (or its node's record arrived a moment later than theirs). Any live rank no further than the stalled ones,
    # outside any collective, whose training thread still works, is what they wait for.
    last = max((by_rank[r].step or 0 for r in out.stalled if r in by_rank), default=0)
    out.busy = sorted(r.rank for r in records
                      if r.exit is None and (r.step or 0) <= last and is_busy(r, limits.stuck_s))
    return out


# A hang under the default timeout is declared only when it still holds on a view of the job taken wholly after it
# was first seen, this much later: one rank heartbeat (1 s) and a node's publication (0.1 s), with a margin. Without
# it, a long stall that ends can be read as a hang for a moment: the busy rank's node already says it is back in
# the all-reduce while the waiting ranks' records (another node's, or a beat still on its way) are older.
CONFIRM_S = 1.5


class HangGate:
    """The last step of the rule: ``hung`` decisions turn into a verdict only once confirmed (CONFIRM_S, see above).
    An explicit --hang-timeout needs no confirmation: a rank past it is hung whatever came next."""

    def __init__(self, confirm_s: float = CONFIRM_S) -> None:
        self.confirm_s = confirm_s
        self.since: float | None = None

    def confirmed(self, d: StallDecision, limits: Limits, now: float, view_at: float | None = None) -> bool:
        """``view_at``: when the oldest part of the records judged was taken (a node's envelope's arrival at the
        head); None: the records are this node's own, live as of ``now``."""
        if not d.hung:
            self.since = None
            return False
        if limits.hang_timeout is not None:
            return True
        if self.since is None:
            self.since = now
        return (now if view_at is None else view_at) >= self.since + self.confirm_s and now >= self.since + self.confirm_s
