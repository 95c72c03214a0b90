"""The grammar of failure lines (docs/logs-grammar.md): torch 1.12-2.13, torchrun / the elastic agent, TCPStore and
rendezvous, gloo, NCCL 2.8-2.30 and the shell. Each rule names its kind, its role (cause, victim or benign) and the
versions whose wording it matches; `failures.parse_failure` applies them to one line."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    kind: str  # oom, nccl-error, nccl-remote, model-mismatch, watchdog-stuck, store, store-cause, gloo-io, ...
    role: str  # "cause": this rank failed on its own; "victim": it failed because another one did; "benign"
    pattern: re.Pattern[str]
    versions: str


def _r(kind: str, role: str, regex: str, versions: str, flags: int = 0) -> Rule:
    return Rule(kind, role, re.compile(regex, flags), versions)


# One NCCL_DEBUG line: "host:pid:tid [cudaDev] NCCL WARN|INFO|ERROR|TRACE message" (NCCL 2.x, all versions).
# Collectors put anything in front (mpirun "[1,0]<stdout>:", pdsh "host: ", Ray "(pid=N) date time "); NCCL >= 2.12
# puts "file.cc:line " before the level.
NCCL_LINE = re.compile(r"(?:^|[\s:>\]])(?P<host>[\w.-]+|<[\w.-]+>):(?P<pid>\d+):(?P<tid>\d+) \[(?P<gpu>\d+)\] (?:[\w./-]+:\d+ )?"
                       r"NCCL (?P<level>WARN|ERROR|INFO|TRACE|ABORT) ?(?P<msg>.*)$")

# NCCL WARN lines that healthy jobs print (startup probing, shutdown noise): never a failure on their own.
BENIGN_NCCL_WARN = re.compile(
    r"Could not find real path of|NET/Plugin ?: (?:Plugin load|Could not find|No plugin found)|Unable to load"
    r"|Cuda failure 'driver shutting down'|Cuda failure \d* ?'(?:CUDA )?driver shutting down"
    r"|\[Proxy Service(?: UDS)?\] Failed to execute operation Close|\[Service thread\] Accept failed Resource temporarily"
    r"|NCCL_\w+ set by environment to|Ignoring NCCL_|Unrecognized parameter|ncclMaxSharedMem|Failed to find CUDA "
    r"library|NVLS multicast support is not available|Missing \"iommu=pt\"|GDR is disabled|Failed to open libibverbs"
    r"|No IB device found|NET/IB : No device found|Could not get CUDA|Unable to set CPU affinity"
    r"|bootstrap.*Connection closed by remote peer.*abort|cudaDriverGetVersion|Got async event"
    r"|TUNER/Plugin|PROFILER/Plugin"
    # The proxy service thread at teardown (proxy.cc, NCCL 2.12-2.30): a peer that closed its connection before
    # saying who it is has localRank -1; after the job's last collective this is shutdown order, not a failure.
    r"|\[Service thread\] (?:Unknown command \d+|Could not receive type|Connection closed) (?:from|by) localRank -1",
    re.IGNORECASE)

RULES: tuple[Rule, ...] = (
    # --- memory -------------------------------------------------------------------------------------------------
    _r("oom", "cause", r"(?:torch\.(?:cuda\.)?OutOfMemoryError|RuntimeError): CUDA out of memory|CUDA error: out of "
       r"memory|Cuda failure '?out of memory|Failed to CUDA (?:calloc|malloc|host alloc)(?: async)? \d+ bytes"
       r"|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED",
       "RuntimeError 1.x-1.13; torch.cuda.OutOfMemoryError 2.0-2.4; torch.OutOfMemoryError 2.5-2.13; NCCL WARN "
       "'Cuda failure 'out of memory'' and 'Failed to CUDA calloc N bytes' 2.8-2.30"),
    # --- DDP's construction-time model check (reducer.cpp verify_params_across_processes) --------------------------
    _r("model-mismatch", "cause", r"DDP expects same model across all ranks, but Rank (?P<me>\d+) has (?P<n>\d+) params,"
       r" while rank (?P<odd>\d+) has inconsistent (?P<m>\d+) params", "1.12-2.13"),
    _r("model-mismatch", "cause", r"params\[(?P<idx>\d+)\] in this process with sizes \[(?P<shape>[^\]]*)\] appears not "
       r"to match (?:sizes|strides) of the same param in process (?P<ref>\d+)", "1.12-2.13 (strides: 2.0-2.13)"),
    _r("model-mismatch", "cause", r"DDP expects same model across all ranks|parameter.*appears not to match", "1.12-2.13"),
    # --- DDP's reducer: a parameter's gradient hook fired twice in one backward (reducer.cpp mark_variable_ready) ----
    _r("ready-twice", "cause", r"Expected to mark a variable ready only once|has been marked as ready twice",
       "torch 1.x-2.13 ('Parameter at index N with name X' with TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL, and in every "
       "message from 2.2)"),
    # --- FSDP / FSDP2 / DTensor: a unit or a placement the ranks (or the wrapper) cannot shard ---------------------
    _r("fsdp-error", "cause", r"`?FlatParameter`? requires uniform `?requires_grad|Must flatten tensors with uniform "
       r"`?(?:requires_grad|dtype)|output tensor size must be equal to world_?size times input tensor size|input "
       r"tensor must be the same size as output size times world ?size|Non-sharded dimensions should have identical "
       r"size across ranks|requires even sharding|is not divisible by FSDP world size|`placements` must have the same "
       r"length as `device_mesh\.ndim`|Expected one placement per mesh dim|Cannot distribute a DTensor with "
       r"(?:placements|device mesh)|got mixed torch\.Tensor and DTensor|FSDP parameters should be materialized from "
       r"meta device|FSDP reduce-scatter expects uniform gradient dtype|Sharding propagation failed for|input DTensor has"
       r"(?: placements)?\b",
       "FSDP1 'FlatParameter requires uniform requires_grad' 1.13-2.0, 'Must flatten tensors with uniform "
       "requires_grad' 2.1-2.13; all_gather_into_tensor size check (ProcessGroupNCCL) 1.13-2.13; FSDP2 and DTensor "
       "2.4-2.13"),
    # --- NCCL watchdog stuck / heartbeat monitor ------------------------------------------------------------------
    _r("watchdog-stuck", "cause", r"ProcessGroupNCCL's watchdog got stuck for (?P<secs>\d+) seconds", "2.3-2.13"),
    _r("watchdog-stuck", "cause", r"Heartbeat monitor timed out!", "2.3-2.6 (then the fatal line above)"),
    _r("watchdog-stuck", "cause", r"NCCL monitor thread timeout", "2.2"),
    _r("watchdog-stuck", "cause", r"due to ProcessGroupNCCL watchdog hang", "2.5-2.13 (the [F line after the above)"),
    # --- NCCL errors (torch's 'NCCL error in: FILE:LINE, <ncclGetErrorString>, NCCL version X' and NCCL's WARNs) ---
    _r("nccl-remote", "victim", r"remote process exited or there was a network error|ncclRemoteError"
       r"|Connection closed by remote peer|Comm \S+ is in abort state|NCCL communicator was aborted"
       r"|Net : Connection closed|socketProgress(?:Opt)?: Connection closed|Call to recv from \S+ failed"
       r"|Socket recv failed while polling|Failed to execute operation \w+ from rank \d+, retcode 6",
       "ncclRemoteError NCCL 2.13-2.30; 'Net : Connection closed by remote peer' 2.8-2.17, 'socketProgress: ...' "
       "2.18-2.30"),
    _r("nccl-error", "cause", r"unhandled cuda error|ncclUnhandledCudaError|Cuda failure|an illegal memory access was "
       r"encountered.*NCCL|NCCL.*an illegal memory access",
       "'unhandled cuda error' NCCL 2.8-2.17, '... (run with NCCL_DEBUG=INFO for details)' 2.18-2.30"),
    _r("nccl-error", "cause", r"unhandled system error|ncclSystemError|ncclInternalError|internal error - please report"
       r"|ncclInvalidUsage|ncclInvalidArgument|NCCL error in:|Got completion (?:from peer \S+ )?with (?:error|status)"
       r"|NET/IB ?: .*(?:failed|error)|Call to ibv_\w+ failed|Error: failed to extend \S+ to \d+ bytes",
       "NCCL 2.8-2.30; 'NCCL error in:' torch 1.12-2.13"),
    # libfabric providers' own warnings (efa, cxi, verbs: "libfabric:PID:TIME::efa:cq:fn():LINE<warn> err: 5,
    # message: Invalid address", cxi "RC_UNDELIVERABLE") and aws-ofi-nccl's "NET/OFI Request ... completed with
    # error": a completion error on the network, like an IB completion error.
    _r("nccl-error", "cause", r"libfabric:\d+:\d+:+\w+:\w+:\S+<(?:warn|error)>.*(?:err: ?\d+|prov_err|UNDELIVERABLE"
       r"|UNREACH|UNRESP|unreachable|Invalid address)|\bRC_UNDELIVERABLE\b|\bUNDELIVERABLE\b.*(?:cxi|fabric|OFI)"
       r"|NET/OFI .*completed with error", "libfabric 1.x providers; aws-ofi-nccl 1.x"),
    # --- CUDA errors outside NCCL (a rank's own fault: the others wait for it) -----------------------------------
    _r("cuda-error", "cause", r"CUDA error: (?!out of memory)[A-Za-z]|an illegal memory access was encountered"
       r"|device-side assert triggered|uncorrectable ECC error", "torch 1.x-2.13 (CUDA runtime messages)"),
    # --- TCPStore / rendezvous --------------------------------------------------------------------------------------
    # Connecting is what a process does at start-up; mid-job the connection exists and breaks (recvValue, reset).
    _r("store-cause", "cause", r"connect\(\) timed out|client socket has timed out after \S+ while trying to connect"
       r"|client socket has failed to connect to any network address|Connection refused.*(?:TCPStore|connect)"
       r"|failed to connect/validate", "'connect() timed out' 1.9-1.13; 'The client socket has timed out after Ns while "
       "trying to connect to (host, port)' 2.0-2.13"),
    _r("store-cause", "cause", r"Address already in use|Timed out after \d+ seconds waiting for clients\. (?P<joined>\d+)"
       r"/(?P<expected>\d+) clients joined|RendezvousTimeoutError|The server socket has failed to (?:listen|bind)",
       "'waiting for clients' 2.0-2.13; RendezvousTimeoutError 1.9-2.13"),
    _r("store", "victim", r"retr(?:ie|ei)ving ncclUniqueId from \[\d+\] via c10d key-value store",
       "retreiving (sic) torch 1.11-2.1, retrieving 2.2-2.13 (ProcessGroupNCCL broadcastUniqueNCCLID)"),
    # A store that never answered: c10d's socket warnings ('waitForInput: poll for socket SocketImpl(...) returned 0,
    # likely a timeout', then 'waitForInput: socket SocketImpl(...) timed out after Nms') and Store::wait's error.
    _r("store-timeout", "victim", r"waitForInput: (?:poll for )?socket .*(?:likely a timeout|timed out after \d+ ?ms)"
       r"|wait timeout after \d+ ?ms, keys:|\bSocket Timeout\b",
       "socket.cpp waitForInput 2.3-2.13 (C10D_WARNING); 'wait timeout after Nms, keys:' Store::wait 2.4-2.13, "
       "'Socket Timeout' 1.x-2.3"),
    _r("store", "victim", r"recvValue failed|sendBytes failed|Broken pipe|DistNetworkError|DistStoreError"
       r"|RendezvousConnectionError|RendezvousClosedError|The client socket has failed to connect|failed to "
       r"connect/validate|Stop_waiting response is expected|TCPStore|c10d store has failed|Socket Timeout"
       r"|Connection refused|client socket has timed out|connect\(\) timed out", "recvValue/sendBytes failed 2.4-2.13 (older: 'Connection reset by peer'); "
       "DistNetworkError 2.0-2.13; RendezvousConnectionError 1.9-2.13"),
    # --- gloo -------------------------------------------------------------------------------------------------------
    _r("gloo-io", "victim", r"gloo::IoException|Connection closed by peer|Read error \[|Write error|Connection reset "
       r"by peer|Application timeout caused pair closure|gloo::EnforceNotMet.*(?:pair|socket)",
       "gloo pair.cc, every torch 1.x-2.13"),
    # --- the job stopped from outside (scheduler time limit, preemption, scancel, Ctrl-C to the launcher) ---------
    _r("stopped", "cause", r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO (?P<why>[A-Z ]+?))? \*\*\*",
       "slurmstepd, all SLURM versions"),
    _r("stopped", "cause", r"Received (?P<sig>\d+) death signal, shutting down workers", "torch 1.9-2.13 agent"),
    # --- the launcher tearing the survivors down --------------------------------------------------------------------
    _r("teardown", "victim", r"Sending process \d+ closing signal SIG\w+|SignalException|got signal: (?:1|2|15)\b"
       r"|KeyboardInterrupt", "elastic agent 1.9-2.13"),
)

# Lines that say something failed (never-silent rule); anything they hold that no rule explains is quoted.
FAILURE_LINE = re.compile(
    r"^Traceback \(most recent call last\)|^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::|$)"
    r"|\bNCCL WARN\b|\bexit ?code:? ?-?[1-9]\d*|\bexitcode: -?[1-9]|\bexit status [1-9]|^\s*Killed\b|\bKilled\s+\S*python"
    r"|\bAborted\b|core dumped|Segmentation fault|terminate called after|Fatal Python error|\bOOM\b|oom-kill"
    # Python logging at ERROR/CRITICAL ("ERROR:root:...", "[ERROR]", "... - ERROR - ...", "| ERROR |")
    r"|^(?:ERROR|CRITICAL):|\[(?:ERROR|CRITICAL)\]| - (?:ERROR|CRITICAL) - |\| (?:ERROR|CRITICAL) \|")

# torchrun / elastic agent: "failed (exitcode: -9) local_rank: 4 (pid: 123) of binary: /usr/bin/python3"
# (1.9-2.13; prefixed "ERROR:torch.distributed.elastic.multiprocessing.api:" in 1.9-2.0, "[...] torch.distributed.
# elastic.multiprocessing.api: [ERROR]" in 2.1, glog "E1122 ... api.py:NNN]" from 2.2).
AGENT_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
                          r"(?: of (?:binary|fn): ?(?P<binary>\S*))?")
# DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler, 0.3-0.16): "[launch.py:NNN:sigkill_handler]
# ['python', '-u', 'x.py', '--local_rank=1', ...] exits with return code = -11" (after "Killing subprocess PID");
# the rank is only in the command when the launcher passes --local_rank (not with --no_local_rank).
DS_EXITS = re.compile(r"\] exits with return code = (?P<code>-?\d+)")
# torch.distributed.launch of torch 1.0-1.8 (before it became a torchrun wrapper): "subprocess.CalledProcessError:
# Command '[..., '--local_rank=7', ...]' died with <Signals.SIGSEGV: 11>." or "... returned non-zero exit status 1."
OLD_LAUNCH = re.compile(r"CalledProcessError: Command .*?(?:died with <Signals\.(?P<sig>SIG\w+): (?P<num>\d+)>"
                        r"|returned non-zero exit status (?P<code>\d+))")
LOCAL_RANK_ARG = re.compile(r"--local[_-]rank[= ]'?(\d+)")
# The shell's report of a killed or crashed child: "Killed", "bash: line 1: 123 Killed  python ...",
# "Aborted (core dumped)", "Segmentation fault (core dumped)".
SHELL_DEATH = re.compile(r"^(?:\S+: line \d+: +)?(?:\d+ +)?(?P<what>Killed|Aborted|Segmentation fault|Bus error)"
                         r"(?: \(core dumped\))?(?:\s+\S.*)?$")
# "GPU 0; 79.15 GiB total capacity" (1.x-2.0), "GPU 0 has a total capacity of" (2.1-2.13).
OOM_GPU = re.compile(r"GPU (\d+)(?:;| has a total)")
TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")
HOST_IN_BRACKETS = re.compile(r"\[([\w.-]+)\]:\d+")
# init_process_group's store-based barrier (distributed_c10d._store_based_barrier): "Waiting in store based barrier to
# initialize process group for rank: 0, key: store_based_barrier_key:1 (world_size=8, worker_count=1,
# timeout=0:30:00)" (INFO, torch 1.8-1.13), "... for 10.0 seconds rank: 3, key: ... (world_size=8,
# num_workers_joined=1, timeout=0:30:00 error=...)" (DEBUG, 2.0-2.13), and the timeout "Timed out initializing
# process group in store based barrier on rank: 0, for key: ... (world_size=8, worker_count=7, timeout=0:30:00)"
# (RuntimeError 1.8-1.13, DistStoreError with num_workers_joined 2.0-2.13).
_BARRIER_COUNTS = re.compile(r"\(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)=(?P<joined>\d+)"
                             r"(?:, timeout=(?P<timeout>[^)=\s]{1,40}(?: days?, [\d:]{1,12})?))?")
_BARRIER_RANK = re.compile(r"\brank:? (\d+)")
_BARRIER_KEY = re.compile(r"\bkey: ?([\w:/-]{1,200})")


@dataclass(frozen=True)
class StoreBarrier:
    world: int
    joined: int
    rank: int | None
    key: str | None
    timeout: str | None


def store_barrier(text: str) -> StoreBarrier | None:
    """The counts of one store-based barrier line (each search starts at its own literal: linear in the line)."""
    if "store based barrier" not in text:
        return None
    m = _BARRIER_COUNTS.search(text)
    if not m:
        return None
    r, k = _BARRIER_RANK.search(text), _BARRIER_KEY.search(text)
    return StoreBarrier(int(m.group("world")), int(m.group("joined")), int(r.group(1)) if r else None,
                        k.group(1) if k else None, m.group("timeout"))
