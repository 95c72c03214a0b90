"""The cause behind a generic error: what NCCL's `Last error:` line (and its WARN) says went wrong, and what an
FSDP/FSDP2/DTensor error means (docs/logs-grammar.md, "NCCL causes" and "FSDP and DTensor"). Pure text -> Cause."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    """One class of cause: a short name for the title, where it lies, why, and what to do."""

    name: str  # "two ranks on one GPU", "InfiniBand completion error 12 (retry exceeded)", ...
    where: str  # "usage", "network", "gpu", "host", "peer", "fsdp", "dtensor"
    why: str
    advice: str


# ibv_wc_status (rdma-core verbs.h): the number NCCL prints after "Got completion from peer P with error|status=".
_IBV_STATUS = {
    1: "local length error", 2: "local QP operation error", 4: "local protection error (memory registration, "
    "often GPUDirect RDMA with ACS/IOMMU on)", 5: "work request flushed (after an earlier error)", 8: "local access "
    "error", 9: "remote invalid request", 10: "remote access error", 11: "remote operation error", 12: "transport "
    "retry counter exceeded (the peer did not answer: link down, congestion, wrong GID/route, or the peer died)",
    13: "RNR retry counter exceeded (the peer had no receive posted)",
}

_IB = re.compile(r"NET/IBP? ?: ?Got completion (?:from peer (?P<peer>\S+?) )?with (?:error |status=)(?P<code>\d+)")
_IB_30 = re.compile(r"NET/IB: Got completion from peer (?P<peer>\S+) with status=(?P<name>\w+)\((?P<code>\d+)\)")
_DUP = re.compile(r"Duplicate GPU detected : rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA device (?P<dev>\w+)")
_TRUNC = re.compile(r"message truncated : receiv(?:ing|ed) (?P<got>\d+) bytes instead of (?P<want>\d+)", re.IGNORECASE)


def _ib(m: re.Match[str]) -> Cause:
    code = int(m.group("code"))
    peer = m.group("peer")
    what = _IBV_STATUS.get(code, "see ibv_wc_status")
    return Cause(
        f"InfiniBand/RoCE completion error {code} ({what.split(' (')[0]})" + (f" with peer {peer}" if peer else ""),
        "network",
        f"the NIC reported status {code}: {what}; NCCL gives up on the connection and every rank of the "
        "communicator fails after it",
        "Check the link between this host and the peer: `ibstat`/`ibv_devinfo` (state Active, the same rate), the "
        "port counters (`perfquery`, symbol errors), the GID index and routing for RoCE (NCCL_IB_GID_INDEX, PFC), and "
        "whether the peer host itself died first. Status 4 (local protection) is usually GPUDirect RDMA with PCIe "
        "ACS/IOMMU on: NCCL_NET_GDR_LEVEL=LOC to confirm; status 12 is the peer not answering (link, switch, or the "
        "peer process gone).")


_TABLE: tuple[tuple[re.Pattern[str], Cause], ...] = (
    (re.compile(r"Duplicate GPU detected"), Cause(
        "two ranks on one GPU", "usage",
        "NCCL found two ranks of one communicator on the same CUDA device: every process picked the default GPU "
        "(cuda:0) or the same CUDA_VISIBLE_DEVICES",
        "Give each process its own GPU before the process group is created: "
        "`torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` (or `device_id=` in init_process_group), "
        "and do not launch more processes per node than GPUs (--nproc-per-node); a framework that sets "
        "CUDA_VISIBLE_DEVICES itself (Ray, a scheduler) must not be given the same device twice.")),
    (_TRUNC, Cause(
        "the ranks sent different sizes (message truncated)", "usage",
        "a rank received fewer or more bytes than it posted for: the ranks called a collective with different sizes "
        "(or different NCCL_PROTO/NCCL_ALGO settings)",
        "Make the collective's tensors the same size on every rank (uneven last batch, a rank-dependent shape); "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatch; set NCCL_* the same on every node.")),
    (re.compile(r"NET/OFI .*completed with error|libfabric:\d+:\d+:+\w+:\w+:|\bUNDELIVERABLE\b"), Cause(
        "a libfabric/OFI completion error on the fabric", "network",
        "the OFI provider (EFA, CXI) could not deliver a message to the peer",
        "Check that the nodes reach each other on the fabric (EFA: the security group must allow all traffic "
        "within itself; Slingshot: the CXI service and VNI), the aws-ofi-nccl/libfabric versions, then "
        "NCCL_DEBUG=INFO FI_LOG_LEVEL=warn for the failing peer.")),
    (re.compile(r"Bootstrap ?: no socket interface found|No usable listening interface found|"
                r"NCCL_SOCKET_IFNAME|no socket interface"), Cause(
        "no usable network interface", "network",
        "NCCL found no network interface matching its filter to bootstrap or to connect over sockets",
        "Set NCCL_SOCKET_IFNAME to the interface the nodes reach each other on (`ip -br addr`), the same name on "
        "every node; exclude docker0/lo only when another interface exists.")),
    (re.compile(r"(?:Net|NET/Socket) ?: ?Connect to \S+ failed|socket(?:Start|Poll)?Connect\w*: .*(?:refused|timed "
                r"out|failed)|Call to connect returned|Connection timed out|No route to host"), Cause(
        "NCCL could not connect to a peer over TCP", "network",
        "a TCP connection to another rank (bootstrap or the socket transport) was refused or timed out",
        "Check the interface NCCL picked (NCCL_DEBUG=INFO `NET/Socket : Using`), NCCL_SOCKET_IFNAME, firewalls "
        "between the nodes (NCCL uses random high ports), and that the peer process was still alive.")),
    (re.compile(r"Call to ibv_\w+ failed|ibv_reg_mr|ibv_create_\w+ failed|NET/IB ?: .*(?:failed|error)"), Cause(
        "an InfiniBand verbs call failed", "network",
        "NCCL could not set up the InfiniBand resources (queue pair, memory registration) on this host",
        "Check `ulimit -l` (locked memory must be unlimited; containers need --ulimit memlock=-1), the HCA state "
        "(`ibstat`), nvidia-peermem for GPUDirect RDMA, and NCCL_IB_HCA selecting working ports.")),
    (re.compile(r"failed to extend \S+ to \d+ bytes|/dev/shm"), Cause(
        "/dev/shm too small", "host",
        "NCCL's shared-memory transport could not grow its segment in /dev/shm",
        "Give the container more shared memory (docker --shm-size=1g or --ipc=host; Kubernetes: an emptyDir with "
        "medium Memory at /dev/shm), or NCCL_SHM_DISABLE=1 as a slower workaround.")),
    (re.compile(r"Cuda failure '?(?:peer access|invalid device ordinal|no CUDA-capable|CUDA driver version|"
                r"system not yet initialized|initialization error)"), Cause(
        "a CUDA setup failure on this GPU", "gpu",
        "the CUDA runtime failed under NCCL (device ordinal, peer access, driver or initialization)",
        "Check the GPUs this process sees (CUDA_VISIBLE_DEVICES, `nvidia-smi`), the driver/CUDA versions, and for "
        "peer access NCCL_P2P_DISABLE=1 to confirm a P2P/IOMMU problem.")),
    (re.compile(r"Cuda failure|CUDA error"), Cause(
        "a CUDA failure on this GPU", "gpu",
        "a CUDA call under NCCL failed on this GPU",
        "Read the CUDA error: 'out of memory' is this rank's memory, an illegal address a kernel's fault "
        "(CUDA_LAUNCH_BLOCKING=1), Xid errors in dmesg the GPU itself.")),
    (re.compile(r"Invalid rank requested|invalid rank|nranks|Invalid config|invalid argument|Invalid "
                r"(?:usage|type|op|root|count|datatype)", re.IGNORECASE), Cause(
        "NCCL was called with an invalid argument", "usage",
        "NCCL refused the arguments of a call (a rank outside the group, a wrong root, a bad datatype)",
        "Check the group the collective runs on (new_group's ranks on every rank), its root and tensor dtypes.")),
    (re.compile(r"Connection closed by remote peer|Connection reset by peer|remote process exited"), Cause(
        "the peer closed its connection", "peer",
        "the connection to another rank closed: that rank exited or was killed first",
        "Find the rank that died first (its own log, the scheduler, dmesg for the OOM killer): this error follows "
        "from it.")),
)


def nccl_cause(text: str) -> Cause | None:
    """The cause that NCCL's `Last error:` text or WARN line names, or None when it names none of these."""
    if "completion" in text:
        m = _IB_30.search(text) or _IB.search(text)
        if m:
            return _ib(m)
    for pattern, cause in _TABLE:
        if pattern.search(text):
            if pattern is _TRUNC:
                t = _TRUNC.search(text)
                assert t is not None
                return Cause(f"the ranks sent different sizes ({t.group('got')} bytes received, {t.group('want')} "
                             "expected)", cause.where, cause.why, cause.advice)
            if cause.name == "two ranks on one GPU":
                d = _DUP.search(text)
                if d:
                    return Cause(f"ranks {d.group('b')} and {d.group('a')} on one GPU (CUDA device {d.group('dev')})",
                                 cause.where, cause.why, cause.advice)
            return cause
    return None


# The part of a failure text after NCCL's "Last error:" (torch prints it after "ncclXxx: <description>").
LAST_ERROR = re.compile(r"Last error:\s*(?P<cause>\S.*)$")


def last_error(text: str) -> str | None:
    m = LAST_ERROR.search(text)
    return m.group("cause").strip() if m else None
