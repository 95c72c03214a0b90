"""The typed sections of a Report, one class per section of docs/json.md, and which sections each command's
report may hold (so a saved report.json loads back typed: ``load_report``).

Each section's fields are its top-level JSON keys, in output order. What nests inside is typed by its JSON shape
(reports/perf_json.py, diff_json.py, tune_json.py, sync_json.py, topo/section_types.py: TypedDicts, the same whether
the report was just assembled or loaded back from a saved report.json); what is left as ``JsonObject`` is JSON that
no code here reads, only writes out (a finding's evidence stays a plain map)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.report import Report, Section

if TYPE_CHECKING:  # shapes named in annotations only: not imported by a command that has no such section
    from ddpdoctor.job.role import NodeInfoDoc
    from ddpdoctor.logs.events import TimelineRow
    from ddpdoctor.preflight.checks import CheckRowJson
    from ddpdoctor.reports.diff_json import DiffJson
    from ddpdoctor.reports.perf_json import CollectivesJson, InputJson, RankJson, StragglersJson
    from ddpdoctor.reports.sync_json import ChecksJson
    from ddpdoctor.reports.tune_json import TuneJson, VariantJson
    from ddpdoctor.topo.section_types import (
        Channels,
        HostRow,
        NcclNotUsed,
        RunTopology,
        SystemRow,
        TopoInputs,
        TopoSections,
        TopoSummary,
        Transports,
    )
    from ddpdoctor.topo.section_types import RankRow as TopoRankRow


@dataclass(frozen=True)
class RunDirSection(Section):
    """Where a launch (or a capture window) wrote its run directory."""

    KEYS: ClassVar[tuple[str, ...]] = ("run_dir",)
    run_dir: str


@dataclass(frozen=True)
class JobOutcome:
    """The "job" object: how the launched job ended, from the run directory's manifest."""

    exit_code: int | None = None
    world_size: int | None = None
    duration_s: float | None = None
    killed_by: str | None = None

    def to_json(self) -> JsonObject:
        return {"exit_code": self.exit_code, "world_size": self.world_size, "duration_s": self.duration_s,
                "killed_by": self.killed_by}


@dataclass(frozen=True)
class JobSection(Section):
    KEYS: ClassVar[tuple[str, ...]] = ("job",)
    job: JobOutcome

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> JobSection:
        raw = doc.get("job")
        job = raw if isinstance(raw, dict) else {}
        return cls(JobOutcome(**{k: job.get(k) for k in ("exit_code", "world_size", "duration_s", "killed_by")}))


class HangClassJson(TypedDict, total=False):
    """Ranks that share a state and a stack (job/grouping.py), as the hang section lists them."""

    count: int | None
    ranks: str | None  # as ranges: "0-511,513-1023"
    state: str | None
    nodes: str | None


@dataclass(frozen=True)
class HangVerdict:
    """The "hang" object (docs/hangs.md): when and why the watch declared a hang, and where each rank stood."""

    detected_after_s: float | None
    hang_timeout_s: float | None
    on_hang: str | None
    kind: str | None
    culprit_ranks: list[int] | None
    report: str
    ranks: dict[str, str] = field(default_factory=dict)  # rank -> one line: where it stood
    classes: list[HangClassJson] | None = None  # multi-node: ranks grouped by state and stack

    def to_json(self) -> JsonObject:
        out: JsonObject = {"detected_after_s": self.detected_after_s, "hang_timeout_s": self.hang_timeout_s,
                                "on_hang": self.on_hang, "kind": self.kind, "culprit_ranks": self.culprit_ranks,
                                "report": self.report, "ranks": dict(self.ranks)}
        if self.classes is not None:
            out["classes"] = [{"count": c.get("count"), "ranks": c.get("ranks"), "state": c.get("state"),
                               "nodes": c.get("nodes")} for c in self.classes]
        return out


