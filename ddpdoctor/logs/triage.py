"""Root cause over victims: findings from the failure grammar (oom, model-mismatch, nccl-error, watchdog-stuck,
store-failure, peer-lost, unrecognised-failure), then every error finding told which ranks were only its victims.

Evidence is ordered by kind and time: a rank that ran out of memory, was killed, raised, or was built with a different
model comes before the store resets, closed connections and timeouts the others print because of it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ddpdoctor.findings.failure import hang_finding
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.logs.causes import Cause, last_error, nccl_cause
from ddpdoctor.logs.events import FailureLine, RankException, TimelineRow, Unexplained, WatchdogTimeout
from ddpdoctor.logs.grammar import store_barrier

# Which findings name the cause, first (lower = earlier in the report when several are errors).
_PRIORITY = {"oom": 0, "rank-crashed": 1, "model-mismatch": 1, "cuda-error": 1, "fsdp-error": 1,
             "param-ready-twice": 1, "collective-mismatch": 2, "nccl-error": 2,
             "watchdog-stuck": 3, "hang": 3, "job-stopped": 4, "store-failure": 4, "peer-lost": 5, "job-failed": 6,
             "unrecognised-failure": 7}
_OOM_TEXT = re.compile(r"out of memory|OutOfMemoryError|Failed to CUDA (?:calloc|malloc)", re.IGNORECASE)
_CONNECT = re.compile(r"connect\(\) timed out|while trying to connect|failed to connect|Connection refused")
_ENDPOINT = re.compile(r"connect to \(?\[?([\w.:-]+?)\]?(?:, |:)(\d+)\)?")
_NETWORK = re.compile(r"libfabric|NET/OFI|UNDELIVERABLE|NET/IB ?: .*(?:completion|failed)|Got completion|ibv_")
_QUOTE_LINES = 3
_QUOTE_GROUPS = 16


def _who(e: FailureLine | Unexplained) -> str:
    if e.rank is not None:
        return f"rank {e.rank}"
    host = getattr(e, "host", None)
    gpu = getattr(e, "gpu", None)
    if host:
        return f"host {host}" + (f" GPU {gpu}" if gpu is not None else "")
    return e.where.source


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks[:16]) + ("…" if len(ranks) > 16 else "")


def _first(lines: list[FailureLine]) -> FailureLine:
    """The earliest line by timestamp where lines have one, else the first in the input."""
    return min(lines, key=lambda e: (e.ts is None, e.ts or 0.0, e.where.source, e.where.lineno))


def _group(lines: list[FailureLine]) -> dict[str, list[FailureLine]]:
    out: dict[str, list[FailureLine]] = {}
    for e in sorted(lines, key=lambda e: (e.ts is None, e.ts or 0.0, e.where.source, e.where.lineno)):
        out.setdefault(_who(e), []).append(e)
    return out


def _lines_json(lines: Sequence[FailureLine | Unexplained]) -> list[str]:
    return [f"{e.where}: {e.text[:300]}" for e in lines[:_QUOTE_LINES]]


def _oom(lines: list[FailureLine], excs: list[RankException]) -> Finding | None:
    ooms = [e for e in lines if e.kind == "oom"]
    ooms_exc = [e for e in excs if _OOM_TEXT.search(e.message) or "OutOfMemoryError" in e.exc_type]
    if not ooms and not ooms_exc:
        return None
    ranks = sorted({e.rank for e in ooms if e.rank is not None} | {e.rank for e in ooms_exc if e.rank is not None})
    places = sorted({_who(e) for e in ooms if e.rank is None})
    gpus = sorted({f"GPU {e.gpu}" + (f" on {e.host}" if e.host else "") for e in ooms if e.gpu is not None})
    first = ooms_exc[0].exception if ooms_exc else _first(ooms).text
    tried = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", " ".join([first] + [e.text for e in ooms]))
    sites = {str(e.rank): str(f) for e in ooms_exc if (f := e.user_frame()) is not None}
    who = f"rank(s) {_ranks_text(ranks)}" if ranks else ", ".join(places) or "a rank"
    return Finding(
        "oom", Severity.ERROR,
        f"{who[0].upper() + who[1:]} ran out of GPU memory" + (f" ({', '.join(gpus)})" if gpus else "")
        + (f" allocating {tried.group(1)}" if tried else ""),
        ranks=ranks,
        evidence={"culprit_ranks": ranks, "where": places, "gpus": gpus, "first_error": first.splitlines()[0][:300],
                  "tried_to_allocate": tried.group(1) if tried else None, "call_sites": sites,
                  "lines": _lines_json([*ooms]),
                  "why": "an out-of-memory error is the rank's own failure; the other ranks' timeouts and closed "
                         "connections follow from it"},
        advice="Reduce this rank's memory: a smaller batch or sequence (is the data uneven across ranks?), "
               "activation checkpointing, or fewer buffers; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps "
               "fragmentation. An NCCL 'Failed to CUDA calloc' means NCCL itself found no room for its buffers.",
    )


_PARAM_COUNTS = re.compile(r"Rank (\d+) has (\d+) params, while rank (\d+) has inconsistent (\d+) params")


def _model_mismatch(lines: list[FailureLine]) -> Finding | None:
    found = [e for e in lines if e.kind == "model-mismatch"]
    if not found:
        return None
    printers = sorted({e.rank for e in found if e.rank is not None})
    counts: dict[int, int] = {}
    for e in found:
        for m in _PARAM_COUNTS.finditer(e.text):
            counts[int(m.group(1))] = int(m.group(2))
            counts.setdefault(int(m.group(3)), int(m.group(4)))
    by_count = Counter(counts.values())
    odd: list[int] = []
    if len(by_count) > 1 and by_count.most_common(2)[0][1] > by_count.most_common(2)[1][1]:
        usual = by_count.most_common(1)[0][0]
        odd = sorted(r for r, n in counts.items() if n != usual)  # the ranks whose parameter count is the minority
    else:
        named = Counter(e.odd_rank for e in found if e.odd_rank is not None)
        if named:
            top = max(named.values())
            odd = sorted(r for r, n in named.items() if n == top)
    per_rank = ", ".join(f"rank {r}: {n} params" for r, n in sorted(counts.items()))
    ambiguous = len(odd) > 1 and len(counts) == 2
    first = _first(found)
    title = (f"DDP's model check: ranks {_ranks_text(odd)} hold different models ({per_rank}); with two ranks the "
             "check cannot say which one is wrong" if ambiguous else
             f"DDP's model check: rank(s) {_ranks_text(odd) if odd else '?'} hold a different model than the others"
             + (f" ({per_rank})" if per_rank else "")
             + (f"; printed by rank(s) {_ranks_text(printers)}" if printers and printers != odd else ""))
    return Finding(
        "model-mismatch", Severity.ERROR, title, ranks=odd or printers,
        evidence={"culprit_ranks": odd, "printed_by": printers, "params_per_rank": {str(r): n for r, n in
                                                                                    sorted(counts.items())},
                  "message": first.text[:500], "lines": _lines_json(found),
                  "why": "DistributedDataParallel compares every rank's parameters at construction; the message names "
                         "the rank whose parameter count or shapes differ, not the rank that printed it"},
        advice="Build the same model on every rank before wrapping it in DDP: look for rank-dependent branches in "
               "model construction, a checkpoint or adapter loaded on some ranks only, or a different config per node.",
    )


_INTERNAL = re.compile(r"internal error|ncclInternalError|Internal check failed|retcode 3\b")


def _cuda(lines: list[FailureLine]) -> Finding | None:
    found = [e for e in lines if e.kind == "cuda-error"]
    if not found:
        return None
    first = _first(found)
    ranks = sorted({e.rank for e in found if e.rank is not None})
    return Finding(
        "cuda-error", Severity.ERROR,
        f"CUDA error on {('rank(s) ' + _ranks_text(ranks)) if ranks else _who(first)}: {first.text[:160]}",
        ranks=ranks,
        evidence={"culprit_ranks": ranks, "first_error": first.text[:500], "lines": _lines_json(found),
                  "why": "a CUDA error (illegal memory access, device-side assert, ECC) kills this rank's stream; "
                         "the others then wait for it until their watchdog fires"},
        advice="Re-run with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA for device asserts) to get the kernel "
               "that failed; an index out of range in an embedding or loss is the usual device-side assert; ECC "
               "and Xid errors in dmesg point at the GPU itself.",
    )


def _nccl_cause(found: list[FailureLine]) -> tuple[FailureLine, Cause] | None:
    """The line that names NCCL's cause (a `Last error:` line first, then a WARN), with the cause it names."""
    ordered = sorted(found, key=lambda e: ("Last error:" not in e.text, e.ts is None, e.ts or 0.0, e.where.source,
                                           e.where.lineno))
    for e in ordered:
        cause = nccl_cause(last_error(e.text) or e.text)
        if cause is not None:
            return e, cause
    return None


