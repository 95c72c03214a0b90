"""The JSON shape of the "diff" section (docs/json.md `diff`, docs/diff.md), as TypedDicts: what analyses/diff.py
RunDiff.to_json writes and the diff views read, from a fresh comparison or a saved report.json."""

from __future__ import annotations

from typing import TypedDict


class DeltaValueJson(TypedDict, total=False):
    value: float
    interval: list[float]  # [lo, hi], 90%
    n: int


class DeltaJson(TypedDict, total=False):
    """A {delta}: one figure per step on both sides, its change with an interval, and whether it is beyond noise."""

    base_ms: float
    new_ms: float
    delta_ms: DeltaValueJson
    pct_of_step: float | None
    significant: bool
    min_effect_ms: float


class PartDeltaJson(DeltaJson, total=False):
    """A part of the step that changed (a contributor or a component): which, of what kind, on which ranks."""

    component: str
    kind: str  # "resource" | "phase" | "comm_split"
    ranks: list[int]
    rank: int | None
    waiting_for: list[int]


class OperatorDeltaJson(DeltaJson, total=False):
    name: str
    kind: str  # "cpu" | "gpu"
    rank: int


class SidesJson(TypedDict, total=False):
    base: float | int | str | None
    new: float | int | str | None


class CollectiveDeltaJson(DeltaJson, total=False):
    op: str
    size_class: str
    calls_per_step: SidesJson
    busbw_gbps: SidesJson


class ChangeJson(TypedDict, total=False):
    """Something else that differs between the runs, and the parts of the step it could move."""

    key: str
    base: object
    new: object
    explains: list[str]


class BucketRowJson(TypedDict, total=False):
    index: int
    bytes: SidesJson
    dur_ms: SidesJson
    busbw_gbps: SidesJson


class LayoutJson(TypedDict, total=False):
    base: list[int]
    new: list[int]


class BucketsDiffJson(TypedDict, total=False):
    bucket_cap_mb: SidesJson
    layout_bytes: LayoutJson
    layout_changed: bool
    rows: list[BucketRowJson]


class StepsJson(TypedDict, total=False):
    base: int
    new: int


class CompositionJson(TypedDict, total=False):
    base: dict[str, float]
    new: dict[str, float]


class DiffJson(TypedDict, total=False):
    """The "diff" object."""

    base: str
    new: str
    world_size: int
    steps: StepsJson
    min_effect_ms: float
    step: DeltaJson
    by_rank: dict[str, DeltaJson]
    contributors: list[PartDeltaJson]
    components: list[PartDeltaJson]
    collectives: list[CollectiveDeltaJson]
    buckets: BucketsDiffJson | None
    changes: list[ChangeJson]
    composition_ms: CompositionJson
    caused_wait_ms_per_step: dict[str, dict[str, float]]
    comm_split: bool
    operators: list[OperatorDeltaJson]
    notes: list[str]
