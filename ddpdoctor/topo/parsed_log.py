"""The parsed NCCL_DEBUG=INFO log (NcclLog, which nccl_log.py fills and analysis.py and the rules read): per host,
per rank, per connection kind, and the job-wide channels, rings and trees, each with the line that said it."""

from __future__ import annotations

from dataclasses import dataclass, field

Version = tuple[int, int]


@dataclass(frozen=True)
class Line:
    """One evidence line: where it was and what it said (clipped, so a runaway line cannot bloat a report)."""

    file: str
    lineno: int
    text: str

    def ref(self) -> str:
        text = self.text if len(self.text) <= 240 else self.text[:239] + "…"
        return f"{self.file}:{self.lineno}: {text}"


@dataclass
class HostInfo:
    name: str
    versions: dict[str, Line] = field(default_factory=dict)  # explicit "2.19.3+cuda12.3" -> first line
    fingerprints: list[tuple[Version, Version, Line]] = field(default_factory=list)
    bootstrap_ifaces: dict[str, str] = field(default_factory=dict)  # iface -> address
    socket_ifaces: dict[str, str] = field(default_factory=dict)
    iface_lines: dict[str, Line] = field(default_factory=dict)  # iface -> first line naming it
    ib_devices: dict[str, str] = field(default_factory=dict)  # "mlx5_0:1" -> "IB" | "RoCE" | ...
    ib_devices_line: Line | None = None
    ib_no_device: Line | None = None
    networks: dict[str, Line] = field(default_factory=dict)  # "Using network X"
    plugins: dict[str, Line] = field(default_factory=dict)  # external net plugins: IBext, OFI, ...
    plugin_failures: list[Line] = field(default_factory=list)
    env: dict[str, tuple[str, Line]] = field(default_factory=dict)  # NCCL_X -> (value, line)
    gdr_hca: list[tuple[bool, str, Line]] = field(default_factory=list)  # (enabled, hca, line)
    gdr_ring: list[tuple[bool, Line]] = field(default_factory=list)  # "use ring PXN p GDR g"
    nvls: dict[int, tuple[bool, Line]] = field(default_factory=dict)  # cudaDev -> (available, line)
    nvlink: Line | None = None  # an NVL[...] link in the GRAPH topology print
    nvswitch: Line | None = None  # an NVS/... node in the GRAPH topology print
    cuda_driver: str | None = None
    gpu_names: dict[int, str] = field(default_factory=dict)  # cudaDev -> name (nccl-tests header)
    pids: set[int] = field(default_factory=set)
    devs: set[int] = field(default_factory=set)


@dataclass
class RankInfo:
    rank: int
    host: str | None = None
    cuda_dev: int | None = None
    bus_id: str | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    gpu_name: str | None = None
    line: Line | None = None


@dataclass
class ConnStat:
    """All lines of one (src, dst, transport) connection kind, folded: count plus the first line."""

    src: int
    dst: int
    transport: str  # as printed, e.g. "NET/IB/5/GDRDMA", "P2P/CUMEM/read", "SHM/direct/direct"
    kind: str  # normalised: P2P/IPC, P2P/CUMEM, P2P/direct, NVLS, SHM, NET/IB, NET/Socket, ...
    gdr: bool
    host: str
    count: int
    line: Line

    @property
    def is_net(self) -> bool:
        return self.kind.startswith("NET/") or self.kind.startswith("COLLNET")


@dataclass
class NcclLog:
    files: list[str] = field(default_factory=list)
    hosts: dict[str, HostInfo] = field(default_factory=dict)
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    connections: dict[tuple[int, int, str], ConnStat] = field(default_factory=dict)
    coll_channels: tuple[int, Line] | None = None
    nvls_channels: tuple[int, Line] | None = None
    collnet_channels: tuple[int, Line] | None = None
    rings: tuple[int, Line] | None = None  # total rings from "Channel NN/MM :" lists
    ring_ranks: set[int] = field(default_factory=set)  # every rank named in those lists
    trees: list[Line] = field(default_factory=list)
    tree_channels: tuple[int, Line] | None = None
    warnings: list[Line] = field(default_factory=list)
    p2p_disabled: list[Line] = field(default_factory=list)
    rdma_errors: list[Line] = field(default_factory=list)
    algo_ignored: list[Line] = field(default_factory=list)
    inits: list[tuple[str, int, int, int, Line]] = field(default_factory=list)  # (host, pid, rank, nranks, line)
    nccl_lines: int = 0
    lines_read: int = 0

    def host(self, name: str) -> HostInfo:
        info = self.hosts.get(name)
        if info is None:
            info = self.hosts[name] = HostInfo(name)
        return info

    def rank(self, rank: int) -> RankInfo:
        info = self.ranks.get(rank)
        if info is None:
            info = self.ranks[rank] = RankInfo(rank)
        return info