def _nccl(lines: list[FailureLine]) -> Finding | None:
    found = [e for e in lines if e.kind == "nccl-error"]
    if any(e.kind == "nccl-remote" for e in lines):
        # ncclRemoteError surfaces as ncclInternalError in NCCL < 2.19 (NVIDIA/nccl#795): with a closed connection
        # in the same logs, an internal error is the peer's death seen from here, not a fault of this GPU.
        found = [e for e in found if not _INTERNAL.search(e.text)]
    if not found:
        return None
    groups = _group(found)
    first = _first(found)
    ranks = sorted({e.rank for e in found if e.rank is not None})
    places = sorted({f"{e.host} GPU {e.gpu}" for e in found if e.host is not None and e.gpu is not None})
    named = _nccl_cause(found)
    cause = named[1] if named else None
    network = (cause.where == "network") if cause else bool(_NETWORK.search(first.text))
    where = ", ".join(places[:4]) or _who(named[0] if named else first)
    title = (f"NCCL error on {where}: {cause.name}" if cause and cause.where != "network" else
             f"Network error on {where}: {cause.name}" if cause else
             ("Network error (a completion error on the fabric)" if network else "NCCL error")
             + f" on {where}: {first.text[:160]}")
    evidence: dict[str, object] = {
        "culprit_ranks": ranks, "where": places, "first_error": first.text[:500],
        "per_place": {k: _lines_json(list(v)) for k, v in list(groups.items())[:_QUOTE_GROUPS]},
        "why": "NCCL failed on this GPU or host (a CUDA, memory or network error), not because a peer left"}
    if cause and named:
        evidence.update({"cause": cause.name, "cause_kind": cause.where, "cause_line": named[0].text[:500],
                         "why": cause.why})
    generic = ("Read the NCCL WARN lines of that host (NCCL_DEBUG=INFO gives the context): a CUDA failure points at "
               "the GPU (nvidia-smi, Xid errors in dmesg), an IB completion error or failed ibv_* call at the NIC or "
               "link, 'failed to extend /dev/shm' at the container's shared memory size.")
    return Finding(
        "nccl-error", Severity.ERROR, title, ranks=ranks, evidence=evidence,
        advice=(cause.advice + " " if cause else "")
        + ("A libfabric/OFI or IB completion error is the network between the nodes: check that they reach "
           "each other on the fabric (EFA: the security group must allow all traffic within itself; IB: link "
           "state with ibstat, port counters), then NCCL_DEBUG=INFO for the failing peer. "
           if network and not cause else "") + (generic if not cause else ""),
    )


