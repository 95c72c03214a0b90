"""Evidence in an NCCL log that the main parser does not model, and its findings: nccl-tests device lines (GPU model,
host, bus id), PCIe switch IDs in NCCL's topology print, libfabric/OFI provider failures, communicators of one rank on
every node of a multi-node launch (nccl-tests without MPI), and the ncclMaxSharedMem warning (docs/logs-grammar.md §5)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.findings.model import Finding, Severity

# nccl-tests: "#  Rank  0 Group  0 Pid  1234 on  hostA device  0 [0x07] NVIDIA GeForce RTX 4090" (bus id also printed
# as "[0000:07:00]" or "[07:00.0]" by newer builds; "Group" since nccl-tests 2.10).
# Pasted into an issue or a forum the leading "#" is often gone (markdown reads it as a heading).
_TESTS_DEVICE = re.compile(r"(?:^|#|>:)\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                           r"\[([0-9a-fA-Fx:.]+)\]\s*(.*?)\s*$")
# Open MPI's --tag-output prefix "[1,3]<stdout>:" (job, rank): which MPI rank printed the line.
_MPI_TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:")
_CONSUMER = re.compile(r"GeForce|RTX \d{4}(?! ?(?:A|Ada)\d)|TITAN", re.IGNORECASE)
# NCCL's topology print: "PCI/D000 (1000c01010000000)" (2.8-2.18: "%s/%lX (%lx)") or "PCI/0-d000 (10b5874710b58747)"
# (2.19+: system id - local id). The 64-bit value is vendor<<48 | device<<32 | subsystem vendor<<16 | subsystem.
_TOPO_PCI = re.compile(r"\bPCI/([0-9A-Fa-f-]+) \(([0-9a-fA-F]{13,16})\)")
_SWITCH_VENDORS = {"10b5": "PLX/Broadcom PEX", "1000": "Broadcom PEX", "111d": "IDT/Microchip", "11f8": "Microchip"}
_P2P_OFF_ENV = re.compile(r"NCCL_P2P_DISABLE set by environment to 1|NCCL_P2P_LEVEL set by environment to (?:LOC|0)")
_P2P_USED = re.compile(r"via P2P/|P2P/IPC|P2P/CUMEM|P2P/direct")
# aws-ofi-nccl / libfabric: the plugin loaded, and the EFA provider found no device.
# Every pattern is linear in a line's length: no `X.*Y` tried again from each X of a line (2.0 / 8.2 / 35.0 CPU s at
# 1x / 2x / 4x a line of repeated "efa"): "X, then later Y" is the first X found, then Y searched after it once, and
# a `\S*` never runs past the next start of its own pattern.
_OFI_LOADED = re.compile(r"NET/OFI (?:Using|Initializing|Selected Provider|Setting)|aws-ofi-nccl|Loaded net plugin "
                         r"(?:(?!Loaded net plugin )\S)*?(?:OFI|ofi|Libfabric)", re.IGNORECASE)
_PLUGIN_LOADED = re.compile(r"NET/Plugin: Loaded ", re.IGNORECASE)
_OFI = re.compile(r"ofi", re.IGNORECASE)
_EFA = re.compile(r"efa", re.IGNORECASE)
_EFA_AFTER = re.compile(r"No (?:EFA )?devices? (?:found|available)|no device|not found|Unable to find"
                        r"|fi_getinfo(?:(?!fi_getinfo)\S)* (?:call )?failed", re.IGNORECASE)
_EFA_DEVICE = re.compile(r"efa_device", re.IGNORECASE)
_NO_SUCH_DEVICE = re.compile(r": No such device", re.IGNORECASE)
_EFA_ANYWHERE = re.compile(r"No eligible providers|Couldn't find any optimal provider|OFI fi_getinfo\(\) call failed"
                           r"|Unable to find a protocol that worked|Could not find any EFA devices", re.IGNORECASE)


def _after(first: re.Pattern[str], then: re.Pattern[str], line: str) -> bool:
    """``first.*then`` without the quadratic retries: ``then`` searched once, after the first ``first``."""
    m = first.search(line)
    return m is not None and then.search(line, m.end()) is not None


def ofi_loaded(line: str) -> bool:
    return bool(_OFI_LOADED.search(line)) or _after(_PLUGIN_LOADED, _OFI, line)


def efa_nodev(line: str) -> bool:
    return (_after(_EFA, _EFA_AFTER, line) or _after(_EFA_DEVICE, _NO_SUCH_DEVICE, line)
            or bool(_EFA_ANYWHERE.search(line)))
_COMM_NRANKS = re.compile(r"(?:^|\s)([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO .*?\bn[Rr]anks (\d+)")
# "comm 0x55.. rank 4 nranks 8 cudaDev 0 ..." (Init COMPLETE lines, NCCL 2.8-2.30; "ncclCommInitRank comm ..." 2.19+)
_COMM_RANK = re.compile(r"(?:^|\s)([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO .*?\bcomm 0x[0-9a-f]+ rank (\d+) n[Rr]anks (\d+)")
_MAX_SHMEM = re.compile(r"ncclMaxSharedMem (\d+) exceeds device/fn maxSharedMem (\d+)")
_MAX_QUOTE = 4


@dataclass
class Evidence:
    devices: dict[tuple[str, int], tuple[str, str, str]] = field(default_factory=dict)  # (host, dev) -> (bus, model, line)
    tests_rank_hosts: dict[int, set[str]] = field(default_factory=dict)
    tests_rank0_mpi: set[str] = field(default_factory=set)  # mpirun --tag-output ranks whose process printed "Rank 0"
    tests_rank0_procs: set[tuple[str, int]] = field(default_factory=set)  # (host, pid) of each process with a "Rank 0"
    switches: dict[str, list[str]] = field(default_factory=dict)  # vendor name -> lines
    p2p_off: list[str] = field(default_factory=list)
    p2p_used: bool = False
    ofi_loaded: list[str] = field(default_factory=list)
    efa_nodev: list[str] = field(default_factory=list)
    comm_sizes: dict[str, set[int]] = field(default_factory=dict)  # host -> nranks seen
    comm_rank0: dict[int, set[str]] = field(default_factory=dict)  # nranks -> hosts where a rank 0 of that size is
    max_shmem: list[str] = field(default_factory=list)


def scan(evidence: Evidence, text: str) -> None:
    """Add one log's evidence (lines are matched on cheap substrings first)."""
    for raw in text.splitlines():
        line = raw.strip()
        if "Rank" in line and "device" in line and ("#" in line[:24] or "Rank" in line[:24]):
            m = _TESTS_DEVICE.search(line)
            if m:
                rank, host, dev = int(m.group(1)), m.group(3), int(m.group(4))
                evidence.devices[(host, dev)] = (m.group(5), m.group(6), line[:300])
                evidence.tests_rank_hosts.setdefault(rank, set()).add(host)
                tag = _MPI_TAG.match(line)
                if rank == 0 and tag:
                    evidence.tests_rank0_mpi.add(tag.group(1))
                if rank == 0 and len(evidence.tests_rank0_procs) < 4096:
                    evidence.tests_rank0_procs.add((host, int(m.group(2))))
                continue
        low = line.lower()
        if " nccl " not in low and "net/ofi" not in low and "libfabric" not in low and "efa" not in low:
            continue
        # Cheap substring gates first: most NCCL INFO lines are connection and channel lines none of these need.
        if "PCI/" in line:
            for m in _TOPO_PCI.finditer(line):
                vendor, device = m.group(2).zfill(16)[:4].lower(), m.group(2).zfill(16)[4:8].lower()
                name = _SWITCH_VENDORS.get(vendor)
                if name and (vendor != "1000" or device.startswith("c0")):
                    evidence.switches.setdefault(name, []).append(line[:300])
        if "NCCL_P2P" in line and _P2P_OFF_ENV.search(line):
            evidence.p2p_off.append(line[:300])
        if not evidence.p2p_used and "P2P/" in line and _P2P_USED.search(line):
            evidence.p2p_used = True
        if ("ofi" in low or "libfabric" in low) and ofi_loaded(line):
            evidence.ofi_loaded.append(line[:300])
        if ("efa" in low or "provider" in low or "fi_getinfo" in low or "protocol that worked" in low) \
                and efa_nodev(line):
            evidence.efa_nodev.append(line[:300])
        if "nranks" in low:
            m = _COMM_NRANKS.search(line)
            if m:
                evidence.comm_sizes.setdefault(m.group(1), set()).add(int(m.group(2)))
            m = _COMM_RANK.search(line) if "comm 0x" in line else None
            if m and m.group(2) == "0":
                evidence.comm_rank0.setdefault(int(m.group(3)), set()).add(m.group(1))
        if "maxSharedMem" in line:
            m = _MAX_SHMEM.search(line)
            if m:
                evidence.max_shmem.append(line[:300])


