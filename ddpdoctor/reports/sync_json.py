"""The JSON shape of check-sync's "checks" section (docs/check-sync.md), as TypedDicts: what reports/check_sync.py
writes and the check-sync view reads, from a fresh run or a saved report.json."""

from __future__ import annotations

from typing import TypedDict


class ModuleCheckJson(TypedDict, total=False):
    """A DDP module whose tensors were compared (the lowest rank's description)."""

    index: int
    # "class" (a Python keyword) is read with .get("class")
    parameters: int
    buffers: int
    broadcast_buffers: bool | None


class TensorCheckJson(TypedDict, total=False):
    """Gradients, parameters or buffers compared across ranks."""

    comparisons: int
    steps: list[int]
    diverged: int
    within_tolerance: int
    first_step: int | None


class ShardsJson(TypedDict, total=False):
    """One training loader's epoch: how its samples were split across ranks."""

    loader: int
    epoch: int
    by: str  # "indices" | "root_indices" | "hashes"
    samples_per_rank: dict[str, int]
    batches_per_rank: dict[str, int | None]
    shared: int
    missing: int | None


class LayoutCheckJson(TypedDict):
    """DTensor parameters' layouts (global shape, mesh, placements) compared across every rank."""

    comparisons: int
    differ: int


class ChecksJson(TypedDict, total=False):
    """The "checks" object."""

    ranks: list[int]
    steps_checked: int
    steps_run: int
    modules: list[ModuleCheckJson]
    grads: TensorCheckJson
    params: TensorCheckJson
    buffers: TensorCheckJson
    layouts: LayoutCheckJson  # only when DTensor parameters were recorded (FSDP2, HSDP, TP)
    optimizer_steps: TensorCheckJson  # only when optimizer step counts were recorded
    data: list[ShardsJson]
    equivalence: dict[str, object] | None  # probes/equivalence.py's result as recorded (rundir Equivalence)