def _init_hang(lines: list[FailureLine]) -> Finding | None:
    """init_process_group's store-based barrier that never filled: a hang at start-up, with who arrived."""
    found = [e for e in lines if e.kind == "init-barrier"]
    if not found:
        return None
    seen = [(e, b) for e in found if (b := store_barrier(e.text))]
    if not seen:
        return None
    last, m = max(seen, key=lambda eb: (eb[0].ts is None, eb[0].ts or 0.0, eb[0].where.lineno))
    world, joined = m.world, m.joined
    waiting = sorted({b.rank for _, b in seen if b.rank is not None} | {e.rank for e, _ in seen if e.rank is not None})
    timed_out = any("Timed out initializing" in e.text for e, _ in seen)
    too_many = joined > world
    title = (f"Hang at start-up: {joined} processes joined init_process_group's barrier for a world of {world}: "
             "two jobs share the store, or the launch started more processes than the world size" if too_many else
             f"Hang at start-up: only {joined} of {world} ranks reached init_process_group's barrier"
             + (" before its timeout" if timed_out else "") + (f" (key {m.key})" if m.key else ""))
    return hang_finding(
        title, waiting,
        ("Two launches on one MASTER_ADDR:MASTER_PORT (a previous run still alive, two jobs on one node with the "
         "default port), or `python -m torch.distributed.launch` around a script that spawns its own processes: "
         "give each job its own port and check --nproc-per-node x --nnodes = WORLD_SIZE." if too_many else
         "The ranks that never arrived were not started or died before init_process_group: check that every node "
         "ran the launch (--nnodes, --node-rank distinct per node), that WORLD_SIZE matches the processes started "
         "(--nproc-per-node x --nnodes), that every node reaches MASTER_ADDR:MASTER_PORT, and the missing ranks' "
         "own logs for an error before the barrier."),
        stalled_ranks=waiting, culprit_ranks=[], collective="init_process_group (store-based barrier)",
        call_sites={}, stacks={}, detected_after_s=None, phase="init", arrived=joined, expected=world,
        barrier_key=m.key, timeout=m.timeout, lines=_lines_json([last]),
        why=("the barrier counts the processes that called init_process_group on this store; more than the world "
             "size means processes of another launch joined it" if too_many else
             "init_process_group waits until every rank has added itself to the store; the count stayed below the "
             "world size, so the job never started"))


