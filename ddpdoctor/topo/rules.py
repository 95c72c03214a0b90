"""Fabric findings from an NCCL log (ids are a contract: docs/findings.md); pure functions of Facts."""

from __future__ import annotations

import re
from collections.abc import Callable

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.topo import versions
from ddpdoctor.topo.analysis import Facts, evidence_lines
from ddpdoctor.topo.parsed_log import Line
from ddpdoctor.topo.rules_common import env as _env
from ddpdoctor.topo.rules_common import env_all as _env_all
from ddpdoctor.topo.rules_gpu import (
    few_channels_nics,
    forced_algo_ignored,
    not_distributed,
    nvlink_unused,
    nvls_unavailable,
    p2p_disabled,
    p2p_pcie_risk,
    ranks_interleaved,
)

# Interfaces that cannot carry traffic between nodes: loopback, container/VM bridges, VPN tunnels.
BAD_IFACE = re.compile(
    r"^(lo\d*|docker\d*|veth\w*|virbr\d*|br-\w+|br\d+|cni\d*|flannel\.\d+|cali\w+|tun\d*|tap\d*|wg\d*|"
    r"tailscale\d*|utun\d*|zt\w+|CloudflareWARP|vxlan\w*|weave|kube-\w+)$"
)
_RDMA_PLUGINS = re.compile(r"IBext|OFI|nccl-net|Libfabric|libnccl-net|efa", re.IGNORECASE)
_IPOIB = re.compile(r"^(ib\w*|ibp\w+)$")


def net_socket_internode(f: Facts) -> list[Finding]:
    socket = [c for c in f.inter_conns if c.kind == "NET/Socket"]
    chosen = [(h.name, h.networks["Socket"]) for h in f.log.hosts.values() if "Socket" in h.networks]
    if socket:
        lines = [c.line for c in socket]
        return [Finding(
            "net-socket-internode", Severity.ERROR,
            f"Nodes talk over TCP sockets (NET/Socket): {sum(c.count for c in socket)} inter-node connection line(s)",
            ranks=sorted({c.src for c in socket} | {c.dst for c in socket})[:64],
            evidence={"lines": evidence_lines(lines + [ln for _, ln in chosen]), "nodes": f.nodes},
            advice="Make the RDMA network usable: check /dev/infiniband is visible in the container, rdma-core and the "
            "net plugin are installed, NCCL_IB_DISABLE/NCCL_NET are not set, and NCCL_IB_HCA matches `ibv_devices`.",
        )]
    chosen_lines = evidence_lines([ln for _, ln in chosen])
    separate = bool(f.log.inits) and all(n == 1 for *_, n, _ in f.log.inits)  # not-distributed explains it
    if chosen and f.nodes >= 2 and not separate:
        return [Finding(
            "net-socket-internode", Severity.ERROR,
            f"{len(chosen)} host(s) of a {f.nodes}-node job chose TCP sockets as their network",
            evidence={"lines": chosen_lines, "nodes": f.nodes},
            advice="Make the RDMA network usable (see the net-device-missing / ib-disabled-by-env findings, if any): "
            "/dev/infiniband in the container, rdma-core and the net plugin installed, NCCL_IB_HCA correct.",
        )]
    if chosen and not f.rank_host and f.world_size is None:
        # One host's log, nothing about ranks: the node count is unknown.
        return [Finding(
            "net-socket-internode", Severity.WARNING,
            "NCCL chose TCP sockets as its network; if this job spans nodes, they talk over TCP",
            evidence={"lines": chosen_lines},
            advice="For a multi-node job make IB/RoCE (or the cloud plugin, e.g. aws-ofi-nccl) usable; for one node "
            "this is harmless.",
        )]
    return []