_XML_PCI = re.compile(r"<pci\b[^>]*>")
_XML_ATTR = re.compile(r'\b(busid|vendor|device)="([^"]*)"')


def scan_xml(evidence: Evidence, text: str) -> None:
    """PCIe switches in a topology XML: <pci ... vendor="0x10b5" device="0x8747"> (NCCL_TOPO_DUMP_FILE, 2.8+)."""
    for m in _XML_PCI.finditer(text):
        attrs = dict(_XML_ATTR.findall(m.group(0)))
        vendor = attrs.get("vendor", "").lower().removeprefix("0x").zfill(4)
        device = attrs.get("device", "").lower().removeprefix("0x").zfill(4)
        name = _SWITCH_VENDORS.get(vendor)
        if name and (vendor != "1000" or device.startswith("c0")):
            evidence.switches.setdefault(name, []).append(m.group(0)[:300])


def findings(ev: Evidence, nodes: int) -> list[Finding]:
    """Findings from the evidence above; ``nodes`` is the node count the main analysis derived (0 = unknown)."""
    out: list[Finding] = []
    consumer = {k: v for k, v in ev.devices.items() if _CONSUMER.search(v[1])}
    if consumer and not ev.p2p_off:
        models = sorted({v[1] for v in consumer.values()})
        out.append(Finding(
            "p2p-consumer-gpu", Severity.WARNING,
            f"Consumer GPUs ({', '.join(models)}) with P2P on: a known source of hangs and wrong results over PCIe",
            evidence={"gpus": [f"{h} device {d} [{v[0]}] {v[1]}" for (h, d), v in sorted(consumer.items())][:16],
                      "p2p_seen_in_use": ev.p2p_used, "lines": [v[2] for v in list(consumer.values())[:_MAX_QUOTE]]},
            advice="GeForce boards are not validated for PCIe P2P: if all_reduce hangs or gives wrong sums, run "
                   "nccl-tests with NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC); with P2P kept on, disable ACS and "
                   "the IOMMU (iommu=pt) so P2P traffic does not cross the root complex.",
        ))
    if ev.switches:
        kinds = sorted(ev.switches)
        lines = [ln for k in kinds for ln in ev.switches[k]]
        # PLX (0x10b5: PEX87xx/97xx, Gen3 servers and GPU boxes) is where P2P over ACS-enabled switch ports hangs or
        # crawls; Broadcom's PEX88xxx (0x1000:0xc0xx) sit in every HGX board and are only worth knowing about.
        out.append(Finding(
            "gpus-behind-pcie-switch", Severity.WARNING if "PLX/Broadcom PEX" in kinds else Severity.INFO,
            f"GPUs sit behind PCIe switches ({', '.join(kinds)}): P2P between them crosses the switch",
            evidence={"switches": kinds, "lines": lines[:_MAX_QUOTE]},
            advice="P2P behind a PCIe switch is fast only with ACS disabled on the switch ports (`lspci -vvv | grep "
                   "ACSCtl`); with ACS on, traffic detours through the root complex or hangs. A GPU and NIC behind the "
                   "same switch are what GPUDirect RDMA wants.",
        ))
    if ev.ofi_loaded and ev.efa_nodev:
        out.append(Finding(
            "ofi-no-efa-device", Severity.ERROR if nodes != 1 else Severity.WARNING,
            "The OFI (aws-ofi-nccl) plugin is loaded but libfabric's EFA provider found no device: the container "
            "does not see the EFA devices",
            evidence={"lines": (ev.efa_nodev[:2] + ev.ofi_loaded[:2])},
            advice="Start the container with the EFA devices (docker --device /dev/infiniband/uverbs0 ..., or the "
                   "k8s EFA device plugin's vpc.amazonaws.com/efa resource) and check `fi_info -p efa` inside it; "
                   "otherwise NCCL falls back to TCP sockets between nodes.",
        ))
    # Without MPI every host runs its own rank 0 (a log with two MPI runs on different hosts has hosts without one).
    tests_hosts = set().union(*ev.tests_rank_hosts.values()) if ev.tests_rank_hosts else set()
    multi = [0] if len(tests_hosts) > 1 and ev.tests_rank_hosts.get(0) == tests_hosts else []
    # On one host: several MPI ranks each printed a device table whose only rank is 0 (mpirun -np N of a build
    # without MPI=1: N separate one-GPU jobs).
    if not multi and len(ev.tests_rank0_mpi) > 1 and set(ev.tests_rank_hosts) == {0}:
        multi = [0]
    ones = {h for h, sizes in ev.comm_sizes.items() if sizes == {1}}
    # (one-rank communicators alone are any job whose processes each initialised alone: 'not-distributed' says that;
    # it is nccl-tests only when nccl-tests printed its device table)
    if multi or (ev.tests_rank_hosts and len(ones) > 1 and len(ones) == len(ev.comm_sizes)):
        hosts = sorted(set().union(*(ev.tests_rank_hosts[r] for r in multi)) if multi else ones)
        out.append(Finding(
            "nccl-tests-no-mpi", Severity.ERROR,
            (f"Every process ran its own one-GPU job ({len(ev.tests_rank0_mpi)} MPI ranks each printed 'Rank 0'"
             f" on {', '.join(hosts[:4])}" if len(hosts) == 1 else
             f"Every process ran its own job ({len(ev.tests_rank0_procs)} processes on {len(hosts)} hosts each "
             "printed 'Rank 0'" if multi and len(ev.tests_rank0_procs) > len(hosts) else
             f"Every node ran its own one-node job ({len(hosts)} hosts each with "
             + (f"rank {multi[0]}" if multi else "a communicator of 1 rank"))
            + "): nccl-tests built without MPI; its figures measure no communication between them",
            evidence={"hosts": hosts[:16], "ranks_on_several_hosts": sorted(multi)[:16],
                      "mpi_ranks_printing_rank_0": sorted(ev.tests_rank0_mpi, key=int)[:16],
                      "processes_printing_rank_0": len(ev.tests_rank0_procs)},
            advice="Rebuild nccl-tests with MPI=1 MPI_HOME=... and launch it with mpirun/srun (one process per GPU "
                   "or per node with -g); without MPI each process is rank 0 of its own job and measures nothing "
                   "between nodes. Built with MPI=1, the same happens when the mpirun comes from another MPI than "
                   "the one nccl-tests was linked against (`ldd all_reduce_perf | grep mpi` against `which mpirun`).",
        ))
    split = {n: hosts for n, hosts in ev.comm_rank0.items() if n > 1 and len(hosts) > 1}
    if split and not multi:
        n, node_hosts = max(split.items(), key=lambda kv: len(kv[1]))
        out.append(Finding(
            "comm-per-node", Severity.ERROR,
            f"{len(node_hosts)} hosts each built their own {n}-rank communicator (a rank 0 on every host): the nodes never "
            "joined one job",
            evidence={"hosts": sorted(node_hosts)[:16], "nranks": n},
            advice="Every node must rendezvous at the same address: one MASTER_ADDR/--rdzv-endpoint and the same "
                   "--rdzv-id for all, --nnodes set to the node count, and each node's --node-rank (static) distinct.",
        ))
    if ev.max_shmem:
        out.append(Finding(
            "nccl-shared-mem-exceeded", Severity.WARNING,
            "NCCL's kernels need more shared memory than this GPU allows (ncclMaxSharedMem exceeds maxSharedMem)",
            evidence={"lines": ev.max_shmem[:_MAX_QUOTE]},
            advice="This NCCL build does not fit this GPU's architecture (a build for a newer or older arch): use "
                   "the NCCL that ships for your CUDA and GPU generation (pip nvidia-nccl-cu12 matching torch), or "
                   "a newer NCCL release that supports this GPU.",
        ))
    return out
