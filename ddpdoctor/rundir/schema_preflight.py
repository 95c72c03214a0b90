"""The schema of the preflight's files (msgspec Structs; the rules of rundir/schema.py apply): a rank's record
(ranks/rankR/preflight.json: its launcher variables, versions, devices and check results) and rank 0's gathered copy
(RUN/preflight.json), with the bandwidth sweep's row."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ddpdoctor.rundir.schema_base import Artefact, Number


@dataclass(frozen=True)
class BandwidthRow:
    """One all_reduce size of a bandwidth sweep, as nccl-tests prints it (preflight/nccltable.py computes it)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None = None  # nccl-tests' "#wrong" (or "error") column, when there is one


class ProbeCause(msgspec.Struct, kw_only=True):
    cause: str | None = None
    detail: str | None = None


class CheckEvidence(msgspec.Struct, kw_only=True):
    """The evidence fields the preflight merge reads (each check fills some of them)."""

    missing_ranks: list[int] = []
    probe: ProbeCause | None = None
    error: str | None = None
    master_addr: str | None = None
    master_port: int | str | None = None
    latency_us: Number | None = None
    world_size: int | None = None
    rows: list[BandwidthRow] = []  # the nccl-tests row dataclass itself
    gflops: Number | None = None
    offsets: dict[int, ClockOffset] = {}


class ClockOffset(msgspec.Struct, kw_only=True):
    offset_ms: Number
    rtt_ms: Number


class CheckRecord(msgspec.Struct, kw_only=True):
    status: str = "fail"
    summary: str | None = None
    evidence: CheckEvidence = msgspec.field(default_factory=CheckEvidence)
    seconds: Number | None = None


class Devices(msgspec.Struct, kw_only=True):
    cuda_available: bool | None = None
    count: int | None = None
    uuid: str | list[str] | None = None


class PreflightRecord(Artefact, kw_only=True):
    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    backend: str | None = None
    env: dict[str, str | None] = {}
    dist_env: dict[str, str | None] = {}
    versions: dict[str, str | int | float | bool | None] = {}
    devices: Devices | None = None
    checks: dict[str, CheckRecord] = {}


class PreflightGathered(Artefact, kw_only=True):
    ranks: dict[int, PreflightRecord] = {}