@dataclass(frozen=True)
class HangSection(Section):
    KEYS: ClassVar[tuple[str, ...]] = ("hang",)
    hang: HangVerdict

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> HangSection:
        raw = doc.get("hang")
        # raw JSON in: a saved report's "hang" object, taken key by key into the typed HangVerdict
        h: dict[str, Any] = raw if isinstance(raw, dict) else {}
        return cls(HangVerdict(
            detected_after_s=h.get("detected_after_s"), hang_timeout_s=h.get("hang_timeout_s"),
            on_hang=h.get("on_hang"), kind=h.get("kind"), culprit_ranks=h.get("culprit_ranks"),
            report=str(h.get("report") or ""), ranks={str(k): str(v) for k, v in (h.get("ranks") or {}).items()},
            classes=h.get("classes")))


@dataclass(frozen=True)
class PerfSection(Section):
    """The performance analysis of profiler traces (`analyze`, `profile`, `capture --profile`; docs/json.md)."""

    KEYS: ClassVar[tuple[str, ...]] = ("inputs", "window", "ranks", "collectives", "syncs", "stragglers",
                                       "exposed_split", "clock_offsets_us", "ddp", "whatif", "fsdp_units")
    OPTIONAL: ClassVar[tuple[str, ...]] = ("whatif", "exposed_split", "fsdp_units")
    inputs: list[InputJson]
    window: str
    ranks: list[RankJson]
    collectives: CollectivesJson
    syncs: list[JsonObject]
    stragglers: StragglersJson
    clock_offsets_us: dict[str, float]
    ddp: list[JsonObject]
    whatif: JsonObject | None = None
    # docs/metrics.md#exposed-split: per rank, exposed communication as waiting / transfer / dispatch (None in
    # reports saved before it existed)
    exposed_split: list[JsonObject] | None = None
    # docs/metrics.md#fsdp2-units: the FSDP2 unit inventory, only for traces with FSDP2's ranges
    fsdp_units: JsonObject | None = None

    @classmethod
    def present_in(cls, doc: Mapping[str, object]) -> bool:
        return "ranks" in doc and "collectives" in doc


@dataclass(frozen=True)
class SyncChecksSection(Section):
    """What check-sync compared across ranks (docs/check-sync.md): the "checks" object."""

    KEYS: ClassVar[tuple[str, ...]] = ("checks",)
    checks: ChecksJson


@dataclass(frozen=True)
class PreflightSection(Section):
    """The preflight checks table (docs/preflight.md)."""

    KEYS: ClassVar[tuple[str, ...]] = ("checks", "bandwidth_table", "run_dir", "duration_s")
    checks: list[CheckRowJson]
    bandwidth_table: str | None
    run_dir: str
    duration_s: float


class LogInputJson(TypedDict, total=False):
    """One input `logs` read (logs/explain.py InputSummary)."""

    name: str
    kind: str  # "text" | "flight-recorder" | "unusable"
    lines: int
    ranks: list[int]
    events: int
    problem: str | None
    nccl_debug: bool


@dataclass(frozen=True)
class LogsSection(Section):
    """What `ddpdoctor logs` read (docs/logs.md): each input, the ranks seen, event counts, the failure timeline."""

    KEYS: ClassVar[tuple[str, ...]] = ("inputs", "ranks_seen", "events", "timeline")
    inputs: list[LogInputJson]
    ranks_seen: list[int]
    events: dict[str, int]
    timeline: list[TimelineRow]


@dataclass(frozen=True)
class TopoSection(Section):
    """The fabric as `ddpdoctor topo` read it from NCCL logs and topology XML (docs/topo.md)."""

    KEYS: ClassVar[tuple[str, ...]] = ("summary", "hosts", "ranks", "transports", "channels", "topology",
                                       "warnings", "inputs")
    summary: TopoSummary
    hosts: list[HostRow]
    ranks: list[TopoRankRow]
    transports: Transports
    channels: Channels
    topology: list[SystemRow]
    warnings: list[str]
    inputs: TopoInputs

    def sections(self) -> TopoSections:
        """The sections as topo/diagnose.py builds them (the shape a launch's "topology" section nests)."""
        from ddpdoctor.topo.section_types import TopoSections

        return TopoSections(summary=self.summary, hosts=self.hosts, ranks=self.ranks, transports=self.transports,
                            channels=self.channels, topology=self.topology, warnings=self.warnings, inputs=self.inputs)


