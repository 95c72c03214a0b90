"""The typed events the log parsers extract; the rules turn them into findings. Plain, JSON-ready dataclasses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict

from ddpdoctor.jsontypes import JsonObject


@dataclass(frozen=True)
class Where:
    source: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.source}:{self.lineno}"


class FingerprintJson(TypedDict):
    op: str | None
    seq: int | None
    shapes: list[list[int]]
    dtypes: list[str]
    device: str | None


class TimelineRow(TypedDict):
    """One failure line of the `logs` report's "timeline" (triage.timeline)."""

    where: str
    rank: int | None
    host: str | None
    kind: str
    role: str | None
    text: str


class RankHangState(TypedDict, total=False):
    """What one rank was doing when it hung, as a log source says it (hangs.py: a HangAnalysis's per_rank and
    mismatch; the hang finding's evidence). Each source fills the keys it knows."""

    op: str | None
    seq: int | None
    numel_in: int | None
    shapes: list[list[int]] | None
    call_site: str | None
    timed_out_seq: int | None
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    last_enqueued_op: str | None
    last_enqueued_sizes: list[list[int]] | None
    ran_for_ms: int | None
    timeout_ms: int | None


@dataclass(frozen=True)
class Fingerprint:
    """One side of a TORCH_DISTRIBUTED_DEBUG=DETAIL CollectiveFingerPrint."""

    seq: int | None
    op: str | None
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    device: str | None = None

    def to_json(self) -> FingerprintJson:
        return {"op": self.op, "seq": self.seq, "shapes": self.shapes, "dtypes": self.dtypes, "device": self.device}


@dataclass(frozen=True)
class FingerprintMismatch:
    """'Detected mismatch between collectives on ranks. Rank A is running collective: FP, but Rank B ...: FP'."""

    reporter: int | None  # the rank whose log line it is
    self_rank: int
    self_fp: Fingerprint
    peer_rank: int | None
    peer_fp: Fingerprint | None
    differs: str
    where: Where


@dataclass(frozen=True)
class MonitoredBarrierFailure:
    reporter: int | None
    failed_ranks: list[int]
    timeout_ms: int | None
    where: Where


@dataclass(frozen=True)
class WatchdogTimeout:
    """ProcessGroupNCCL: 'Watchdog caught collective operation timeout: WorkNCCL(SeqNum=, OpType=, ...) ran for N ms'."""

    rank: int | None
    seq: int | None  # None in torch < 1.10's wording (no SeqNum)
    op: str
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    group: str | None
    where: Where


@dataclass(frozen=True)
class WatchdogWorkState:
    """'... detected by watchdog at work: N, last enqueued NCCL work: E, last completed NCCL work: C.'"""

    rank: int | None
    failed_seq: int | None
    last_enqueued: int
    last_completed: int | None
    group: str | None
    where: Where


@dataclass(frozen=True)
class GlooSizeMismatch:
    rank: int | None
    received_bytes: int | None
    expected_bytes: int | None
    where: Where


@dataclass(frozen=True)
class GlooTimeout:
    rank: int | None
    timeout_ms: int
    operation: str  # "recv" or "send"
    where: Where


@dataclass(frozen=True)
class UnusedParameters:
    rank: int | None
    names: list[str]
    indices: list[int]
    where: Where


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def is_library(self) -> bool:
        """Frames in torch or any installed package, i.e. not the user's own code."""
        f = self.file.replace("\\", "/")
        return ("site-packages/" in f or "dist-packages/" in f or "/lib/python3" in f or "/torch/" in f
                or f.startswith("<"))

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class RankException:
    """A Python traceback (or a C++ terminate / faulthandler dump) printed by one rank."""

    rank: int | None
    exc_type: str
    message: str
    traceback: str
    frames: list[Frame]
    chained: bool  # printed after "During handling of the above exception" / "direct cause": a consequence
    where: Where

    @property
    def exception(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    def user_frame(self) -> Frame | None:
        """The innermost frame in the user's code: the call site of whatever failed."""
        for frame in reversed(self.frames):
            if not frame.is_library():
                return frame
        return None

    def torch_distributed_call(self) -> str | None:
        """The torch.distributed function the rank was in (all_reduce, barrier, ...), from the traceback."""
        for frame in reversed(self.frames):
            if frame.file.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py"):
                return frame.function
        if any(f.function in ("backward", "_engine_run_backward") for f in self.frames):
            return "allreduce (DDP gradient buckets, in backward)"
        return None


@dataclass(frozen=True)
class CollectiveStack:
    """NCCL's 'Stack trace of the failed collective:' (torch >= 2.5 with Flight Recorder on): '#0 fn from file:line'."""

    rank: int | None
    frames: list[Frame]  # outermost first, like a Python traceback
    text: str
    where: Where

    def user_frame(self) -> Frame | None:
        for frame in reversed(self.frames):
            if not frame.is_library():
                return frame
        return None


@dataclass(frozen=True)
class ChildFailure:
    """One record of torchrun's ChildFailedError table, or one failed task reported by srun."""

    rank: int | None
    exitcode: int | None
    signal: str | None
    error: str
    host: str | None
    time: str | None
    is_root_cause: bool
    reporter: str  # "torchrun" or "srun"
    where: Where


@dataclass(frozen=True)
class FailureLine:
    """One line of the failure grammar (ddpdoctor/logs/grammar.py, docs/logs-grammar.md)."""

    kind: str  # the grammar rule's kind: oom, nccl-error, nccl-remote, model-mismatch, watchdog-stuck, store, ...
    role: str  # "cause" or "victim"
    rank: int | None
    host: str | None
    gpu: int | None
    text: str
    ts: float | None
    where: Where
    odd_rank: int | None = None  # model-mismatch: the rank the message names as different


@dataclass(frozen=True)
class Unexplained:
    """A line that says something failed (error level, exception, exit code, ...): quoted when no rule explains it."""

    rank: int | None
    host: str | None
    text: str
    ts: float | None
    where: Where


Event = (
    FingerprintMismatch | MonitoredBarrierFailure | WatchdogTimeout | WatchdogWorkState | GlooSizeMismatch
    | GlooTimeout | UnusedParameters | RankException | CollectiveStack | ChildFailure | FailureLine | Unexplained
)


def event_json(event: Event) -> JsonObject:
    """One parsed event's fields as JSON, with its kind (the debugging dump of logs/explain.py events_json)."""
    out: JsonObject = asdict(event)
    out["kind"] = type(event).__name__
    return out