_READY_TWICE = re.compile(r"Parameteratindex(?P<index>\d+)(?:withname(?P<name>\S+?))?hasbeenmarkedasreadytwice")


def _ready_twice(lines: list[FailureLine], excs: list[RankException]) -> Finding | None:
    found = [e for e in lines if e.kind == "ready-twice"]
    if not found:
        return None
    ranks = sorted({e.rank for e in found if e.rank is not None})
    # The message is often hard-wrapped by the terminal inside the parameter's name: read it without whitespace.
    m = None
    for e in found:
        m = _READY_TWICE.search("".join(e.text.split()))
        if m:
            break
    sites = {str(e.rank): str(f) for e in excs if "ready only once" in e.message and (f := e.user_frame())}
    param = (m.group("name") or f"index {m.group('index')}") if m else None
    return Finding(
        "param-ready-twice", Severity.ERROR,
        f"DDP: parameter {param + ' ' if param else ''}was marked ready twice in one backward"
        + (f" on rank(s) {_ranks_text(ranks)}" if ranks else "")
        + ": reentrant activation checkpointing or a parameter used by two passes", ranks=ranks,
        evidence={"culprit_ranks": ranks, "parameter": m.group("name") if m else None,
                  "parameter_index": int(m.group("index")) if m else None, "call_sites": sites,
                  "lines": _lines_json(found),
                  "why": "DDP's reducer expects one gradient hook per parameter per backward; a second one means the "
                         "parameter took part in two backward passes of one iteration: reentrant "
                         "torch.utils.checkpoint (use_reentrant=True, the old default) replays a segment's backward, "
                         "a module or weight is shared by two checkpointed segments, or a parameter is used outside "
                         "forward"},
        advice="Use non-reentrant checkpointing: torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False) "
               "(Hugging Face: gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})). "
               "If the graph is the same every iteration, DDP(..., static_graph=True) accepts reentrant backward; "
               "drop find_unused_parameters=True when nothing is unused. TORCH_DISTRIBUTED_DEBUG=DETAIL names the "
               "parameter when the message shows only its index.",
    )


