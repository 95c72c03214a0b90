"""What a parsed NCCL log plus topology dumps say about the job: nodes x GPUs, transports, GDR (pure)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ddpdoctor.topo import versions
from ddpdoctor.topo.parsed_log import ConnStat, Line, NcclLog
from ddpdoctor.topo.section_types import (
    Channels,
    GpuRow,
    HostRow,
    RankRow,
    SystemRow,
    TopoSummary,
    Transports,
)
from ddpdoctor.topo.topo_xml import TopoSystem, nearest_nic

# GPU names that mean "point-to-point NVLink or NVSwitch present" (SXM/HGX boards) and consumer boards (no P2P
# validation by NVIDIA; PCIe P2P there relies on ACS/IOMMU being off).
_NVLINK_NAMES = re.compile(r"SXM|HGX|DGX|H100 80GB HBM3|H200|H20\b|B200|GB200|H800|A800-SXM", re.IGNORECASE)
_CONSUMER_NAMES = re.compile(r"GeForce|RTX \d{4}|TITAN", re.IGNORECASE)
_HOPPER_NAMES = re.compile(r"\b(H100|H200|H800|H20|GH200|B100|B200|GB200)\b", re.IGNORECASE)


@dataclass
class Facts:
    """Derived facts the rules share; everything a rule cites is here or in the log/topology it came from."""

    log: NcclLog
    systems: list[TopoSystem]
    rank_host: dict[int, str] = field(default_factory=dict)
    nodes: int = 0
    gpus_per_node: int | None = None
    gpus_per_node_source: str | None = None
    world_size: int | None = None
    intra: Counter[str] = field(default_factory=Counter)  # transport kind -> connection lines
    inter: Counter[str] = field(default_factory=Counter)
    intra_net: list[ConnStat] = field(default_factory=list)  # NET between two ranks of one host
    inter_conns: list[ConnStat] = field(default_factory=list)
    unknown_peers: set[int] = field(default_factory=set)
    gdr: bool | None = None
    gdr_why: str = ""
    nvlink: str | None = None  # evidence that NVLink exists
    nvswitch: str | None = None
    hopper: str | None = None  # evidence of Hopper-or-later GPUs
    pre_hopper: str | None = None  # evidence of older GPUs
    consumer: str | None = None
    host_versions: dict[str, tuple[versions.Version, versions.Version] | None] = field(default_factory=dict)


def _rank_host(log: NcclLog) -> dict[int, str]:
    return {r: i.host for r, i in log.ranks.items() if i.host is not None}


def derive(log: NcclLog, systems: list[TopoSystem]) -> Facts:
    f = Facts(log, systems, rank_host=_rank_host(log))
    for conn in log.connections.values():
        hs, hd = f.rank_host.get(conn.src), f.rank_host.get(conn.dst)
        if hs is not None and hd is not None:
            inter = hs != hd
        else:
            inter = conn.is_net  # NCCL uses NET only between nodes unless P2P and SHM are both off
            f.unknown_peers.update(r for r, h in ((conn.src, hs), (conn.dst, hd)) if h is None)
        (f.inter if inter else f.intra)[conn.kind] += conn.count
        if inter:
            f.inter_conns.append(conn)
        elif conn.is_net:
            f.intra_net.append(conn)
    _nodes(f)
    _gdr(f)
    _hardware(f)
    for name, host in log.hosts.items():
        f.host_versions[name] = versions.intersect([(lo, hi) for lo, hi, _ in host.fingerprints])
    return f


def _nodes(f: Facts) -> None:
    log = f.log
    nnodes = max((i.nnodes for i in log.ranks.values() if i.nnodes), default=0)
    f.nodes = max(nnodes, len(log.hosts))
    if f.inter_conns and len(set(f.rank_host.values())) <= 1:
        f.nodes = max(f.nodes, len(log.hosts) + 1)  # NET traffic reaches ranks on a host that printed nothing
    local = max((i.local_ranks for i in log.ranks.values() if i.local_ranks), default=0)
    per_host = Counter(f.rank_host.values())
    devs = max((len(h.devs | set(h.gpu_names)) for h in log.hosts.values()), default=0)
    xml_gpus = max((len(s.gpus) or s.pci_gpus for s in f.systems if not s.truncated), default=0)
    ranks_seen = set(log.ranks) | f.unknown_peers | log.ring_ranks
    nranks = max((i.nranks for i in log.ranks.values() if i.nranks), default=0)
    f.world_size = nranks or (max(ranks_seen) + 1 if ranks_seen else None)
    world = f.world_size or 0
    if f.world_size and not f.log.ranks and not f.log.ring_ranks and not f.unknown_peers:
        f.world_size = None
    if local:
        f.gpus_per_node, f.gpus_per_node_source = local, "localRanks"
    elif world and f.nodes and world % f.nodes == 0 and (nranks or f.nodes == 1 or f.inter_conns):
        f.gpus_per_node, f.gpus_per_node_source = world // f.nodes, "world size / nodes"
    else:
        seen = max(max(per_host.values(), default=0), devs, xml_gpus)
        f.gpus_per_node = seen or None
        f.gpus_per_node_source = "at least (GPUs seen in the log)" if seen else None


def _gdr(f: Facts) -> None:
    rdma = [c for c in f.inter_conns + f.intra_net if c.is_net and c.kind != "NET/Socket"]
    if rdma:
        with_gdr = [c for c in rdma if c.gdr]
        f.gdr = bool(with_gdr)
        example = (with_gdr or rdma)[0]
        f.gdr_why = f"{'/GDRDMA' if f.gdr else 'no /GDRDMA'} on NET connections: {example.line.ref()}"
        return
    for host in f.log.hosts.values():
        for on, line in host.gdr_ring:
            f.gdr, f.gdr_why = on, line.ref()
            return
    for host in f.log.hosts.values():
        if host.env.get("NCCL_NET_GDR_LEVEL", ("",))[0] in ("LOC", "0"):
            f.gdr, f.gdr_why = False, host.env["NCCL_NET_GDR_LEVEL"][1].ref()
            return
    if f.inter and all(k == "NET/Socket" for k in f.inter):
        f.gdr, f.gdr_why = False, "inter-node traffic uses sockets"
        return
    nets = {n for h in f.log.hosts.values() for n in h.networks}
    if nets and nets <= {"Socket"}:
        f.gdr, f.gdr_why = False, "the chosen network is Socket"


def _hardware(f: Facts) -> None:
    for host in f.log.hosts.values():
        if host.nvlink and not f.nvlink:
            f.nvlink = host.nvlink.ref()
        if host.nvswitch and not f.nvswitch:
            f.nvswitch = host.nvswitch.ref()
        for name in host.gpu_names.values():
            if _NVLINK_NAMES.search(name) and not f.nvlink:
                f.nvlink = f"{host.name}: GPU {name} (SXM/HGX boards have NVLink)"
            if _HOPPER_NAMES.search(name) and not f.hopper:
                f.hopper = f"{host.name}: GPU {name}"
            elif not _HOPPER_NAMES.search(name) and not f.pre_hopper:
                f.pre_hopper = f"{host.name}: GPU {name}"
            if _CONSUMER_NAMES.search(name) and not f.consumer:
                f.consumer = f"{host.name}: GPU {name}"
        if any(ok for ok, _ in host.nvls.values()) and not f.hopper:
            f.hopper = next(line.ref() for ok, line in host.nvls.values() if ok)
    for s in f.systems:
        for g in s.gpus:
            where = f"{s.file}:{g.line}"
            if g.nvlinks and not f.nvlink:
                f.nvlink = f"{where}: GPU {g.busid} has {g.nvlink_count} NVLinks"
            if any(t == "0x068000" for _, _, t in g.nvlinks) and g.nvlink_count >= 6 and not f.nvswitch:
                f.nvswitch = f"{where}: GPU {g.busid} NVLinks to NVSwitch class targets"
            if g.sm is not None and g.sm >= 90 and not f.hopper:
                f.hopper = f"{where}: GPU {g.busid} sm={g.sm}"
            if g.sm is not None and g.sm < 90 and not f.pre_hopper:
                f.pre_hopper = f"{where}: GPU {g.busid} sm={g.sm}"
            if g.sm in (75, 86, 89, 120) and not g.nvlinks and not f.consumer:
                f.consumer = f"{where}: GPU {g.busid} sm={g.sm} without NVLink"


def evidence_lines(lines: list[Line], limit: int = 5) -> list[str]:
    return [ln.ref() for ln in lines[:limit]]


def summary(f: Facts) -> TopoSummary:
    """The report's "summary" section: nodes x GPUs, transport inside and between nodes, GDR."""
    nets = sorted({n for h in f.log.hosts.values() for n in h.networks})
    return {
        "nodes": f.nodes or None,
        "gpus_per_node": f.gpus_per_node,
        "gpus_per_node_source": f.gpus_per_node_source,
        "world_size": f.world_size,
        "intra_node_transport": [k for k, _ in f.intra.most_common()],
        "inter_node_transport": [k for k, _ in f.inter.most_common()],
        "network": nets or sorted({k.split("/", 1)[1] for k in f.inter if k.startswith("NET/")}),
        "gdr": f.gdr,
        "gdr_evidence": f.gdr_why or None,
        "nvlink": f.nvlink is not None,
        "nccl_versions": sorted({v for h in f.log.hosts.values() for v in h.versions}),
        "coll_channels": f.log.coll_channels[0] if f.log.coll_channels else None,
        "rings": f.log.rings[0] if f.log.rings else None,
        "nvls_channels": f.log.nvls_channels[0] if f.log.nvls_channels else None,
    }


