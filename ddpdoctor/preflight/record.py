"""The shapes of a rank's preflight record (RUN/ranks/rankR/preflight.json): what the worker writes, the merge reads.

TypedDicts, not classes: the record is a JSON document a rank rewrites after every check and the parent reads back
(validated by rundir/schema.py's PreflightRecord), so the shapes type the dicts without changing a byte of it."""

from __future__ import annotations

from typing import Any, TypedDict


class CheckOutcome(TypedDict, total=False):
    """One check's result on one rank; ``seconds`` is added by the worker, ``evidence`` differs per check."""

    status: str  # checks.PASS / WARN / FAIL / SKIPPED
    summary: str
    evidence: dict[str, Any]  # the check's evidence map (free-form per check: shown and copied into the report)
    seconds: float


class DeviceFacts(TypedDict, total=False):
    """The GPUs a rank sees (local.devices); ``error`` when probing CUDA itself failed."""

    cuda_available: bool
    count: int
    cuda_visible_devices: str | None
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    error: str


class IbPort(TypedDict):
    """One InfiniBand/RoCE port of the rank's host (local.ib_ports)."""

    device: str
    port: str
    active: bool
    rate_gbit: float | None


class RankPreflight(TypedDict, total=False):
    """A rank's whole record; keys appear as the worker gets that far (a killed rank leaves a partial one)."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int
    started: float
    finished: bool
    env: dict[str, str | None]
    dist_env: dict[str, str]
    versions: dict[str, str | None]
    devices: DeviceFacts
    ib_ports: list[IbPort]
    backend: str
    checks: dict[str, CheckOutcome]


Records = dict[int, RankPreflight]  # every rank's record, by rank
