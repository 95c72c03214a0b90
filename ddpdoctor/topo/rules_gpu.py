"""GPU-side findings from an NCCL log: P2P, NVLink, NVLS, channels, NICs per GPU, communicator shape."""

from __future__ import annotations

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.topo.analysis import Facts, evidence_lines
from ddpdoctor.topo.rules_common import env_all as _env_all


def p2p_disabled(f: Facts) -> list[Finding]:
    env = [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_P2P_DISABLE") if v not in ("0", "")]
    env += [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_P2P_LEVEL") if v in ("LOC", "0")]
    shm_off = [ln for _, v, ln in _env_all(f, "NCCL_SHM_DISABLE") if v not in ("0", "")]
    msgs = f.log.p2p_disabled
    if env or msgs:
        lines = [ln for _, _, ln in env] + msgs[:3] + shm_off + [c.line for c in f.intra_net[:2]]
        title = "P2P between GPUs of a node is disabled" + (" by the environment" if env else "")
        if shm_off:
            title += "; SHM is disabled too, so local GPUs talk through the NIC"
        return [Finding(
            "p2p-disabled", Severity.WARNING, title, evidence={"lines": evidence_lines(lines, 8)},
            advice="Unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL=LOC (and NCCL_SHM_DISABLE) unless they work around a "
            "known hang; if P2P hangs, fix ACS/IOMMU (see p2p-pcie-risk) instead of disabling it.",
        )]
    shm = [c for c in f.log.connections.values() if c.kind == "SHM" and c.host]
    if shm and f.intra.get("SHM") and not any(k.startswith("P2P") for k in f.intra):
        return [Finding(
            "p2p-disabled", Severity.INFO, "GPUs of a node exchange data through host shared memory (SHM), not P2P",
            evidence={"lines": evidence_lines([c.line for c in shm], 3)},
            advice="Normal when the GPUs sit under different CPU sockets; if they share a PCIe switch, check "
            "`nvidia-smi topo -m` and whether ACS or a VM blocks P2P.",
        )]
    return []


def p2p_pcie_risk(f: Facts) -> list[Finding]:
    forced = [(h, v, ln) for h, v, ln in _env_all(f, "NCCL_P2P_LEVEL") if v in ("SYS", "PHB", "NODE", "5", "4")]
    p2p_used = any(k.startswith("P2P") for k in f.intra)
    lines = [ln for _, _, ln in forced]
    why = []
    if forced:
        why.append(f"NCCL_P2P_LEVEL={forced[0][1]} forces P2P across the CPU root complex")
    if f.consumer and p2p_used and not f.nvlink:
        why.append(f"P2P over PCIe between consumer GPUs ({f.consumer})")
    if not why:
        return []
    return [Finding(
        "p2p-pcie-risk", Severity.WARNING, "P2P over PCIe where it can hang or corrupt data: " + "; ".join(why),
        evidence={"lines": evidence_lines(lines) + ([f.consumer] if f.consumer else [])},
        advice="Disable ACS on PCIe switches and set iommu=pt (or off) before relying on PCIe P2P; validate with "
        "nccl-tests. If it hangs, remove NCCL_P2P_LEVEL=SYS (NCCL then falls back to SHM).",
    )]


def nvlink_unused(f: Facts) -> list[Finding]:
    if not f.nvlink:
        return []
    slow = [c for c in f.log.connections.values() if c.kind == "SHM" and not (c.src in f.rank_host and c.dst in
            f.rank_host and f.rank_host[c.src] != f.rank_host[c.dst])] + f.intra_net
    if not slow:
        return []
    return [Finding(
        "nvlink-unused", Severity.WARNING,
        f"NVLink is present but GPUs of a node talk over {'/'.join(sorted({c.kind for c in slow}))}",
        ranks=sorted({c.src for c in slow})[:64],
        evidence={"nvlink": f.nvlink, "lines": evidence_lines([c.line for c in slow])},
        advice="Remove NCCL_P2P_DISABLE/NCCL_P2P_LEVEL overrides; check `nvidia-smi nvlink -s` and that the fabric "
        "manager runs on NVSwitch systems; inside containers, GPUs must be visible to one another.",
    )]


def nvls_unavailable(f: Facts) -> list[Finding]:
    missing = [ln for h in f.log.hosts.values() for ok, ln in h.nvls.values() if not ok]
    if not missing or (f.pre_hopper and not f.hopper):
        return []
    env = _env_all(f, "NCCL_NVLS_ENABLE")
    hopper_switch = bool(f.hopper and f.nvswitch)
    return [Finding(
        "nvls-unavailable", Severity.WARNING if hopper_switch else Severity.INFO,
        "NVLink SHARP (NVLS) is unavailable" + (" on a Hopper+NVSwitch system" if hopper_switch else
                                                 " (GPU generation unknown: expected only on Hopper+NVSwitch)"),
        evidence={"lines": evidence_lines(missing + [ln for _, _, ln in env], 3), "hopper": f.hopper,
                  "nvswitch": f.nvswitch},
        advice="On H100/H200/B200 with NVSwitch: run nvidia-fabricmanager (and IMEX for MNNVL), use a CUDA driver "
        ">= 530 and NCCL >= 2.17, and do not set NCCL_NVLS_ENABLE=0.",
    )]


def few_channels_nics(f: Facts) -> list[Finding]:
    out: list[Finding] = []
    coll = f.log.coll_channels or f.log.rings or f.log.tree_channels
    if coll and f.nvswitch and coll[0] <= 4 and (f.gpus_per_node or 0) >= 4:
        out.append(Finding(
            "few-channels", Severity.WARNING, f"Only {coll[0]} channels on an NVSwitch system",
            evidence={"channels": coll[0], "nvswitch": f.nvswitch, "lines": [coll[1].ref()]},
            advice="Remove NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS caps and NCCL_ALGO/NCCL_PROTO overrides; few "
            "channels on NVSwitch usually means P2P or NVLink is not fully usable.",
        ))
    if f.nodes > 1 and f.gpus_per_node and f.gpus_per_node >= 4:
        for h in f.log.hosts.values():
            nics = len(h.ib_devices)
            if nics and nics * 2 < f.gpus_per_node:
                out.append(Finding(
                    "few-nics", Severity.WARNING,
                    f"{h.name}: {nics} RDMA NIC(s) for {f.gpus_per_node} GPUs per node",
                    evidence={"host": h.name, "nics": nics, "gpus_per_node": f.gpus_per_node,
                              "lines": [h.ib_devices_line.ref()] if h.ib_devices_line else []},
                    advice="Check NCCL_IB_HCA does not filter out NICs and that every NIC is up (`ibstat`); "
                    "inter-node bandwidth is capped by the NICs NCCL uses.",
                ))
    return out


def not_distributed(f: Facts) -> list[Finding]:
    inits = f.log.inits
    singles = [i for i in inits if i[3] == 1]
    procs = {(host, pid) for host, pid, _, _, _ in singles}
    if len(procs) < 2 or any(n > 1 for _, _, _, n, _ in inits):
        return []
    return [Finding(
        "not-distributed", Severity.ERROR,
        f"Each process built its own one-rank communicator ({len({h for h, _ in procs})} host(s), "
        f"{len(procs)} process(es))",
        evidence={"processes": len(procs), "lines": evidence_lines([ln for *_, ln in singles])},
        advice="The ranks never joined one job: check WORLD_SIZE/RANK/MASTER_ADDR reach every process (srun needs "
        "--ntasks-per-node, torchrun needs --nnodes and a shared --rdzv-endpoint).",
    )]


def forced_algo_ignored(f: Facts) -> list[Finding]:
    forced = _env_all(f, "NCCL_ALGO") + _env_all(f, "NCCL_PROTO")
    lines = list(f.log.algo_ignored)
    for _, v, ln in forced:
        if "nvls" in v.lower() and (f.log.nvls_channels and f.log.nvls_channels[0] == 0
                                    or any(not ok for h in f.log.hosts.values() for ok, _ in h.nvls.values())):
            lines.append(ln)
        if "collnet" in v.lower() and f.log.collnet_channels and f.log.collnet_channels[0] == 0:
            lines.append(ln)
    if not lines:
        return []
    return [Finding(
        "forced-algo-ignored", Severity.WARNING, "NCCL_ALGO/NCCL_PROTO asks for something this system cannot do",
        evidence={"lines": evidence_lines(lines + [ln for _, _, ln in forced])},
        advice="Unset NCCL_ALGO/NCCL_PROTO: NCCL ignores an algorithm it cannot build and tunes better without them.",
    )]


def ranks_interleaved(f: Facts) -> list[Finding]:
    """Consecutive ranks alternate between hosts: rings then cross the network more often than needed."""
    known = sorted(f.rank_host.items())
    hosts = {h for _, h in known}
    if len(hosts) < 2 or len(known) < 4:
        return []
    blocks = sum(1 for (_, a), (_, b) in zip(known, known[1:], strict=False) if a != b) + 1
    if blocks <= len(hosts):
        return []
    return [Finding(
        "ranks-interleaved", Severity.INFO,
        f"Ranks alternate between hosts ({blocks} host changes over {len(known)} ranks, {len(hosts)} hosts)",
        ranks=[r for r, _ in known[:16]],
        evidence={"rank_host": {str(r): h for r, h in known[:16]}},
        advice="Give each node a contiguous block of ranks (torchrun does; with srun use --distribution=block) so "
        "NCCL rings stay inside a node as long as possible.",
    )]
