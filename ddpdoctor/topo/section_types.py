"""The JSON shapes of `topo`'s report sections (docs/topo.md, docs/json.md): what analysis.py builds from the facts.

TypedDicts: each section is a JSON document the report carries as it is, so the shapes type it without changing a
byte of the output."""

from __future__ import annotations

from typing import TypedDict


class TopoSummary(TypedDict):
    """"summary": nodes x GPUs, the transports inside and between nodes, GDR, NVLink, NCCL's versions and channels."""

    nodes: int | None
    gpus_per_node: int | None
    gpus_per_node_source: str | None
    world_size: int | None
    intra_node_transport: list[str]
    inter_node_transport: list[str]
    network: list[str]
    gdr: bool | None
    gdr_evidence: str | None
    nvlink: bool
    nccl_versions: list[str]
    coll_channels: int | None
    rings: int | None
    nvls_channels: int | None


class HostRow(TypedDict):
    """One host of "hosts": what its NCCL lines said."""

    host: str
    nccl_version: list[str] | None
    nccl_version_range: str | None
    cuda_driver: str | None
    ranks: list[int]
    bootstrap_ifaces: dict[str, str]
    socket_ifaces: dict[str, str]
    ib_devices: dict[str, str]
    network: list[str]
    plugins: list[str]
    env: dict[str, str]
    nvls: dict[str, bool]
    gpus: dict[str, str]


class RankRow(TypedDict):
    rank: int
    host: str | None
    cuda_dev: int | None
    bus_id: str | None
    nranks: int | None
    gpu: str | None


class GpuRow(TypedDict):
    busid: str
    dev: int | None
    sm: int | None
    numa: int | None
    gdr: bool | None
    pcie: str
    nvlinks: int
    nearest_nic: str | None
    nic_distance: str | None  # the PCI path class to it, as NCCL names it (PIX, PXB, PHB, SYS)


class NicRow(TypedDict):
    name: str
    dev: int | None
    speed_mbps: int | None
    numa: int | None
    gdr: bool | None
    pcie: str


class SystemRow(TypedDict):
    """One topology XML file of "topology"; a static file lists GPUs and NICs only as counts of PCI functions."""

    file: str
    kind: str
    truncated: bool
    numa_nodes: list[str]
    gpus: list[GpuRow] | int
    nics: list[NicRow] | int
    graphs: list[dict[str, str]]  # NCCL_GRAPH_DUMP_FILE <graph> attributes, as NCCL wrote them


class PeerRow(TypedDict):
    src: int
    dst: int
    transport: str
    kind: str
    gdr: bool
    inter_node: bool
    lines: int
    seen_on: str


class Transports(TypedDict):
    """"transports": connection lines by kind inside and between nodes, and the (src, dst, transport) pairs."""

    intra_node: dict[str, int]
    inter_node: dict[str, int]
    peers_total: int
    peers: list[PeerRow]


class Channels(TypedDict):
    coll_channels: int | None
    collnet_channels: int | None
    nvls_channels: int | None
    rings: int | None
    tree_channels: int | None
    ranks_in_rings: int
    trees: list[str]


class TopoInputs(TypedDict):
    logs: list[str]
    topology_files: list[str]
    nccl_lines: int


class TopoSections(TypedDict):
    """Every section `topo` reports, in output order (diagnose)."""

    summary: TopoSummary
    hosts: list[HostRow]
    ranks: list[RankRow]
    transports: Transports
    channels: Channels
    topology: list[SystemRow]
    warnings: list[str]
    inputs: TopoInputs


class RunTopology(TopoSections):
    """A run directory's "topology" (`--nccl-debug`, `topo RUN`): whether NCCL ran, its backend, then the sections."""

    nccl_used: bool
    backend: str | None


class NcclNotUsed(TypedDict):
    """A run directory whose job did not use NCCL, and why there is no fabric to check."""

    nccl_used: bool
    backend: str | None
    reason: str