_FSDP_CAUSES: tuple[tuple[re.Pattern[str], str, str, str], ...] = (
    (re.compile(r"uniform `?requires_grad"), "parameters with and without requires_grad in one FSDP unit",
     "FSDP1 flattens each unit's parameters into one FlatParameter, which has one requires_grad; a frozen base "
     "weight and a trainable adapter (LoRA, a frozen encoder) in one wrapped module cannot be flattened",
     "Pass use_orig_params=True to FullyShardedDataParallel (Accelerate: fsdp_use_orig_params: true), or wrap "
     "the frozen and the trainable parameters in different units (an auto-wrap policy that puts the adapters in "
     "their own units), or move to FSDP2 (fully_shard), which keeps each parameter's requires_grad."),
    (re.compile(r"uniform `?dtype|uniform gradient dtype"), "mixed dtypes in one FSDP unit",
     "the parameters (or gradients) of one unit have different dtypes and FSDP flattens or reduces them as one",
     "Cast the module to one dtype before wrapping (model.to(torch.bfloat16)) and use MixedPrecision / "
     "MixedPrecisionPolicy for compute and reduce dtypes, or wrap the odd-dtype parameters in their own unit."),
    (re.compile(r"world_?size times input tensor size|same size as output size times world ?size|Non-sharded "
                r"dimensions should have identical size across ranks"),
     "the ranks hold different sizes for one all-gather or reduce-scatter",
     "a collective that gathers or scatters shards needs the same shard size on every rank; one rank built a "
     "different model or shard (a rank-dependent layer, a checkpoint loaded on some ranks, an uneven input)",
     "Build and shard the same model on every rank (no rank-dependent construction; load the checkpoint on all "
     "ranks or broadcast it); TORCH_DISTRIBUTED_DEBUG=DETAIL prints each rank's shapes for the collective."),
    (re.compile(r"requires even sharding|not divisible by FSDP world size"),
     "a parameter dimension not divisible by the shard group's size",
     "FSDP2 shards this parameter on a dimension its size does not divide evenly (Shard(d) with d != 0, or an "
     "extension that needs even shards)",
     "Shard on dim 0 (the default shard_placement_fn), pad the dimension to a multiple of the group size, or use "
     "a shard group size that divides it."),
    (re.compile(r"placements|placement per mesh dim|device mesh|mixed torch\.Tensor and DTensor|Sharding "
                r"propagation failed|input DTensor has"), "a DTensor placement error",
     "a DTensor was created or redistributed with placements that do not fit its mesh (one placement per mesh "
     "dimension), or an operator mixed plain tensors with DTensors",
     "Give one placement per mesh dimension (a 2-D HSDP/TP mesh needs two), build every DTensor on the same mesh, "
     "and convert plain tensors with DTensor.from_local/distribute_tensor before mixing them."),
    (re.compile(r"materialized from meta device"), "parameters left on the meta device",
     "the model was built on the meta device and some parameters were never materialised before training",
     "Call model.to_empty(device=...) and then each module's reset_parameters() (or load the state dict) after "
     "fully_shard and before the first forward."),
)


def _fsdp(lines: list[FailureLine], excs: list[RankException]) -> Finding | None:
    found = [e for e in lines if e.kind == "fsdp-error"]
    if not found:
        return None
    first = _first(found)
    ranks = sorted({e.rank for e in found if e.rank is not None})
    name, why, advice = "an FSDP error", "FSDP or DTensor refused the model's layout", \
        "Read the quoted error; the FSDP unit or DTensor it names is where the layout differs."
    for pattern, n, w, a in _FSDP_CAUSES:
        if any(pattern.search(e.text) for e in found):
            name, why, advice = n, w, a
            break
    sites = {str(e.rank): str(f) for e in excs if e.rank in ranks and (f := e.user_frame())}
    return Finding(
        "fsdp-error", Severity.ERROR,
        f"FSDP/DTensor error on {('rank(s) ' + _ranks_text(ranks)) if ranks else _who(first)}: {name}",
        ranks=ranks,
        evidence={"culprit_ranks": ranks, "cause": name, "first_error": first.text[:500], "call_sites": sites,
                  "lines": _lines_json(found), "why": why},
        advice=advice,
    )


def _watchdog_stuck(lines: list[FailureLine]) -> Finding | None:
    found = [e for e in lines if e.kind == "watchdog-stuck"]
    if not found:
        return None
    ranks = sorted({e.rank for e in found if e.rank is not None})
    secs = re.search(r"stuck for (\d+) seconds", " ".join(e.text for e in found))
    return Finding(
        "watchdog-stuck", Severity.ERROR,
        f"ProcessGroupNCCL's watchdog got stuck on {('rank(s) ' + _ranks_text(ranks)) if ranks else _who(found[0])}"
        + (f" for {secs.group(1)} s" if secs else "") + ": a CUDA or NCCL call blocked",
        ranks=ranks,
        evidence={"culprit_ranks": ranks, "lines": _lines_json(found),
                  "why": "the heartbeat monitor saw the watchdog thread make no progress: a CUDA/NCCL call (event "
                         "query, abort, destroy) hung, often inside a collective that a peer never joined"},
        advice="Get the stacks of the stuck process (py-spy dump --native, or the Flight Recorder dump "
               "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 writes on this timeout). Raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC "
               "only if a long but healthy operation (checkpoint on GPU) explains it.",
    )