def hosts_section(f: Facts) -> list[HostRow]:
    out: list[HostRow] = []
    for name in sorted(f.log.hosts):
        h = f.log.hosts[name]
        vr = f.host_versions.get(name)
        out.append({
            "host": name,
            "nccl_version": sorted(h.versions) or None,
            "nccl_version_range": versions.fmt_range(vr) if vr else None,
            "cuda_driver": h.cuda_driver,
            "ranks": sorted(r for r, hn in f.rank_host.items() if hn == name),
            "bootstrap_ifaces": h.bootstrap_ifaces,
            "socket_ifaces": h.socket_ifaces,
            "ib_devices": h.ib_devices,
            "network": sorted(h.networks),
            "plugins": sorted(h.plugins),
            "env": {k: v for k, (v, _) in sorted(h.env.items())},
            "nvls": {str(d): ok for d, (ok, _) in sorted(h.nvls.items())},
            "gpus": {str(d): n for d, n in sorted(h.gpu_names.items())},
        })
    return out


def ranks_section(f: Facts) -> list[RankRow]:
    return [
        {"rank": r, "host": i.host, "cuda_dev": i.cuda_dev, "bus_id": i.bus_id, "nranks": i.nranks,
         "gpu": i.gpu_name}
        for r, i in sorted(f.log.ranks.items())
    ]


