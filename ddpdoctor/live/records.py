"""The shapes of the live watch's JSON (docs/live.md): the rules' evidence, an alert, a node's health snapshot
(RUN/live/NODE/health.json), `status`'s state object, and a capture's records (RUN/captures/ID; the request
itself is job/capture_relay.py's CaptureRequest, the same through the control folder and the job store).

TypedDicts, not classes: these are JSON documents written as they are built (alerts.jsonl, health.json, the
Prometheus exporter's source), so the shapes type the dicts without changing a byte of them. What is read back from
a file someone else wrote (a snapshot of another node, a request in the control folder) is untrusted JSON and is
narrowed where it is read (``Mapping[str, object]``), not cast to these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from ddpdoctor.analyses.ledger import CausedWaitJson

# What `ddpdoctor capture` leaves in a node's control folder (RUN/live/NODE/control/req-ID.json) is the request the
# job's head relays to the other nodes: one shape, defined in the job layer below live/.
from ddpdoctor.job.capture_relay import CaptureRequest as CaptureRequest
from ddpdoctor.jsontypes import JsonObject


class SlowRankEvidence(TypedDict, total=False):
    """A slow-rank alert's evidence: the phase comparison's (rules.slow_ranks), the collective ledger's
    (analyses/ledger.py CausedWaitJson) where the ledger names the rank, or both merged (health.py)."""

    rank: int
    phase: str | None  # where its own work is longer (None: no host phase is, the ledger's case on NCCL)
    lost_ms_per_step: float
    pct_of_step: float | None
    step_ms: float
    rank_phase_ms: float
    others_phase_ms: float
    others_waited_ms_per_step: float
    noise_ms: float
    steps: list[int]  # [first, last] of the window
    ranks_compared: int
    # the ledger's
    cost_ms_per_step: float
    cost_pct_of_step: float
    caused_wait_ms_per_step: float
    interval_ms: JsonObject  # analyses/intervals.py Interval.to_json: value, interval [lo, hi], n
    phase_excess_ms: float
    own_blocked_ms: float
    others_blocked_ms: float
    persist_frac: float
    measured_by: str  # "ledger" when the ledger's caused wait is the cost


class SlowdownEvidence(TypedDict):
    """The slowdown rule's evidence (rules.slowdown): the job's step time now against its own baseline."""

    baseline_ms: float
    current_ms: float
    cost_ms_per_step: float
    pct_slower: float | None
    since_step: int
    baseline_steps: list[int]
    recent_steps: list[int]
    noise_ms: float
    top_phase: str | None
    cpu_wait_rise_ms: float  # of the rise, the ranks' longer wait for a CPU (subtracted before judging)


class DivergenceEvidence(TypedDict):
    """A divergence alert's evidence (job/divergence.py's verdict, as RUN/divergence.json holds it in full)."""

    step: int  # the first step at which the ranks' fingerprints differ
    ranks: list[int]
    ranks_count: int
    field: str  # the first item that differs: loss, dry, epoch, opt, colls, ops, graphs
    on_divergence: str


class Outlier(TypedDict):
    """One step far above the usual (rules.outliers); a "stall" one is a stall alert's evidence."""

    step: int
    seconds: float
    usual_s: float
    excess_s: float
    kind: str  # "stall" | "periodic"
    why: str | None
    rank: int | None  # the rank that spent most outside the wait phases in that step
    phase: str | None


class Alert(TypedDict):
    """One line of RUN/live/NODE/alerts.jsonl, and of the snapshot's "alerts"."""

    id: str  # "slow-rank" | "slowdown" | "stall" | "divergence"
    time: float
    step: int
    title: str
    ranks: list[int]
    cost_ms: float
    evidence: SlowRankEvidence | SlowdownEvidence | Outlier | DivergenceEvidence


class _RankHealth(TypedDict):
    step: int
    step_ms: float
    busy_ms: float  # time outside the wait phases per step
    phase_share: dict[str, float]
    phase_now: str | None
    caused_wait_ms: float


class RankHealth(_RankHealth, total=False):
    """One rank in a snapshot; the split of its blocked time once the ledger has measured it."""

    blocked_ms: float
    waiting_ms: float
    transfer_ms: float
    cpu_wait_ms: float  # the training thread's run-queue wait per step (analyses/ledger.py CPU_WAIT), where measured


class HealthSnapshot(TypedDict):
    """RUN/live/NODE/health.json: one node's monitor's view of its ranks (health.py LiveHealth.snapshot)."""

    version: int
    node: str
    updated: float
    started: float
    finished: bool
    world_size: int | None
    ranks_reporting: int
    step: int
    step_ms: float | None
    steps_per_s: float | None
    slowest_ranks: list[int]
    ranks: dict[str, RankHealth]
    waited_for: list[CausedWaitJson]
    ledger_notes: list[str]
    alerts: list[Alert]
    alerts_total: int
    monitor_cost_s: float


class MergedHealth(TypedDict):
    """Several nodes' snapshots as one job view (status.merge_nodes); their parts are passed through as read."""

    version: object
    nodes: list[object]
    updated: float | None
    finished: bool
    world_size: float | None
    ranks_reporting: int
    step: int
    step_ms: float | None
    steps_per_s: float | None
    slowest_ranks: list[int]
    ranks: dict[str, object]
    alerts: Sequence[Mapping[str, object]]
    alerts_total: int
    waited_for: Sequence[Mapping[str, object]]


class StatusDoc(TypedDict):
    """`status`'s state object (status.load_status; docs/live.md). ``health``: the snapshot as read (one node's,
    or the merge of several), untrusted."""

    state: str  # "running" | "finished" | "unfinished" | "stale" | "starting"
    run_dir: str
    command: str | None
    exit_code: int | None
    live: bool
    health: Mapping[str, object] | None
    age_s: float | None


class PickedUp(TypedDict):
    """The nodes' records of one request (capture.wait_picked_up), merged."""

    nodes: list[str]
    ranks: list[int]
    error: str | None
    missing_nodes: list[str]


class _CaptureRecord(TypedDict):
    id: str
    what: str
    steps: object  # as requested (a window kind's is checked: 1..MAX_STEPS)
    requested: float
    ranks: list[int]
    world_size: int | None
    reason: object  # the request's, or "ddpdoctor capture"


class CaptureRecord(_CaptureRecord, total=False):
    """RUN/captures/ID/capture-NODE.json: what a node's monitor did with a request (watch.py)."""

    error: str
    forwarded: list[str]  # the job's other nodes it went to through the job store
    at_step: int
    done: float


class StackClass(TypedDict):
    """Ranks sharing a main-thread stack and phase (stacks.group_stacks)."""

    count: int
    ranks: str  # as ranges: "0-511,513-1023"
    phase: str
    steps: list[int]
    stack: str