_WAITED_MS = re.compile(r"(?:timed out after|wait timeout after) (\d+) ?ms")
_REMOTE = re.compile(r"remote=(?:\[([^\]]+)\]|([\w.-]+)):(\d+)")
_KEYS = re.compile(r"keys: (.+)$")


def _store_timeout(timeouts: list[FailureLine]) -> Finding:
    """A store that never answered: c10d's socket warnings and Store::wait's timeout, with the store's address,
    the keys waited for and how long."""
    text = " ".join(e.text for e in timeouts)
    waited = max((int(m.group(1)) for m in _WAITED_MS.finditer(text)), default=None)
    remotes = sorted({f"{m.group(1) or m.group(2)}:{m.group(3)}" for m in _REMOTE.finditer(text)})
    keys = next((m.group(1)[:200] for e in timeouts if (m := _KEYS.search(e.text))), None)
    agents = bool(keys and ("torchelastic" in keys or "rdzv" in keys))
    ranks = sorted({e.rank for e in timeouts if e.rank is not None})
    return Finding(
        "store-failure", Severity.ERROR,
        "The c10d store timed out" + (f" after {waited / 1000:g} s" if waited else "")
        + (f" waiting for {remotes[0]}" if remotes else "")
        + (": torchrun's agents on the other nodes never published their part of the rendezvous" if agents else
           ": the process at the other end of the store's connection never answered"),
        ranks=ranks,
        evidence={"culprit_ranks": [], "waited_ms": waited, "store_addresses": remotes, "keys": keys,
                  "lines": _lines_json(timeouts),
                  "why": "a socket to the TCPStore was open (the connection was made) but no answer came within the "
                         "timeout: the store's host process is stuck or gone, or the peers it waits for never "
                         "arrived" + (" (the keys are torchrun's role_info/rendezvous keys: an agent of another node "
                                      "did not reach this point)" if agents else "")},
        advice="At start-up: check that every node ran torchrun with the same --rdzv-endpoint, --rdzv-id and "
               "--nnodes, that every node (the store's own host included: a loopback connection that also times out "
               "points at the host, a proxy or firewall, not the network) reaches the store's port, and that the "
               "nodes start within the rendezvous timeout (--rdzv-conf join_timeout=...). Mid-job: find why the "
               "process hosting the store (node 0's agent) stopped answering: its own log, dmesg, the scheduler.",
    )


def _store(lines: list[FailureLine], has_cause: bool) -> Finding | None:
    causes = [e for e in lines if e.kind == "store-cause"]
    victims = [e for e in lines if e.kind == "store"]
    timeouts = [e for e in lines if e.kind == "store-timeout"]
    if not causes and timeouts and not has_cause:
        return _store_timeout(timeouts)
    if not causes and (not victims or has_cause):
        return None
    found = causes or victims
    first = _first(found)
    ranks = sorted({e.rank for e in found if e.rank is not None})
    joined = re.search(r"(\d+)/(\d+) clients joined", first.text)
    unreached = bool(causes) and bool(_CONNECT.search(first.text))
    why = ("the TCPStore / rendezvous could not be set up: " + first.text[:200]) if causes else (
        "the connection to the TCPStore (hosted by rank 0's agent or the rendezvous endpoint) broke; with no "
        "crashed rank in these logs, the store's host itself died, was killed, or the network dropped")
    em = _ENDPOINT.search(first.text)
    endpoint = f" {em.group(1)}:{em.group(2)}" if em else ""
    if unreached:
        why = ("the process never reached the rendezvous endpoint" + endpoint
               + " at start-up (connecting timed out or was refused): the store was not there to reach, or not "
               "reachable from this host; no store died mid-job")
    return Finding(
        "store-failure", Severity.ERROR,
        ("The rendezvous endpoint" + endpoint + " was never reached at "
         f"start-up: {first.text[:140]}") if unreached else
        ("Rendezvous/store setup failed" + (f": only {joined.group(1)} of {joined.group(2)} processes joined"
                                             if joined else f": {first.text[:140]}")) if causes
        else f"Lost the connection to the c10d store on rank(s) {_ranks_text(ranks) or '?'}",
        ranks=ranks,
        evidence={"culprit_ranks": ranks if causes else [], "lines": _lines_json(found), "why": why},
        advice=("Check the endpoint's address and port (--rdzv-endpoint or MASTER_ADDR:MASTER_PORT) from this host "
                "(`nc -zv HOST PORT`), that no firewall or security group blocks the port, and the start order: the "
                "node that hosts the endpoint (node rank 0) must be up before the others' timeout runs out."
                if unreached else
                "Check that every node reaches MASTER_ADDR:MASTER_PORT (firewall, the right interface), that the "
                "port is free, and that every node was started (nnodes, --rdzv-endpoint) within the timeout."
                if causes else "Find the process that hosted the store (the first node's agent) and why it ended: "
                "its own log, the scheduler's accounting, dmesg for the OOM killer."),
    )


