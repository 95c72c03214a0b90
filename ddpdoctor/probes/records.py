"""The shapes of what a rank writes into the run directory and sends to the monitor: status.json, info.json,
sync.json, data.json, tune.json and the heartbeat's messages.

TypedDicts, not classes: each is a JSON document the rank builds in its user's process and writes as it is, so the
shapes type the dicts at no cost per step and without changing a byte of the files (rundir/schema.py validates
them on the way back in). Keys a rank adds only on some paths are optional (``total=False``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

# The heartbeat's and status.json's shapes live at the bottom (the monitor and the rules share them).
from ddpdoctor.rundir.records import BackwardState as BackwardState
from ddpdoctor.rundir.records import Beat as Beat
from ddpdoctor.rundir.records import CollectiveState as CollectiveState
from ddpdoctor.rundir.records import RankStatusDoc as RankStatusDoc

# ---- heartbeat -----------------------------------------------------------------------------------------------


class Dump(TypedDict):
    """The answer to the monitor's "dump" request."""

    type: str
    rank: int
    stacks: str
    flight_recorder: object  # torch's Flight Recorder JSON as torch writes it, or {"error": ...}


class CaptureReply(TypedDict, total=False):
    """A rank's answer to the monitor's "capture" request (probes/live.py): accepted, or the reason not."""

    type: str
    rank: int
    id: str
    what: str
    accepted: bool
    reason: str


# ---- status.json ----------------------------------------------------------------------------------------------


# ---- info.json ------------------------------------------------------------------------------------------------


class Versions(TypedDict):
    torch: str
    cuda: str | None
    nccl: str | None
    cuda_available: bool
    device_count: int


class GroupDoc(TypedDict):
    name: str
    ranks: list[int]


class ProcessGroupDoc(TypedDict, total=False):
    backend: str
    world_size: int
    groups: list[GroupDoc]


class DDPConfig(TypedDict):
    """How a DDP module was built (ddp_recorder._config)."""

    module_class: str
    bucket_cap_mb: float | None
    find_unused_parameters: bool
    static_graph: bool
    gradient_as_bucket_view: bool
    broadcast_buffers: bool
    built_by: str | None


class ParamDoc(TypedDict):
    name: str
    numel: int
    bytes: int
    dtype: str


class BucketDoc(TypedDict):
    index: int
    bytes: int
    param_indices: list[int]
    params: list[str]


class DDPModuleDoc(DDPConfig):
    """A DDP module's configuration, parameters and bucket layout (info.json's ddp_modules)."""

    parameter_count: int
    parameter_bytes: int
    parameter_tensors: int
    parameters_ignored: list[str]
    parameters: list[ParamDoc]
    buckets: list[BucketDoc]
    buckets_rebuilt: bool
    grad_ready_order: list[int]
    iteration: int
    world_size: int
    backend: str | None
    bucket_cap_bytes: int | None


class MeshDoc(TypedDict):
    """A DeviceMesh a rank built on: its dim names, shape and rank table (row-major; empty past 4,096 ranks)."""

    device_type: str
    dim_names: list[str]
    shape: list[int]
    ranks: list[int]


class FSDPUnitDoc(TypedDict):
    """One FSDP2 unit (a `fully_shard` call's parameter group; probes/parallelism.py)."""

    fqn: str
    module_class: str
    kind: str  # fsdp (1-D shard), hsdp (shard + replicate dims), replicate
    mesh: int  # index into ParallelismDoc.meshes
    shard_dim: str | None
    replicate_dim: str | None
    param_tensors: int
    param_names: list[str]
    numel: int
    bytes: int  # unsharded
    sharded_bytes: int  # this rank's shard
    reshard_after_forward: bool | int
    forward_prefetch: list[str]
    backward_prefetch: list[str]
    param_dtype: str | None
    reduce_dtype: str | None
    is_root: bool


class FSDP1ModuleDoc(TypedDict):
    module_class: str
    sharding_strategy: str | None
    world_size: int
    use_orig_params: bool


class DTensorParamDoc(TypedDict):
    name: str
    mesh: int
    placements: list[str]
    shape: list[int]


class ParallelismDoc(TypedDict):
    """info.json's ``parallelism``: what data/tensor parallelism the rank built."""

    kinds: list[str]  # ddp, fsdp2, hsdp, replicate, fsdp1, tp
    ddp_modules: int
    fsdp2_units: list[FSDPUnitDoc]
    fsdp1_modules: list[FSDP1ModuleDoc]
    meshes: list[MeshDoc]
    dtensor_params: list[DTensorParamDoc]
    dtensor_param_count: int
    torch: str