@dataclass(frozen=True)
class NcclUseSection(Section):
    """`topo` on a run directory: whether its job used NCCL, its backend, and (when not) why there is no fabric."""

    KEYS: ClassVar[tuple[str, ...]] = ("nccl_used", "backend", "reason")
    OPTIONAL: ClassVar[tuple[str, ...]] = ("reason",)
    nccl_used: bool
    backend: str | None
    reason: str | None = None


@dataclass(frozen=True)
class TopologySection(Section):
    """A launch's `--nccl-debug` fabric checks: the topo sections nested under "topology"."""

    KEYS: ClassVar[tuple[str, ...]] = ("topology",)
    topology: RunTopology | NcclNotUsed

    @classmethod
    def present_in(cls, doc: Mapping[str, object]) -> bool:
        return isinstance(doc.get("topology"), dict)


@dataclass(frozen=True)
class DiffSection(Section):
    """Two runs compared (`diff`, `profile --baseline`; docs/diff.md): the "diff" object of analyses/diff.RunDiff."""

    KEYS: ClassVar[tuple[str, ...]] = ("diff",)
    diff: DiffJson

    @classmethod
    def present_in(cls, doc: Mapping[str, object]) -> bool:
        return isinstance(doc.get("diff"), dict)


# Which sections each command's report may hold, in output order (Report.from_json picks the ones present).
@dataclass(frozen=True)
class TuneSection(Section):
    """`ddpdoctor tune` (docs/tune.md): each measured variant against the baseline ("variants"), and the baseline,
    every variant considered and why, the experiment's design, the what-if and the script's hash ("tune")."""

    KEYS: ClassVar[tuple[str, ...]] = ("variants", "tune")
    variants: list[VariantJson]
    tune: TuneJson


@dataclass(frozen=True)
class NodeSection(Section):
    """Which node of a multi-node launch printed the report (docs/json.md: ``node_rank``, ``nnodes``, ``host``,
    ``is_head``, ``head``); a job of one node has none."""

    KEYS: ClassVar[tuple[str, ...]] = ("node",)
    node: NodeInfoDoc


COMMAND_SECTIONS: dict[str, tuple[type[Section], ...]] = {
    "analyze": (PerfSection,),
    "profile": (PerfSection, RunDirSection, JobSection, HangSection, TopologySection, DiffSection, NodeSection),
    "run": (RunDirSection, JobSection, HangSection, TopologySection, NodeSection),
    "check-sync": (RunDirSection, JobSection, HangSection, SyncChecksSection),
    "capture": (RunDirSection, PerfSection, SyncChecksSection),
    "logs": (LogsSection,),
    "topo": (RunDirSection, NcclUseSection, TopoSection),
    "preflight": (PreflightSection,),
    "diff": (DiffSection,),
    "tune": (TuneSection,),
}


S = TypeVar("S", bound=Section)


def section_of(report: Report, kind: type[S]) -> S | None:
    """The report's section of type ``kind``: its typed section, else the one its plain JSON sections hold (a Report
    built from plain sections, by a test or a builder not moved here yet), loaded typed; None when it has none."""
    found = report.section(kind)
    if found is None and kind in COMMAND_SECTIONS.get(report.command, ()):
        raw = report.sections
        if kind.present_in(raw) or any(k in raw for k in kind.KEYS):
            return kind.from_json(raw)
    return found


def load_report(doc: Mapping[str, Any]) -> Report:
    """A saved report.json (or a command's --json) as a Report with typed sections, ready to render again."""
    return Report.from_json(doc, COMMAND_SECTIONS.get(str(doc.get("command", "")), ()))
