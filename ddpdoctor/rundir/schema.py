"""The typed, versioned schema of every file ddpdoctor writes into a run directory (msgspec Structs).

Every field has a default, so run directories written before a field existed (or before ``schema_version``) still
load; unknown fields are ignored, so a newer ddpdoctor's files load in an older one. What a field holds is checked
on load (rundir/artefacts.py): a value of another type is bad input naming the file and the field path.

To add a field: add it here with a default (``None`` or an empty container) and its type; raise the artefact's
version in VERSIONS only when an existing field changes meaning."""

from __future__ import annotations

import msgspec

# Every artefact's schema is importable from here; the base types, check-sync's files and the preflight's have
# modules of their own (schema_base.py, schema_sync.py, schema_preflight.py), re-exported below.
from ddpdoctor.rundir.schema_base import Artefact as Artefact
from ddpdoctor.rundir.schema_base import Json as Json
from ddpdoctor.rundir.schema_base import Number as Number
from ddpdoctor.rundir.schema_preflight import PreflightGathered as PreflightGathered
from ddpdoctor.rundir.schema_preflight import PreflightRecord as PreflightRecord
from ddpdoctor.rundir.schema_sync import DataRecord as DataRecord
from ddpdoctor.rundir.schema_sync import DatasetFingerprint as DatasetFingerprint
from ddpdoctor.rundir.schema_sync import Equivalence as Equivalence
from ddpdoctor.rundir.schema_sync import Fingerprint as Fingerprint
from ddpdoctor.rundir.schema_sync import GatheredSync as GatheredSync
from ddpdoctor.rundir.schema_sync import InitConflict as InitConflict
from ddpdoctor.rundir.schema_sync import LoaderEpoch as LoaderEpoch
from ddpdoctor.rundir.schema_sync import LoaderRecord as LoaderRecord
from ddpdoctor.rundir.schema_sync import OutsideParam as OutsideParam
from ddpdoctor.rundir.schema_sync import SamplerFacts as SamplerFacts
from ddpdoctor.rundir.schema_sync import Scalar as Scalar
from ddpdoctor.rundir.schema_sync import ShardedBy as ShardedBy
from ddpdoctor.rundir.schema_sync import SubsetInfo as SubsetInfo
from ddpdoctor.rundir.schema_sync import SyncModule as SyncModule
from ddpdoctor.rundir.schema_sync import SyncRecord as SyncRecord
from ddpdoctor.rundir.schema_sync import SyncRow as SyncRow
from ddpdoctor.rundir.summary_records import (
    Bucket,
    CollectiveCall,
    GradReady,
    InputInfo,
    RankMetrics,
    SyncCall,
    UnitCollective,
)

# ---- the DDP layout a rank recorded (info.json, manifest.json ddp_modules) -----------------------------------