class RankInfoDoc(TypedDict, total=False):
    """ranks/rankR/info.json (rundir/schema.py: RankInfo)."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int
    host_cpus: int | None
    local_world_size: int | None
    versions: Versions
    env: dict[str, str]
    process_group: ProcessGroupDoc | None
    ddp_modules: list[DDPModuleDoc]
    parallelism: ParallelismDoc


# ---- sync.json (check-sync) ---------------------------------------------------------------------------------

# Per tensor [numel, sum, sum of squares, 4 samples], or None: floats in the rank, a non-finite value written as its
# repr (JSON has no NaN).
Fingerprints = Sequence[Sequence[float | str] | None]


class EqualGroupDoc(TypedDict):
    """Ranks that must hold a parameter equal (this rank among them) and the mesh dims they replicate over."""

    ranks: list[int]
    over: list[str]


class _SyncModuleBuiltBy(TypedDict, total=False):
    built_by: str | None  # the framework that built this DDP (Lightning, HF Trainer, accelerate); DDP modules only
    # DTensor parameters (probes/fingerprints.placement_map): per parameter None (every rank), -1 (sharded: layout
    # only) or an index into equal_groups; param_layouts: global shape, mesh and placements
    equal_groups: list[EqualGroupDoc]
    param_equal_group: list[int | None]
    param_layouts: list[str | None]
    buffer_equal_group: list[int | None]  # the same map for the buffers (without DDP, DTensor buffers)


class SyncModuleDoc(_SyncModuleBuiltBy):
    index: int
    ddp: bool
    module_class: str
    broadcast_buffers: bool
    find_unused_parameters: bool
    params: list[str]
    ignored_params: list[str]
    frozen_params: list[str]
    buffers: list[str]
    batchnorm_buffers: list[str]


class FingerprintRow(TypedDict, total=False):
    """One module's fingerprints at one step: gradients (with how the forwards ran), parameters or buffers."""

    step: int
    module: int
    synced_forwards: int
    unsynced_forwards: int
    reduced: bool
    local_nonfinite: bool  # grads: this rank's own gradient held NaN/inf before DDP's all-reduce
    synced_by_ddp: bool | None
    fp: Fingerprints


class OutsideParam(TypedDict):
    name: str
    shape: list[int]


class EquivalenceResult(TypedDict, total=False):
    """sync.json's ``equivalence``: the relative error per parameter of DDP's gradient against one process's, or
    why the check was skipped (``skipped``), or that rank 0 computed it (``computed_on``)."""

    step: int
    skipped: str
    computed_on: int
    world_size: int
    caveats: list[str]
    batch_sizes: list[int]
    mode: str
    relative_error: dict[str, float | str | None]
    relative_error_per_rank_batches: dict[str, float | str | None]


class SyncDoc(TypedDict):
    """ranks/rankR/sync.json (rundir/schema.py: SyncRecord)."""

    rank: int
    world_size: int
    stop_after: int
    data_steps: int
    stopped_at: int | None
    stop_reason: str | None
    steps_completed: int
    check_seconds: float
    probe_failed: bool
    modules: list[SyncModuleDoc]
    optimizer_params_outside_ddp: list[OutsideParam]
    closure_steps: int
    grads: list[FingerprintRow]
    params: list[FingerprintRow]
    buffers: list[FingerprintRow]
    optimizers: list[str]  # the class of each optimizer whose step() ran, in the order first seen
    # per optimizer (``module``: its index above), at each step end: fingerprints of [step() calls] and
    # [min, max of state['step'] over its parameters] (empty when it keeps none): equal on every rank
    optimizer_steps: list[FingerprintRow]
    equivalence: EquivalenceResult | None


# ---- data.json (check-sync's DataLoader recorder, probes/sampler.py) -------------------------------------------

Scalar = bool | int | float | str


# A batch sampler that hands each rank every num_processes-th batch (accelerate's BatchSamplerShard).
ShardFacts = TypedDict("ShardFacts", {"class": str, "num_processes": int, "process_index": int})


# What the loader's index sampler says about itself ("class" is a keyword, hence the functional form). The
# attributes read from any sampler (shuffle, seed, ...) are whatever scalar the user's class holds.
SamplerFacts = TypedDict("SamplerFacts", {
    "class": str, "distributed": bool, "num_replicas": int, "rank": int, "shuffle": Scalar, "seed": Scalar,
    "drop_last": Scalar, "replacement": Scalar, "total_size": int, "epoch": int,
    "sharded_by": ShardFacts, "framework": str,
}, total=False)


class DatasetFingerprint(TypedDict, total=False):
    """A map-style dataset's length and the hashes of its first and last samples, or why there are none."""

    len: int
    first: str
    last: str
    varies: bool
    error: str


class SubsetFacts(TypedDict):
    """A loader over (nested) Subsets: the dataset under them and a hash of the indices they select."""

    root_class: str
    root_len: int
    hash: str


class EpochRecord(TypedDict, total=False):
    """One pass over a loader (one ``iter()``); ``indices`` for the first few epochs only, ``peek`` when no step
    followed it."""

    epoch: int
    batches_yielded: int
    steps: int
    sample_hashes: list[str]
    sampler_epoch: int | None
    len: int | None
    batches: int | None
    order_hash: str
    truncated: bool
    indices: list[int]
    root_indices: list[int]
    peek: bool


class LoaderDoc(TypedDict):
    """One DataLoader the script built, as data.json holds it."""

    loader: int
    subset: SubsetFacts | None
    dataset_fp: DatasetFingerprint | None
    dataset_class: str
    dataset_len: int | None
    iterable: bool
    batch_size: int | None
    drop_last: bool
    shuffle_arg: bool
    sampler_arg: bool
    batch_sampler_arg: bool
    num_workers: int
    sampler: SamplerFacts | None
    epochs: list[EpochRecord]


class InitConflict(TypedDict):
    """A DataLoader(shuffle=True, sampler=...) the constructor refused."""

    error: str
    sampler: str


class DataDoc(TypedDict):
    """What the recorder saw (data.json without its ``rank``)."""

    loaders: list[LoaderDoc]
    init_conflicts: list[InitConflict]
    set_epoch_calls: int


# ---- tune.json ----------------------------------------------------------------------------------------------


class TuneApplied(TypedDict):
    """What one DDP module of a trial was built with: the options the script gave, those the trial set, the hook."""

    given: dict[str, object]
    options: dict[str, object]
    comm_hook: str | None
