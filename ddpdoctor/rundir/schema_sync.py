"""The schema of check-sync's files (msgspec Structs; the rules of rundir/schema.py apply): a rank's fingerprints
(ranks/rankR/sync.json), its DataLoaders' record (data.json), and rank 0's gathered copy of both (sync-all.json)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ddpdoctor.rundir.schema_base import Artefact, Number

# per tensor; non-finite values are written as their repr ("nan", "inf", "-inf")
Fingerprint = list[Number | Literal["nan", "inf", "-inf"]] | None


class EqualGroup(msgspec.Struct, kw_only=True):
    ranks: list[int] = []
    over: list[str] = []  # the mesh dims the parameter is Replicate() over


class SyncModule(msgspec.Struct, kw_only=True):
    index: int
    ddp: bool | None = None  # False: the optimizer's parameters, compared without a DDP module
    module_class: str | None = None
    broadcast_buffers: bool | None = None
    find_unused_parameters: bool | None = None
    params: list[str] = []
    ignored_params: list[str] = []
    frozen_params: list[str] = []
    buffers: list[str] = []
    batchnorm_buffers: list[str] = []
    built_by: str | None = None  # the framework that built this DDP module (probes/ddp_recorder._built_by)
    # DTensor parameters (FSDP2, HSDP, TP): per parameter None (every rank must agree), -1 (sharded: only the
    # layout must agree) or an index into equal_groups (the ranks this one must agree with)
    equal_groups: list[EqualGroup] = []
    param_equal_group: list[int | None] = []
    param_layouts: list[str | None] = []
    buffer_equal_group: list[int | None] = []  # the same map for the buffers (DTensor buffers, without DDP)


class SyncRow(msgspec.Struct, kw_only=True):
    step: int
    module: int
    fp: list[Fingerprint] = []
    synced_by_ddp: bool | None = None
    synced_forwards: int | None = None
    unsynced_forwards: int | None = None
    reduced: bool | None = None
    local_nonfinite: bool | None = None  # grads: this rank's own gradient held NaN/inf before DDP's all-reduce


class OutsideParam(msgspec.Struct, kw_only=True):
    """A parameter the optimizer updates that belongs to no DDP module."""

    name: str
    shape: list[int] = []


class Equivalence(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The equivalence check (probes/equivalence.py): DDP's averaged gradient against one process's, per
    parameter (a relative error, or a string saying why not), or why it was skipped. Written out as recorded."""

    step: int | None = None
    skipped: str | None = None
    computed_on: int | None = None
    world_size: int | None = None
    caveats: list[str] | None = None
    batch_sizes: list[int] | None = None
    mode: str | None = None
    relative_error: dict[str, float | str | None] | None = None
    relative_error_per_rank_batches: dict[str, float | str | None] | None = None


class SyncRecord(Artefact, kw_only=True):
    rank: int | None = None
    world_size: int | None = None
    stop_after: int | None = None
    stopped_at: int | None = None
    steps_completed: int | None = None
    check_seconds: Number | None = None
    modules: list[SyncModule] = []
    optimizer_params_outside_ddp: list[OutsideParam] = []
    closure_steps: int | None = None  # optimizer.step(closure) calls seen (grads read when the closure returns)
    grads: list[SyncRow] = []
    params: list[SyncRow] = []
    buffers: list[SyncRow] = []
    optimizers: list[str] = []  # each optimizer's class, in the order its step() first ran
    # per optimizer (module = its index), per step end: fingerprints of [step() calls], [min, max state['step']]
    optimizer_steps: list[SyncRow] = []
    equivalence: Equivalence | None = None
    data_steps: int | None = None  # steps the data recorder runs past the fingerprint window


class LoaderEpoch(msgspec.Struct, kw_only=True):
    epoch: int | None = None
    batches_yielded: int | None = None
    batches: int | None = None
    steps: int = 0
    len: int | None = None
    sampler_epoch: int | None = None
    order_hash: str | None = None
    indices: list[int] | None = None
    root_indices: list[int] | None = None  # a Subset's indices in its root dataset
    sample_hashes: list[str] | None = None
    truncated: bool = False  # a capped (endless) sampler: the record spans several passes
    peek: bool = False  # abandoned before any training step (a look at the first batch): not an epoch


class SubsetInfo(msgspec.Struct, kw_only=True):
    """A loader's dataset is a Subset (of a Subset ...) of a root dataset: which one, and a hash of its indices."""

    root_class: str | None = None
    root_len: int | None = None
    hash: str | None = None


class DatasetFingerprint(msgspec.Struct, kw_only=True):
    """A map-style dataset's length and first and last samples' hashes (probes/dataset_hashes.py dataset_fingerprint)."""

    len: int | None = None
    first: str | None = None
    last: str | None = None
    varies: bool = False  # loading a sample twice gave other bytes (random augmentation)
    error: str | None = None


class ShardedBy(msgspec.Struct, kw_only=True):
    """A batch sampler that hands each rank its share of the batches (accelerate's BatchSamplerShard)."""

    num_processes: int | None = None
    process_index: int | None = None


Scalar = int | float | str | bool | None


class SamplerFacts(msgspec.Struct, kw_only=True, rename={"class_name": "class"}):
    """A loader's sampler as probes/sampler_facts.py describes it."""

    class_name: str | None = None
    distributed: bool | None = None
    num_replicas: int | None = None
    rank: int | None = None
    # A sampler of the script's own may hold any scalar in these attributes (probes/sampler_facts.py copies them).
    shuffle: Scalar = None
    seed: Scalar = None
    drop_last: Scalar = None
    total_size: int | None = None
    replacement: Scalar = None
    epoch: int | None = None
    sharded_by: ShardedBy | None = None
    framework: str | None = None  # "lightning" / "accelerate" when loaded (they shard the loader themselves)


class LoaderRecord(msgspec.Struct, kw_only=True):
    loader: int
    subset: SubsetInfo | None = None
    dataset_fp: DatasetFingerprint | None = None
    dataset_class: str | None = None
    dataset_len: int | None = None
    iterable: bool | None = None
    batch_size: int | None = None
    drop_last: bool | None = None
    shuffle_arg: bool | None = None
    sampler_arg: bool | None = None
    batch_sampler_arg: bool | None = None
    num_workers: int | None = None
    sampler: SamplerFacts | None = None
    epochs: list[LoaderEpoch] = []


class InitConflict(msgspec.Struct, kw_only=True):
    """DataLoader(shuffle=True) with a sampler: PyTorch refused it (``error``)."""

    error: str | None = None
    sampler: str | None = None


class DataRecord(Artefact, kw_only=True):
    rank: int | None = None
    loaders: list[LoaderRecord] = []
    init_conflicts: list[InitConflict] = []
    set_epoch_calls: int = 0


class GatheredSync(msgspec.Struct, kw_only=True):
    sync: SyncRecord | None = None
    data: DataRecord | None = None