def ib_disabled_by_env(f: Facts) -> list[Finding]:
    hits = []
    for name in ("NCCL_IB_DISABLE", "NCCL_IBEXT_DISABLE"):
        hits += [(h, v, ln) for h, v, ln in _env_all(f, name) if v not in ("0", "")]
    hits += [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_NET") if v.strip("'\"").lower() == "socket"]
    if not hits:
        return []
    sev = Severity.ERROR if f.nodes > 1 else Severity.WARNING
    return [Finding(
        "ib-disabled-by-env", sev, "InfiniBand/RoCE is disabled by an environment variable",
        evidence={"lines": evidence_lines([ln for _, _, ln in hits]),
                  "settings": sorted({f"{ln.text.split('NCCL INFO ')[-1]}" for _, _, ln in hits})[:5]},
        advice="Unset NCCL_IB_DISABLE / NCCL_IBEXT_DISABLE / NCCL_NET=Socket (often left over from debugging) so "
        "NCCL can use the RDMA fabric between nodes.",
    )]


def net_device_missing(f: Facts) -> list[Finding]:
    out: list[Finding] = []
    fell_back = bool([c for c in f.inter_conns if c.kind == "NET/Socket"]) or any(
        "Socket" in h.networks for h in f.log.hosts.values()
    )
    for h in f.log.hosts.values():
        stack: list[Line] = [ln for name, ln in h.plugins.items() if _RDMA_PLUGINS.search(name)]
        stack += [h.iface_lines[i] for i in h.bootstrap_ifaces if _IPOIB.match(i)][:1]
        if (hca := _env(h, "NCCL_IB_HCA")) is not None:
            stack.append(hca[1])
        disabled = any(
            (e := _env(h, n)) is not None and e[0] not in ("0", "") for n in ("NCCL_IB_DISABLE", "NCCL_IBEXT_DISABLE")
        )
        problem = ([h.ib_no_device] if h.ib_no_device else []) + h.plugin_failures
        if disabled or not stack or not (problem or fell_back):
            continue
        out.append(Finding(
            "net-device-missing", Severity.ERROR if fell_back else Severity.WARNING,
            f"{h.name}: an RDMA network stack is present but NCCL found no usable device"
            + (" and fell back to TCP sockets" if fell_back else ""),
            evidence={"host": h.name, "lines": [ln.ref() for ln in (stack + problem)[:6]]},
            advice="Check `ibv_devinfo` inside the job's container (mount /dev/infiniband, --cap-add IPC_LOCK), that the "
            "plugin (HPC-X IBext, aws-ofi-nccl) matches the driver/OFED, and that NCCL_IB_HCA names real devices.",
        ))
    return out


def gdr_disabled(f: Facts) -> list[Finding]:
    lines: list[Line] = []
    rdma_no_gdr = [c for c in f.inter_conns + f.intra_net if c.is_net and c.kind != "NET/Socket" and not c.gdr]
    lines += [c.line for c in rdma_no_gdr]
    for h in f.log.hosts.values():
        lines += [ln for on, hca, ln in h.gdr_hca if not on and hca not in h.socket_ifaces and "Socket" not in ln.text]
        lines += [ln for on, ln in h.gdr_ring if not on]
    if not lines or any(v in ("LOC", "0") for _, v, _ in _env_all(f, "NCCL_NET_GDR_LEVEL")):
        return []  # the env rule explains it
    return [Finding(
        "gdr-disabled", Severity.WARNING, "GPUDirect RDMA is not used: network traffic is staged through host memory",
        evidence={"lines": evidence_lines(lines)},
        advice="Load nvidia-peermem (or use a DMA-BUF capable driver/kernel), disable PCIe ACS on the switches between "
        "GPU and NIC, and check NCCL_NET_GDR_LEVEL; `GPU Direct RDMA Disabled for HCA` means the module is missing.",
    )]


def gdr_disabled_by_env(f: Facts) -> list[Finding]:
    hits = [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_NET_GDR_LEVEL") if v in ("LOC", "0")]
    hits += [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_GDR_DISABLE") + _env_all(f, "NCCL_NET_GDR_DISABLE")
             if v not in ("0", "")]
    if not hits:
        return []
    return [Finding(
        "gdr-disabled-by-env", Severity.WARNING, "GPUDirect RDMA is turned off by an environment variable",
        evidence={"lines": evidence_lines([ln for _, _, ln in hits]), "hosts": sorted({h for h, _, _ in hits})},
        advice="Remove NCCL_NET_GDR_LEVEL=LOC (LOC allows GDR only when GPU and NIC are the same device, i.e. never); "
        "leave it unset (default PXB) or set PHB/SYS when the NIC hangs off the CPU.",
    )]


def bad_socket_ifname(f: Facts) -> list[Finding]:
    hits: list[tuple[str, Line]] = []
    for h in f.log.hosts.values():
        for iface, addr in {**h.bootstrap_ifaces, **h.socket_ifaces}.items():
            if BAD_IFACE.match(iface) or addr.startswith("127."):
                hits.append((f"{h.name}: {iface} ({addr})", h.iface_lines[iface]))
                if (env := h.env.get("NCCL_SOCKET_IFNAME")) is not None:
                    hits.append((f"{h.name}: {iface} ({addr})", env[1]))
        env = h.env.get("NCCL_SOCKET_IFNAME")
        if env and any(BAD_IFACE.match(p.lstrip("^=")) for p in env[0].split(",")) and not hits:
            hits.append((f"{h.name}: NCCL_SOCKET_IFNAME={env[0]}", env[1]))
    if not hits:
        return []
    return [Finding(
        "bad-socket-ifname", Severity.ERROR if f.nodes != 1 else Severity.WARNING,
        "NCCL sockets use an interface other nodes cannot reach: " + ", ".join(sorted({w for w, _ in hits})[:4]),
        evidence={"interfaces": sorted({w for w, _ in hits}), "lines": evidence_lines([ln for _, ln in hits])},
        advice="Set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the data-network interface, e.g. `=ib0` or "
        "`=eth0`, or exclude the bad ones with `^lo,docker0`.",
    )]


def nccl_version_mismatch(f: Facts) -> list[Finding]:
    explicit = {v.split("+")[0] for h in f.log.hosts.values() for v in h.versions}
    ranges = {h: r for h, r in f.host_versions.items() if r is not None}
    disjoint = []
    names = sorted(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ra, rb = ranges[a], ranges[b]
            if ra[1] < rb[0] or rb[1] < ra[0]:
                disjoint.append((a, b))
        if len(disjoint) > 20:
            break
    if len(explicit) <= 1 and not disjoint:
        return []
    lines = [ln for h in f.log.hosts.values() for ln in h.versions.values()]
    for a, b in disjoint[:2]:
        for h in (a, b):
            lines += [ln for lo, hi, ln in f.log.hosts[h].fingerprints[:2]]
    return [Finding(
        "nccl-version-mismatch", Severity.ERROR, "Hosts run different NCCL versions",
        evidence={"versions": sorted(explicit),
                  "host_ranges": {h: versions.fmt_range(r) for h, r in sorted(ranges.items())},
                  "lines": evidence_lines(lines, 6)},
        advice="Use one container image / one torch build (torch bundles its NCCL) on every node; mixed NCCL versions "
        "hang or fail in connection setup.",
    )]


def env_mismatch(f: Facts) -> list[Finding]:
    hosts = [h for h in f.log.hosts.values() if h.env or h.networks or h.bootstrap_ifaces]
    diffs: list[str] = []
    lines: list[Line] = []
    for attr, label in (("env", "env"), ("networks", "network"), ("plugins", "plugin")):
        have = [h for h in hosts if getattr(h, attr)]
        if len(have) < 2:
            continue
        if attr == "env":
            keys = set.intersection(*(set(h.env) for h in have))
            for k in sorted(keys):
                vals = {h.name: h.env[k][0] for h in have}
                if len(set(vals.values())) > 1:
                    diffs.append(f"{k}: " + ", ".join(f"{n}={v}" for n, v in sorted(vals.items())[:4]))
                    lines += [h.env[k][1] for h in have[:2]]
        else:
            sets = {h.name: tuple(sorted(getattr(h, attr))) for h in have}
            if len(set(sets.values())) > 1:
                diffs.append(f"{label}: " + ", ".join(f"{n}={'/'.join(v)}" for n, v in sorted(sets.items())[:4]))
                lines += [next(iter(getattr(h, attr).values())) for h in have[:2]]
    ifnames = {h.name: tuple(sorted(h.bootstrap_ifaces)) for h in hosts if h.bootstrap_ifaces}
    if len(set(ifnames.values())) > 1:
        diffs.append("bootstrap interface: " + ", ".join(f"{n}={'/'.join(v)}" for n, v in sorted(ifnames.items())[:4]))
    if not diffs:
        return []
    return [Finding(
        "env-mismatch", Severity.WARNING, "Hosts differ in NCCL settings, interfaces or plugins",
        evidence={"differences": diffs[:10], "lines": evidence_lines(lines)},
        advice="Export the same NCCL_* variables on every node (srun/torchrun propagate only what the launching "
        "shell has) and install the same net plugin everywhere.",
    )]


def roce_network_error(f: Facts) -> list[Finding]:
    if not f.log.rdma_errors:
        return []
    roce = any(t == "RoCE" for h in f.log.hosts.values() for t in h.ib_devices.values())
    return [Finding(
        "roce-network-error", Severity.ERROR,
        f"The {'RoCE' if roce else 'IB'} network failed while connecting or transferring",
        evidence={"lines": evidence_lines(f.log.rdma_errors)},
        advice="RoCE: set NCCL_IB_GID_INDEX to the RoCEv2 IPv4 GID (`show_gids`), check routes/VLAN/PFC between the "
        "nodes; 'local protection error' (4) or retry exceeded (12) with GDR points at ACS/IOMMU or nvidia-peermem.",
    )]


def mixed_link_layer(f: Facts) -> list[Finding]:
    out = []
    for h in f.log.hosts.values():
        layers = set(h.ib_devices.values())
        if len(layers) > 1 and h.ib_devices_line:
            out.append(Finding(
                "mixed-link-layer", Severity.WARNING, f"{h.name}: NCCL uses IB and RoCE ports together",
                evidence={"host": h.name, "devices": h.ib_devices, "lines": [h.ib_devices_line.ref()]},
                advice="Restrict NCCL_IB_HCA to the ports of one fabric (e.g. `=mlx5_8,mlx5_9,...`); mixing link "
                "layers makes rings cross fabrics that may not reach each other.",
            ))
    return out


def nccl_warnings(f: Facts, used: set[str]) -> list[Finding]:
    rest = [ln for ln in f.log.warnings if ln.ref() not in used]
    if not rest:
        return []
    return [Finding(
        "nccl-warning", Severity.WARNING, f"NCCL printed {len(f.log.warnings)} WARN line(s)",
        evidence={"count": len(f.log.warnings), "lines": evidence_lines(rest)},
        advice="Read the first WARN: later ones are usually consequences (connection closed by a peer that died).",
    )]


LOG_RULES: list[Callable[[Facts], list[Finding]]] = [
    net_socket_internode, ib_disabled_by_env, net_device_missing, gdr_disabled, gdr_disabled_by_env,
    p2p_disabled, p2p_pcie_risk, nvlink_unused, nvls_unavailable, bad_socket_ifname, nccl_version_mismatch,
    env_mismatch, few_channels_nics, not_distributed, roce_network_error, forced_algo_ignored, mixed_link_layer,
    ranks_interleaved,
]


def log_findings(f: Facts) -> list[Finding]:
    out: list[Finding] = []
    for rule in LOG_RULES:
        out.extend(rule(f))
    used = {line for fd in out for line in fd.evidence.get("lines", [])}
    out.extend(nccl_warnings(f, used))
    return out