def _peer_lost(lines: list[FailureLine], culprits: set[int], known: set[int], has_cause: bool) -> Finding | None:
    victims = [e for e in lines if e.kind in ("gloo-io", "nccl-remote")]
    if not victims or culprits or has_cause:
        return None
    ranks = sorted({e.rank for e in victims if e.rank is not None})
    suspects = sorted(known - set(ranks)) if ranks else []
    return Finding(
        "peer-lost", Severity.ERROR,
        f"Rank(s) {_ranks_text(ranks) or '?'} lost a peer (closed or reset connection)"
        + (f"; suspect rank(s) {_ranks_text(suspects)}, which reported no such error" if suspects
           else "; the peer that died is not in these logs"),
        ranks=sorted(set(ranks) | set(suspects)),
        evidence={"victim_ranks": ranks, "culprit_ranks": suspects, "lines": _lines_json(victims),
                  "why": "a closed or reset connection is what a rank sees when its peer exits or is killed"},
        advice="Look at the suspect rank's own log and at the scheduler/kernel (dmesg, sacct) for a kill or crash.",
    )


def _stopped(lines: list[FailureLine]) -> Finding | None:
    found = [e for e in lines if e.kind == "stopped"]
    if not found:
        return None
    first = _first(found)
    why = re.search(r"DUE TO ([A-Z ]+?) \*\*\*", first.text)
    sig = re.search(r"Received (\d+) death signal", first.text)
    reason = (why.group(1).lower() if why else
              {"15": "SIGTERM (preempted or time limit?)", "2": "SIGINT (interrupted)", "1": "SIGHUP (terminal or "
               "session closed)"}.get(sig.group(1), f"signal {sig.group(1)}") if sig else "cancelled")
    return Finding(
        "job-stopped", Severity.ERROR, f"The job was stopped from outside: {reason}",
        evidence={"reason": reason, "lines": _lines_json(found),
                  "why": "the scheduler or a user stopped the launcher; the ranks' SIGTERM and closed connections that "
                         "follow are the shutdown, not failures of their own"},
        advice="A time limit: raise the job's --time or checkpoint and requeue (sbatch --requeue, "
               "torchrun --max-restarts with a checkpoint to resume from); preemption: use a non-preemptible "
               "partition or resume from checkpoints.",
    )


def _unrecognised(unexplained: list[Unexplained]) -> Finding | None:
    if not unexplained:
        return None
    groups: dict[str, list[Unexplained]] = {}
    for e in sorted(unexplained, key=lambda e: (e.ts is None, e.ts or 0.0, e.where.source, e.where.lineno)):
        groups.setdefault(_who(e), []).append(e)
    ranks = sorted({e.rank for e in unexplained if e.rank is not None})
    quoted = {k: _lines_json(list(v)) for k, v in list(groups.items())[:_QUOTE_GROUPS]}
    first_key = next(iter(groups))
    return Finding(
        "unrecognised-failure", Severity.ERROR,
        f"The log reports a failure no rule explains ({first_key}: {groups[first_key][0].text[:120]})", ranks=ranks,
        evidence={"first_lines": quoted, "ranks": ranks},
        advice="Read the quoted lines (the earliest first); `ddpdoctor logs --json` lists every parsed event. Please "
               "report the log so a rule can be added.",
    )


