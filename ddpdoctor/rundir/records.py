"""The shapes of a rank's records as the probes write them and the monitor, the job rules and the hang rules hold
them (heartbeat, exit message, status.json), and of what the monitor writes (RUN/hang.json, RUN/heartbeats.json).

TypedDicts over the JSON documents themselves: the files and messages stay byte for byte what they were, and
rundir/schema.py validates them on the way back in (tests/unit/test_typed_records.py pairs each with its reader).
They live at the bottom so that probes/, findings/, job/ and launch/ share one shape each without importing upward.
Keys written only on some paths are optional (``total=False``)."""

from __future__ import annotations

from typing import TypedDict, final

from ddpdoctor.jsontypes import JsonValue

# ---- heartbeat: the collective a rank is in ----------------------------------------------------------------


class CollectiveState(TypedDict, total=False):
    """A collective the rank entered (heartbeat.py): also status.json's failed_collective / last_collective, and
    what the hang rules make of a rank's position (op and group None where a record did not say)."""

    op: str | None
    group: str | None
    seq: int | None
    sizes: list[list[int]]
    call_site: str | None
    since: float
    step: int
    error: str  # only in failed_collective
    dtypes: list[str]  # the Flight Recorder's input dtypes, where it named the collective
    source: str  # who saw it: absent for a torch.distributed call; "flight-recorder" or "wait" (probes/collectives.py)
    unit: str  # the FSDP2 unit whose collective it is, and its mesh dim (probes/collectives.fsdp_unit)


# What probes/collectives.py calls a wait before the Flight Recorder names its collective (the hang verdict names it
# from the rank's dump: findings/hang.reconcile).
WAIT_OPS = {"wait": "wait (async collective)", "broadcast_coalesced": "broadcast (DDP buffers/parameters)",
            "wait_tensor": "wait_tensor (functional collective)"}


class BackwardState(TypedDict):
    """The rank is inside backward(), where DDP all-reduces its buckets: where the default group's count stands."""

    call_site: str | None
    since: float | None
    group: str
    seq: int | None


class Beat(TypedDict, total=False):
    """One heartbeat (a "beat" line to the monitor; job/record.py reads it). The monitor also keeps the "enter"
    and "backward" lines folded into the rank's last beat."""

    type: str
    rank: int
    pid: int
    time: float
    step: int
    phase: str
    step_started: float | None
    last_step_s: float | None
    max_step_s: float | None
    collective: CollectiveState | None
    last_collective: CollectiveState | None
    where: str | None
    tid: int
    main_tid: int | None
    steps: list[list[object]]  # live.recent_steps: [step, seconds, {phase: seconds}]
    summary: dict[str, float]
    backward: BackwardState | None
    data_dry: int  # completed steps when its training DataLoader ran dry, until it draws a batch again


class RankExitDoc(TypedDict, total=False):
    """How a rank ended, as its monitor holds it: the rank's "exit" message (its status.json's head), or the
    monitor's own note of a rank that died without one (``exit_code`` None)."""

    exit_code: int | None
    exception: str | None
    steps_completed: int | None
    exit_site: str | None


class RankMessage(Beat, total=False):
    """Any line a rank sends its monitor (probes/heartbeat.py, probes/live.py), as it arrives: a beat's keys plus
    those of the other kinds ("hello", "enter", "backward", "dump", "exit", a capture's reply). Raw JSON from the
    rank's socket: the monitor checks every value it acts on."""

    world_size: int
    status: RankExitDoc  # "exit"
    stacks: str  # "dump"
    flight_recorder: JsonValue  # "dump": torch's Flight Recorder JSON as torch writes it, or {"error": ...}
    id: str  # a capture's reply
    what: str
    accepted: bool
    reason: str


# ---- status.json ----------------------------------------------------------------------------------------------


class RankStatusDoc(TypedDict, total=False):
    """ranks/rankR/status.json as the bootstrap and the probes fill it (rundir/schema.py: RankStatus); the job's
    head builds the same shape from the ranks' published records (job/state.statuses)."""

    exit_code: int | None
    exit_site: str | None
    signal: str | None
    stopped_after_window: int
    exception: str | None
    exception_type: str
    traceback: str
    rank: int
    steps_completed: int | None
    step_times_s: list[float]
    duration_s: float
    ddp_modules: int
    parallelism: list[str]  # what else the rank built (probes/parallelism.py kinds), when it built FSDP or DTensor
    traces: list[str]
    failed_collective: CollectiveState | None
    last_collective: CollectiveState | None
    ended_at: float
    stopped_by: str