def topology_section(systems: list[TopoSystem]) -> list[SystemRow]:
    out: list[SystemRow] = []
    for s in systems:
        gpus: list[GpuRow] = []
        for g in s.gpus:
            near = nearest_nic(g, s.nets)
            gpus.append({
                "busid": g.busid, "dev": g.dev, "sm": g.sm, "numa": g.numa, "gdr": g.gdr,
                "pcie": f"{g.link_speed or '?'} x{g.link_width if g.link_width is not None else '?'}",
                "nvlinks": g.nvlink_count, "nearest_nic": near[1].name if near else None,
                "nic_distance": near[0] if near else None,
            })
        out.append({
            "file": s.file, "kind": s.kind, "truncated": s.truncated,
            "numa_nodes": sorted({c.get("numaid", "?") for c in s.cpus}),
            "gpus": gpus or s.pci_gpus, "nics": [
                {"name": n.name, "dev": n.dev, "speed_mbps": n.speed_mbps, "numa": n.numa, "gdr": n.gdr,
                 "pcie": f"{n.link_speed or '?'} x{n.link_width if n.link_width is not None else '?'}"}
                for n in s.nets
            ] or s.pci_nics,
            "graphs": s.graphs,
        })
    return out


def transports_section(f: Facts, limit: int = 500) -> Transports:
    """Per-peer transports: line counts by kind inside/between nodes, and the (src, dst, transport) pairs."""
    conns = sorted(f.log.connections.values(), key=lambda c: (c.src, c.dst, c.transport))
    inter = {id(c) for c in f.inter_conns}
    return {
        "intra_node": dict(f.intra.most_common()),
        "inter_node": dict(f.inter.most_common()),
        "peers_total": len(conns),
        "peers": [
            {"src": c.src, "dst": c.dst, "transport": c.transport, "kind": c.kind, "gdr": c.gdr,
             "inter_node": id(c) in inter, "lines": c.count, "seen_on": c.host}
            for c in conns[:limit]
        ],
    }


def channels_section(f: Facts) -> Channels:
    log = f.log

    def first(v: tuple[int, Line] | None) -> int | None:
        return v[0] if v else None

    return {
        "coll_channels": first(log.coll_channels), "collnet_channels": first(log.collnet_channels),
        "nvls_channels": first(log.nvls_channels), "rings": first(log.rings),
        "tree_channels": first(log.tree_channels),
        "ranks_in_rings": len(log.ring_ranks),
        "trees": [ln.text.split("NCCL INFO ", 1)[-1] for ln in log.trees[:8]],
    }