def _victims(findings: list[Finding], lines: list[FailureLine], timeouts: list[WatchdogTimeout],
             excs: dict[int, list[RankException]], classify: Any) -> list[Finding]:
    """Each error finding with culprits gets the ranks that only failed because of them, and why."""
    culprits: set[int] = set()
    for f in findings:
        if f.severity is Severity.ERROR:
            culprits |= set(f.evidence.get("culprit_ranks") or ([f.evidence["rank"]] if f.evidence.get("rank")
                                                                 is not None else []))
    victims: dict[int, str] = {}
    for e in lines:
        if e.role == "victim" and e.rank is not None and e.rank not in culprits:
            victims.setdefault(e.rank, e.text[:160])
    for t in timeouts:
        if t.rank is not None and t.rank not in culprits:
            victims.setdefault(t.rank, f"watchdog timeout in {t.op}" + (f" #{t.seq}" if t.seq is not None else ""))
    for r, es in excs.items():
        if r not in culprits and any(classify(e) == "victim" for e in es):
            victims.setdefault(r, next(e.exception for e in es if classify(e) == "victim")[:160])
    if not culprits or not victims:
        return findings
    out = []
    for f in findings:
        own = set(f.evidence.get("culprit_ranks") or ([f.evidence["rank"]] if f.evidence.get("rank") is not None
                                                      else []))
        if f.severity is Severity.ERROR and own and "victim_ranks" not in f.evidence:
            f = replace(f, evidence={**f.evidence, "victim_ranks": sorted(victims),
                                     "victims": {str(r): v for r, v in sorted(victims.items())[:32]},
                                     "victims_why": f"rank(s) {_ranks_text(sorted(victims))} only report what "
                                     "a failed peer leaves behind (closed or reset connections, store errors, "
                                     "timeouts); they follow from this finding's culprit"})
        out.append(f)
    return out


def triage(findings: list[Finding], events: list[Any], known: set[int], excs: dict[int, list[RankException]],
           classify: Any) -> list[Finding]:
    """The grammar's findings added to ``findings``, victims named, causes first."""
    lines = [e for e in events if isinstance(e, FailureLine)]
    unexplained = [e for e in events if isinstance(e, Unexplained)]
    all_excs = [e for es in excs.values() for e in es] + [e for e in events if isinstance(e, RankException)
                                                          and e.rank is None]
    new = [f for f in (_oom(lines, all_excs), _model_mismatch(lines), _cuda(lines), _nccl(lines),
                       _watchdog_stuck(lines), _init_hang(lines), _ready_twice(lines, all_excs),
                       _fsdp(lines, all_excs)) if f is not None]
    stopped = _stopped(lines)
    if stopped is not None and not new and all(f.id == "job-failed" for f in findings
                                               if f.severity is Severity.ERROR):
        new = [stopped]  # torchrun's table then only lists the ranks the shutdown killed
    findings = [f for f in findings if not (f.id == "job-failed" and new)] + new
    culprits = {r for f in findings if f.severity is Severity.ERROR
                for r in (f.evidence.get("culprit_ranks") or f.ranks)}
    # Any error finding is a cause the store resets and closed connections can follow from, even one that names a
    # host and GPU rather than a rank.
    has_cause = culprits or any(f.severity is Severity.ERROR for f in findings)
    findings += [f for f in (_store(lines, bool(has_cause)), _peer_lost(lines, culprits, known, bool(has_cause)))
                 if f is not None]
    if not any(f.severity is Severity.ERROR for f in findings):
        findings += [f for f in (_unrecognised(unexplained),) if f is not None]
    timeouts = [e for e in events if isinstance(e, WatchdogTimeout)]
    findings = _victims(findings, lines, timeouts, excs, classify)
    order = {id(f): i for i, f in enumerate(findings)}
    return sorted(findings, key=lambda f: (f.severity is not Severity.ERROR, _PRIORITY.get(f.id, 4), order[id(f)]))



def timeline(events: list[Any], limit: int = 50) -> list[TimelineRow]:
    """The failure lines of every input merged on their timestamps (lines without one keep their file order, after
    those that have one): what happened first across nodes and ranks."""
    lines = [e for e in events if isinstance(e, FailureLine | Unexplained)]
    lines.sort(key=lambda e: (e.ts is None, e.ts or 0.0, e.where.source, e.where.lineno))
    return [{"where": str(e.where), "rank": e.rank, "host": e.host,
             "kind": e.kind if isinstance(e, FailureLine) else "failure-line",
             "role": e.role if isinstance(e, FailureLine) else None, "text": e.text[:300]} for e in lines[:limit]]