# ---- hang.json: the hang verdict (job/verdict.py HangVerdict.to_json) ---------------------------------------


class _WaitedHead(TypedDict):
    op: str | None
    seq: int | None
    group: str | None


class WaitedCollective(_WaitedHead, total=False):
    """The collective the stalled ranks wait in (the most advanced one of the ranks named)."""

    unit: str  # the FSDP2 unit whose collective it is (probes/collectives.fsdp_unit)


class _PositionHead(TypedDict):
    rank: int
    state: str
    phase: str | None
    step: int | None
    op: str | None
    group: str | None
    seq: int | None
    sizes: list[list[int]]
    call_site: str | None
    exit_code: int | None


class PositionDoc(_PositionHead, total=False):
    """Where one rank stood when the hang was detected (findings/hang.py RankPosition)."""

    unit: str  # the FSDP2 unit whose collective it waits in
    data_dry: int  # completed steps when its training DataLoader ran dry (no batch drawn since)


class _HangDiagnosisHead(TypedDict):

    kind: str
    stalled_ranks: list[int]
    culprit_ranks: list[int]
    collective: WaitedCollective | None
    positions: dict[str, PositionDoc]
    reason: str
    differs: list[str]


class HangDiagnosisDoc(_HangDiagnosisHead, total=False):
    """The culprit and why (findings/hang.py HangDiagnosis)."""

    sources: dict[str, list[str]]  # per rank named: the sources that agree (findings/hang.reconcile)


class RankClassDoc(TypedDict):
    """Ranks in the same state with the same stack (job/grouping.py RankClass), on a job of many nodes."""

    count: int
    ranks: str  # as ranges: "0-511,513-1023"
    state: str
    representative: int
    nodes: str
    stack: str | None


class HangNodeDoc(TypedDict):
    """One node of a job of many, in its hang verdict."""

    host: str
    lost: bool
    ranks: str  # as ranges


class _HangHead(TypedDict):
    detected_after_s: float
    hang_timeout_s: float
    hang_timeout_set: bool
    startup_timeout_s: float
    in_startup: bool
    on_hang: str
    diagnosis: HangDiagnosisDoc
    stacks: dict[str, str | None]


@final
class HangDoc(_HangHead, total=False):
    """RUN/hang.json. One node adds its ranks' last heartbeats, many nodes their rank classes and nodes. The keys
    keep the order they were always written in."""

    heartbeats: dict[str, Beat | None]
    classes: list[RankClassDoc]
    nodes: dict[str, HangNodeDoc]
    flight_recorder: dict[str, JsonValue]
    reported_after_s: float


# ---- heartbeats.json: what the monitor saw of each rank -----------------------------------------------------


class StallDoc(TypedDict):
    """A long stall (job/record.py LongStall): a rank busy outside any collective past the hang timeout."""

    rank: int
    step: int
    phase: str | None
    call_site: str | None
    since: float
    stack: str | None
    stalled_s: float


class RankBeatsDoc(TypedDict):
    beat: Beat | None
    exit: RankExitDoc | None


class MonitorDoc(TypedDict):
    """The watcher's own counters: connections and messages it rejected, plugin errors, long stalls."""

    rejected: dict[str, int]
    plugin_errors: int
    stalls: list[StallDoc]


class HeartbeatsDoc(TypedDict):
    """RUN/heartbeats.json (rundir/schema.py: Heartbeats)."""

    world_size: int | None
    ranks: dict[str, RankBeatsDoc]
    monitor: MonitorDoc


# ---- a node that lost the job's head (job/verdict.py HeadLost) ------------------------------------------------


class _RankStateHead(TypedDict):
    rank: int
    step: int | None
    phase: str | None
    at: str | None  # its call site


class RankStateDoc(_RankStateHead, total=False):
    """A rank's last state in words (job/verdict.rank_state): the collective it is in, how it ended."""

    collective: WaitedCollective
    exit_code: int | None
    exception: str | None


class HeadLostDoc(TypedDict):
    """What a node that lost the job's head knows (docs/hangs.md#lost-head)."""

    head: str
    line: str
    node_rank: int
    exit_code: int
    last_verdict: str | None
    ranks: list[RankStateDoc]


# ---- manifest.json's "ended": how the run ended (launch/launcher.py) ---------------------------------------


class RunEndedDoc(TypedDict, total=False):
    """How the run ended (rundir/schema.py: RunEnded): "exited" with the job's code, "hang", "signal" (ddpdoctor
    was stopped: which signal), "ddpdoctor-error" (ddpdoctor itself failed: the error)."""

    how: str
    exit_code: int | None
    signal: str
    signum: int
    error: str