class BucketLayout(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int | None = None
    bytes: int | None = None
    param_indices: list[int] = []
    params: list[str] = []


class ParamInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    numel: int | None = None
    bytes: int | None = None
    dtype: str | None = None


class DDPModule(msgspec.Struct, kw_only=True, omit_defaults=True):
    module_class: str | None = None
    bucket_cap_mb: Number | None = None
    bucket_cap_bytes: int | None = None
    find_unused_parameters: bool | None = None
    static_graph: bool | None = None
    gradient_as_bucket_view: bool | None = None
    broadcast_buffers: bool | None = None
    built_by: str | None = None  # a framework that built the DDP module itself (transformers, lightning, accelerate)
    parameter_count: int | None = None
    parameter_bytes: int | None = None
    parameter_tensors: int | None = None
    parameters_ignored: list[str] = []
    parameters: list[ParamInfo] = []
    buckets: list[BucketLayout] = []
    buckets_rebuilt: bool | None = None
    grad_ready_order: list[int] | None = None
    iteration: int | None = None
    world_size: int | None = None
    backend: str | None = None


# ---- the parallelism a rank built (info.json parallelism, manifest.json parallelism; probes/parallelism.py) -----

class MeshInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    device_type: str | None = None
    dim_names: list[str] = []
    shape: list[int] = []
    ranks: list[int] = []  # row-major rank table; empty past 4,096 ranks


class FSDPUnit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One FSDP2 unit: a `fully_shard` call's parameter group, all-gathered and reduce-scattered as one."""

    fqn: str = "?"
    module_class: str | None = None
    kind: str = "fsdp"  # fsdp (1-D shard), hsdp (shard + replicate dims), replicate
    mesh: int | None = None  # index into Parallelism.meshes
    shard_dim: str | None = None
    replicate_dim: str | None = None
    param_tensors: int = 0
    param_names: list[str] = []
    numel: int = 0
    bytes: int = 0  # unsharded
    sharded_bytes: int = 0  # one rank's shard
    reshard_after_forward: bool | int | None = None
    forward_prefetch: list[str] = []
    backward_prefetch: list[str] = []
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    is_root: bool = False


class FSDP1Module(msgspec.Struct, kw_only=True, omit_defaults=True):
    module_class: str | None = None
    sharding_strategy: str | None = None
    world_size: int | None = None
    use_orig_params: bool | None = None


class DTensorParam(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    mesh: int | None = None
    placements: list[str] = []
    shape: list[int] = []


class Parallelism(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What data/tensor parallelism a rank built: DDP modules (counted; their layout is ddp_modules), FSDP2 units,
    FSDP1 modules, DTensor (tensor-parallel) parameters and the meshes they live on."""

    kinds: list[str] = []  # ddp, fsdp2, hsdp, replicate, fsdp1, tp
    ddp_modules: int = 0
    fsdp2_units: list[FSDPUnit] = []
    fsdp1_modules: list[FSDP1Module] = []
    meshes: list[MeshInfo] = []
    dtensor_params: list[DTensorParam] = []
    dtensor_param_count: int = 0
    torch: str | None = None


class GroupInfo(msgspec.Struct, kw_only=True):
    name: str | None = None
    ranks: list[int] = []


class ProcessGroupInfo(msgspec.Struct, kw_only=True):
    backend: str | None = None
    world_size: int | None = None
    groups: list[GroupInfo] = []


# ---- manifest.json ---------------------------------------------------------------------------------------------

class RankEnd(msgspec.Struct, kw_only=True):
    rank: int
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    exception: str | None = None
    steps_completed: int | None = None
    status: str | None = None
    host_cpus: int | None = None  # cores the rank could run on
    local_world_size: int | None = None  # ranks on its host


class ScheduleRecord(msgspec.Struct, kw_only=True):
    """The profiler schedule as the manifest records it (probes/config.py Schedule is the live one)."""

    wait: int | None = None
    warmup: int | None = None
    active: int | None = None
    repeat: int | None = None


class RunEnded(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the run ended, as the launcher wrote it: "running" until it ends, then "exited" (exit_code), "hang",
    "signal" (ddpdoctor was stopped: signal, signum) or "ddpdoctor-error" (error)."""

    how: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    signum: int | None = None
    error: str | None = None


class Manifest(Artefact, kw_only=True):
    schema: int | None = None  # the pre-versioning field, kept for older readers
    ddpdoctor_version: str | None = None
    mode: str | None = None
    command_line: list[str] = []
    script: str | None = None
    script_sha256: str | None = None  # the script file's hash at launch (diff's "what else changed")
    host_load: Number | None = None  # the launching host's 1-minute load average at launch
    oom_kills_at_start: int | None = None  # /proc/vmstat oom_kill at launch and at the end (None: unreadable)
    oom_kills_at_end: int | None = None
    script_args: list[str] = []
    launcher: str | None = None
    launcher_host: str | None = None
    torchrun_flags: dict[str, Json] = {}
    schedule: ScheduleRecord | None = None
    options: dict[str, Json] = {}
    started_at: str | None = None
    finished: bool = False
    exit_code: int | None = None
    duration_s: Number | None = None
    killed_by: str | None = None
    world_size: int | None = None
    ranks: list[RankEnd] = []
    hosts: list[str] = []
    backend: str | None = None
    versions: dict[str, Json] | None = None
    env: dict[str, str | None] | None = None
    # rank -> that rank's DDP modules (keys are ranks as strings in the file)
    ddp_modules: dict[int, list[DDPModule]] = {}
    # The parallelism the lowest rank that recorded one built, and the ranks whose units or kinds differ from it
    parallelism: Parallelism | None = None
    parallelism_differs: list[int] = []
    ended: RunEnded | None = None
    # The disk under the run directory filled during the run (rundir/reserve.py): when, and what was not written
    disk_full: dict[str, Json] | None = None


# ---- ranks/rankR/info.json, status.json, summary.json ----------------------------------------------------------

class RankInfo(Artefact, kw_only=True):
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    host_cpus: int | None = None
    local_world_size: int | None = None
    versions: dict[str, Json] | None = None
    env: dict[str, str | None] | None = None
    process_group: ProcessGroupInfo | None = None
    ddp_modules: list[DDPModule] = []
    parallelism: Parallelism | None = None


class RankStatus(Artefact, kw_only=True):
    exit_code: int | None = None
    rank: int | None = None
    steps_completed: int | None = None
    step_times_s: list[Number | None] = []  # null: a time that was NaN/Infinity (safe_io reads those as null)
    duration_s: Number | None = None
    ddp_modules: int | None = None
    parallelism: list[str] = []  # kinds other than DDP the rank built (fsdp2, hsdp, fsdp1, tp), when any
    traces: list[str] = []
    ended_at: Number | None = None
    exception: str | None = None
    exception_type: str | None = None
    traceback: str | None = None
    signal: str | None = None
    stopped_by: str | None = None


class RankSummary(Artefact, kw_only=True):
    """One rank's trace reduced to its RankResult (analyses/summary.py writes it)."""

    schema: int | None = None
    window: str = "all"
    input: InputInfo
    metrics: RankMetrics
    calls: list[CollectiveCall] = []
    buckets: list[Bucket] = []
    grad_ready: list[GradReady] = []
    syncs: list[SyncCall] = []
    host: str | None = None
    notes: list[str] = []
    fsdp: list[UnitCollective] = []  # FSDP2 units' collectives (analyses/fsdp_units.py)


class SummaryError(Artefact, kw_only=True):
    error: str | None = None


# ---- RUN/heartbeats.json, RUN/hang.json (the launcher's monitor) ------------------------------------------------

class Beat(msgspec.Struct, kw_only=True):
    type: str | None = None
    rank: int | None = None
    pid: int | None = None
    time: Number | None = None
    step: int | None = None
    phase: str | None = None
    step_started: Number | None = None
    last_step_s: Number | None = None
    max_step_s: Number | None = None
    collective: dict[str, Json] | None = None
    last_collective: dict[str, Json] | None = None
    where: str | None = None


class RankExit(msgspec.Struct, kw_only=True):
    exit_code: int | None = None
    exception: str | None = None
    steps_completed: int | None = None


class RankBeats(msgspec.Struct, kw_only=True):
    beat: Beat | None = None
    exit: RankExit | None = None


class Heartbeats(Artefact, kw_only=True):
    world_size: int | None = None
    ranks: dict[int, RankBeats] = {}
    monitor: dict[str, Json] | None = None  # the watcher's own counters: rejected connections, stalls


class Position(msgspec.Struct, kw_only=True):
    rank: int | None = None
    state: str | None = None
    phase: str | None = None
    step: int | None = None
    op: str | None = None
    group: str | None = None
    seq: int | None = None
    sizes: list[Json] = []
    call_site: str | None = None
    exit_code: int | None = None
    unit: str | None = None


class HangFileDiagnosis(msgspec.Struct, kw_only=True):
    """hang.json's "diagnosis" as written (findings/hang.py HangDiagnosis is the verdict it came from)."""

    # Required: the hang findings read them directly.
    culprit_ranks: list[int]
    stalled_ranks: list[int]
    reason: str
    kind: str
    collective: dict[str, Json] | None = None
    positions: dict[int, Position] = {}
    differs: list[str] = []
    sources: dict[int, list[str]] = {}


class HangClass(msgspec.Struct, kw_only=True):
    """Ranks that share a state and a stack (job/grouping.py), as a multi-node hang.json lists them."""

    count: int | None = None
    ranks: str | None = None  # as ranges: "0-511,513-1023"
    state: str | None = None
    representative: int | None = None
    nodes: str | None = None
    stack: str | None = None


class Hang(Artefact, kw_only=True):
    detected_after_s: Number | None = None
    reported_after_s: Number | None = None
    hang_timeout_s: Number | None = None
    startup_timeout_s: Number | None = None
    in_startup: bool | None = None
    on_hang: str | None = None
    diagnosis: HangFileDiagnosis
    stacks: dict[int, str | None] = {}
    heartbeats: dict[int, Beat | None] = {}
    flight_recorder: dict[int, Json] = {}
    classes: list[HangClass] | None = None  # multi-node: ranks grouped by state and stack


class ReportFile(Artefact, kw_only=True):
    """RUN/report.json: written for people and tools; ddpdoctor itself only checks its envelope."""

    command: str | None = None
    status: str | None = None
    findings: list[dict[str, Json]] = []


class AppliedSetting(msgspec.Struct, kw_only=True):
    """What tune's probe did to one DDP module: the options the script passed, the ones it set, the hook."""

    given: dict[str, float | bool | str | None] = {}  # as the script passed them (write_json: str for others)
    options: dict[str, float | bool] = {}
    comm_hook: str | None = None


class RankTune(Artefact, kw_only=True):
    """ranks/rankR/tune.json: what `ddpdoctor tune`'s probe applied in one trial launch, and the loss of each
    iteration (a string for a loss that was not finite)."""

    setting: dict[str, float | bool | str] = {}  # analyses/tune.py Setting
    stop_after: int | None = None
    applied: list[AppliedSetting] = []
    errors: list[str] = []
    loss_per_iteration: list[Number | str | None] = []


# The current version of each artefact (stamped on write); bump when a field changes meaning.
VERSIONS: dict[type[Artefact], int] = {
    Manifest: 2, RankInfo: 1, RankStatus: 1, RankSummary: 2, SummaryError: 1, Heartbeats: 1, Hang: 1,
    SyncRecord: 1, DataRecord: 1, PreflightRecord: 1, PreflightGathered: 1, ReportFile: 1, RankTune: 1,
}

# Which schema a file name has (the writer stamps schema_version from it; the loader validates with it).
BY_NAME: dict[str, type[Artefact]] = {
    "manifest.json": Manifest, "info.json": RankInfo, "status.json": RankStatus, "summary.json": RankSummary,
    "summary-error.json": SummaryError, "heartbeats.json": Heartbeats, "hang.json": Hang, "sync.json": SyncRecord,
    "data.json": DataRecord, "preflight.json": PreflightRecord, "report.json": ReportFile, "tune.json": RankTune,
}
