"""Turns every rank's preflight record into one row per check: pure functions, no I/O (see load_records).

A rank's record (RUN/ranks/rankR/preflight.json) holds its launcher variables, versions, devices, NCCL_*/TORCH_*
environment and the results of the checks it ran; what needs several ranks (same versions, a slow rank, a
missing rank) is decided here, where every record is in hand."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Literal, cast

from ddpdoctor.findings.model import Finding
from ddpdoctor.preflight.checks import CHECKS, FAIL, PASS, SKIPPED, WARN, CheckResult
from ddpdoctor.preflight.nccltable import BandwidthRow, plateau_busbw
from ddpdoctor.preflight.record import CheckOutcome, IbPort, RankPreflight, Records

# Expected busbw floor across nodes: this share of the slowest node's summed ACTIVE IB/RoCE port rate (GB/s).
# Healthy 2-node runs reach 1.2x (8x400G, ../shared nccl_tests 01) and 1.7x (8x200G TCPXO, 02) of that sum; the same
# hosts as VMs without PCIe topology reach 0.07x. 0.4 flags the broken case with a wide margin for healthy ones.
FABRIC_FLOOR_SHARE = 0.4
CLOCK_SKEW_WARN_MS = 100.0  # beyond this, cross-host timelines (traces, logs) misalign by more than a step
CLOCK_SKEW_FAIL_MS = 5000.0  # beyond this, NTP is not running on some host
HARMLESS_ENV = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES"}
ADVICE = {
    "address": "MASTER_ADDR does not resolve or is unreachable from these ranks: use an IP or a name every node "
               "resolves (check /etc/hosts, DNS, the interface torchrun picked).",
    "port": "Nothing listens on MASTER_PORT at MASTER_ADDR: rank 0 is not up yet, died, or uses another port; "
            "check that every node got the same --master-port/--rdzv-endpoint and that rank 0 started.",
    "firewall": "Connections to MASTER_ADDR:MASTER_PORT time out: a firewall or security group drops them; open the "
                "port range between the nodes (and NCCL's, see NCCL_SOCKET_IFNAME).",
    "peers": "The store is reachable but some ranks never arrived: look at those ranks' nodes (not started, crashed, "
             "wrong --nnodes/--node-rank, stuck in the scheduler).",
}


@dataclass
class MergeOptions:
    expected_world_size: int | None = None  # from the launch flags, when known
    min_busbw_gbps: float | None = None
    slow_rank_share: float = 0.2
    killed_by: str | None = None  # the parent's deadline, when it ended the job
    local_view: bool = False  # --launcher none on a rank other than 0: judge only the records at hand


def load_records(run_root: Path) -> Records:
    """Every rank's record: RUN/ranks/rankR/preflight.json, completed from rank 0's gathered RUN/preflight.json.
    Each is validated against its schema (rundir/schema.py): a damaged one is bad input naming file and field."""
    from ddpdoctor.rundir import artefacts
    from ddpdoctor.rundir.schema import PreflightGathered, PreflightRecord

    records: Records = {}
    gathered = run_root / "preflight.json"
    if gathered.is_file():
        for key, rec in artefacts.load_dict(gathered, PreflightGathered).get("ranks", {}).items():
            records[int(key)] = rec
    for path in sorted((run_root / "ranks").glob("rank*/preflight.json")):
        rec = cast(RankPreflight, artefacts.load_dict(path, PreflightRecord))  # validated against that schema
        records[int(rec["rank"])] = rec
    return records


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _world(records: Records, opts: MergeOptions) -> int:
    sizes = [int(r.get("world_size") or 0) for r in records.values()]
    return opts.expected_world_size or max(sizes or [0]) or len(records)


def _results(records: Records, cid: str) -> dict[int, CheckOutcome]:
    return {r: rec["checks"][cid] for r, rec in sorted(records.items()) if cid in rec.get("checks", {})}


def _expected_ranks(records: Records, opts: MergeOptions) -> list[int]:
    return sorted(records) if opts.local_view else list(range(_world(records, opts)))


def check_launcher_env(records: Records, opts: MergeOptions) -> CheckResult:
    problems: list[str] = []
    bad: set[int] = set()
    world = _world(records, opts)
    ws = {r: rec.get("world_size") for r, rec in records.items()}
    if len(set(ws.values())) > 1:
        problems.append(f"WORLD_SIZE differs: {ws}")
        bad.update(ws)
    if opts.expected_world_size and any(v != opts.expected_world_size for v in ws.values()):
        # A record without world_size shows as None, listed last (sorting None with ints would raise).
        reported = sorted(set(ws.values()), key=lambda v: (v is None, v or 0))
        problems.append(f"WORLD_SIZE {reported} but the launch asked for {opts.expected_world_size}")
        bad.update(r for r, v in ws.items() if v != opts.expected_world_size)
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        values = {r: rec.get("env", {}).get(key) for r, rec in records.items()}
        if len(set(values.values())) > 1:
            problems.append(f"{key} differs: {values}")
            bad.update(values)
    for r, rec in records.items():
        env_rank = rec.get("env", {}).get("RANK")
        if env_rank is not None and str(env_rank) != str(r):
            problems.append(f"rank {r} has RANK={env_rank}")
            bad.add(r)
    slots: dict[tuple[str, int], list[int]] = defaultdict(list)
    gpus: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r, rec in records.items():
        slots[(rec.get("host", "?"), int(rec.get("local_rank", -1)))].append(r)
        dev = rec.get("devices") or {}
        if dev.get("cuda_available") and int(rec.get("local_rank", 0)) >= int(dev.get("count", 0)):
            problems.append(f"rank {r}: LOCAL_RANK {rec.get('local_rank')} >= {dev.get('count')} visible GPUs")
            bad.add(r)
        if uuid := dev.get("uuid"):
            gpus[(rec.get("host", "?"), uuid)].append(r)
    for (host, lr), ranks in slots.items():
        if len(ranks) > 1:
            problems.append(f"ranks {ranks} share host {host} and LOCAL_RANK {lr}")
            bad.update(ranks)
    for (host, gpu), ranks in gpus.items():
        if len(ranks) > 1:
            problems.append(f"ranks {ranks} use the same GPU {gpu} on {host}")
            bad.update(ranks)
    hosts = sorted({rec.get("host", "?") for rec in records.values()})
    evidence = {"world_size": world, "ranks_reporting": len(records), "hosts": hosts, "problems": problems,
                "gpus_checked": bool(gpus) or "skipped: no GPU"}
    if problems:
        return CheckResult("launcher_env", FAIL, problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                           evidence, sorted(bad), "Each rank needs its own (host, LOCAL_RANK) and GPU, the same "
                           "WORLD_SIZE/MASTER_ADDR/MASTER_PORT: check the launcher (srun --ntasks-per-node, torchrun "
                           "--nproc-per-node) and CUDA_VISIBLE_DEVICES.")
    gpu_note = "" if gpus else "; GPU checks skipped: no GPU"
    return CheckResult("launcher_env", PASS, f"{_n(len(records), 'rank')} on {_n(len(hosts), 'host')}, consistent{gpu_note}", evidence)


def check_rendezvous(records: Records, opts: MergeOptions) -> CheckResult:
    world = _world(records, opts)
    got = _results(records, "rendezvous")
    failed = {r: res for r, res in got.items() if res.get("status") == FAIL}
    no_result = [r for r in _expected_ranks(records, opts) if r not in got]
    missing_seen = sorted({m for res in failed.values() for m in res.get("evidence", {}).get("missing_ranks", [])})
    causes = [res["evidence"]["probe"]["cause"] for res in failed.values() if res.get("evidence", {}).get("probe")]
    # an evidence map (free-form per check: shown and copied into the finding)
    evidence: dict[str, Any] = {"world_size": world, "seconds": {r: res.get("seconds") for r, res in got.items()}}
    if not failed and not no_result:
        slowest = max((res.get("seconds") or 0.0 for res in got.values()), default=0.0)
        return CheckResult("rendezvous", PASS, f"{_n(len(got), 'rank')} joined, slowest in {slowest:.2f} s", evidence)
    cause = "peers" if missing_seen or (no_result and not causes) else (max(set(causes), key=causes.count) if causes else "unknown")
    absent = sorted(set(missing_seen) | set(no_result))
    evidence.update(failed_ranks=sorted(failed), ranks_that_did_not_join=absent, likely_cause=cause,
                    errors={r: res.get("evidence", {}).get("error") for r, res in failed.items()},
                    probes={r: res["evidence"]["probe"] for r, res in failed.items() if res.get("evidence", {}).get("probe")})
    if opts.killed_by:
        evidence["killed_by"] = opts.killed_by
    first = next(iter(failed.values()), None)
    where = ""
    if first is not None:
        ev = first.get("evidence", {})
        where = f" to {ev.get('master_addr')}:{ev.get('master_port')}"
        if ev.get("probe"):
            where += f" ({ev['probe']['detail']})"
    summary = f"likely cause: {cause}{where}"
    if absent:
        summary += f"; ranks that did not join: {absent}"
    return CheckResult("rendezvous", FAIL, summary, evidence, sorted(set(failed) | set(absent)), ADVICE.get(cause, ""))


def _values(rec: RankPreflight, values_of: Literal["versions", "dist_env"]) -> dict[str, str | None]:
    return dict(rec.get(values_of) or {})


def _same_everywhere(cid: str, records: Records, values_of: Literal["versions", "dist_env"],
                     harmless: set[str]) -> CheckResult:
    keys = sorted(set[str]().union(*(_values(rec, values_of) for rec in records.values())))
    table: dict[str, dict[int, Any]] = {k: {r: _values(rec, values_of).get(k) for r, rec in records.items()}
                                        for k in keys}
    differing = {k: v for k, v in table.items() if len({json.dumps(x) for x in v.values()}) > 1}
    # an evidence map (free-form per check: shown and copied into the finding)
    evidence: dict[str, Any] = {values_of: {k: next(iter(v.values())) for k, v in table.items() if k not in differing},
                                "differing": differing}
    if not differing:
        return CheckResult(cid, PASS, f"{_n(len(table), 'variable' if values_of == 'dist_env' else 'version')} identical on {_n(len(records), 'rank')}", evidence)
    serious = sorted(k for k in differing if k not in harmless)
    status = FAIL if serious else WARN
    ranks = sorted({r for k in differing for r in differing[k]})
    keys = serious or sorted(differing)
    advice = ("Build every node from the same image/environment: mixed torch/CUDA/NCCL/driver versions hang or "
              "crash collectives." if cid == "versions" else
              "Export the same NCCL_*/TORCH_* settings on every node (a per-node NCCL_ALGO, NCCL_PROTO or "
              "NCCL_IB_* makes ranks disagree on the protocol and hang).")
    return CheckResult(cid, status, "differs across ranks: " + ", ".join(keys), evidence, ranks, advice)


def check_versions(records: Records, opts: MergeOptions) -> CheckResult:
    return _same_everywhere("versions", records, "versions", set())


def check_dist_env(records: Records, opts: MergeOptions) -> CheckResult:
    return _same_everywhere("dist_env", records, "dist_env", HARMLESS_ENV)


def _unreached(cid: str, records: Records, got: dict[int, Any], world: int) -> CheckResult | None:
    """No rank ran this check: say why (rendezvous failed) instead of pretending it passed."""
    if got:
        return None
    rdzv_ok = any(rec.get("checks", {}).get("rendezvous", {}).get("status") == PASS for rec in records.values())
    reason = "no process group: the rendezvous failed" if not rdzv_ok else "no rank reported a result"
    return CheckResult(cid, SKIPPED if not rdzv_ok else FAIL, reason, {"world_size": world})


def check_per_rank(cid: str, records: Records, opts: MergeOptions, advice: str = "") -> CheckResult:
    """A check every rank runs alone (collectives, GPU health, checkpoint dir): the worst rank decides."""
    world = _world(records, opts)
    got = _results(records, cid)
    if (none := _unreached(cid, records, got, world)) is not None:
        return none
    by_status: dict[str, list[int]] = defaultdict(list)
    for r, res in got.items():
        by_status[res.get("status", FAIL)].append(r)
    silent = [r for r in _expected_ranks(records, opts) if r not in got]
    # an evidence map (free-form per check: shown and copied into the finding)
    evidence: dict[str, Any] = {"per_rank": {r: {"status": res.get("status"), "summary": res.get("summary"),
                                                 **res.get("evidence", {})} for r, res in got.items()}}
    for status in (FAIL, WARN):
        if by_status.get(status):
            ranks = by_status[status]
            first = got[ranks[0]]
            return CheckResult(cid, status, f"rank {ranks[0]}: {first.get('summary')}"
                               + (f" (and {len(ranks) - 1} more ranks)" if len(ranks) > 1 else ""), evidence, ranks, advice)
    if silent:
        return CheckResult(cid, FAIL, f"no result from ranks {silent}", evidence, silent,
                           "Those ranks died or were killed before this check finished: see their stderr.log.")
    if by_status.get(PASS):
        first = got[by_status[PASS][0]]
        return CheckResult(cid, PASS, f"{_n(len(by_status[PASS]), 'rank')}: {first.get('summary')}", evidence)
    first = next(iter(got.values()))
    return CheckResult(cid, SKIPPED, str(first.get("summary")), evidence)


def _rank0(cid: str, records: Records, opts: MergeOptions) -> tuple[CheckOutcome | None, CheckResult | None]:
    """Checks whose result every rank shares (reduced with MAX) or only rank 0 measures."""
    got = _results(records, cid)
    if (none := _unreached(cid, records, got, _world(records, opts))) is not None:
        return None, none
    res = got.get(0) or next(iter(got.values()))
    if res.get("status") == SKIPPED:
        return None, CheckResult(cid, SKIPPED, str(res.get("summary")), res.get("evidence", {}))
    if res.get("status") == FAIL:
        failed = [r for r, x in got.items() if x.get("status") == FAIL]
        return None, CheckResult(cid, FAIL, str(res.get("summary")), res.get("evidence", {}), failed)
    return res, None


def check_latency(records: Records, opts: MergeOptions) -> CheckResult:
    res, early = _rank0("allreduce_latency", records, opts)
    if early is not None:
        return early
    assert res is not None
    return CheckResult("allreduce_latency", res["status"], res["summary"], res.get("evidence", {}))


# evidence: the bandwidth check's evidence map as the rank wrote it (its "rows" are BandwidthRow's fields)
def bandwidth_rows(evidence: dict[str, Any]) -> list[BandwidthRow]:
    return [BandwidthRow(**row) for row in evidence.get("rows", [])]


def check_bandwidth(records: Records, opts: MergeOptions) -> CheckResult:
    """Compare the large-message busbw plateau with --min-busbw (nccltable.plateau_busbw)."""
    res, early = _rank0("allreduce_bandwidth", records, opts)
    if early is not None:
        return early
    assert res is not None
    evidence = dict(res.get("evidence", {}))
    rows = bandwidth_rows(evidence)
    plateau = plateau_busbw(rows)
    evidence.update(plateau_busbw_gbps=None if plateau is None else round(plateau, 3), min_busbw_gbps=opts.min_busbw_gbps,
                    max_size_bytes=max((r.size_bytes for r in rows), default=None))
    if plateau is None:
        return CheckResult("allreduce_bandwidth", FAIL, "no sizes measured", evidence)
    if int(evidence.get("world_size") or 0) == 1:
        return CheckResult("allreduce_bandwidth", SKIPPED, "one rank: nothing crosses a link (busbw = 0 by definition)",
                           evidence)
    threshold, source = opts.min_busbw_gbps, "--min-busbw"
    if threshold is None:
        threshold, source = fabric_floor(records)
        evidence["fabric_floor_gbps"] = threshold
        evidence["fabric"] = source
    if threshold is not None:
        if plateau < threshold:
            return CheckResult("allreduce_bandwidth", FAIL,
                               f"busbw {plateau:.2f} GB/s < {source} {threshold:g} GB/s", evidence,
                               sorted(records), "The fabric is slower than expected: check NCCL_DEBUG=INFO for the "
                               "transport (NET/Socket instead of IB, no GDR/P2P), NIC link speed and PCIe topology "
                               "(ddpdoctor topo).")
        return CheckResult("allreduce_bandwidth", PASS, f"busbw {plateau:.2f} GB/s >= {source} {threshold:g} GB/s",
                           evidence)
    return CheckResult("allreduce_bandwidth", PASS, f"busbw {plateau:.2f} GB/s ({source}: give --min-busbw to compare)",
                       evidence)


def fabric_floor(records: Records) -> tuple[float | None, str]:
    """(expected busbw floor in GB/s, how it was derived), or (None, why there is none).

    Only across nodes with InfiniBand/RoCE ports: within a node (NVLink, PCIe, shared memory) and over plain
    TCP the expectation varies too much for a fixed rule."""
    per_host: dict[str, list[IbPort]] = {}
    for rec in records.values():
        per_host.setdefault(rec.get("host", "?"), rec.get("ib_ports") or [])
    if len(per_host) < 2:
        return None, "one node: no fabric expectation"
    sums = {h: sum(p.get("rate_gbit") or 0.0 for p in ports if p.get("active")) for h, ports in per_host.items()}
    if min(sums.values()) <= 0:
        return None, "no ACTIVE InfiniBand/RoCE port on some node: no fabric expectation"
    host, gbit = min(sums.items(), key=lambda kv: kv[1])
    floor = round(FABRIC_FLOOR_SHARE * gbit / 8, 2)
    return floor, f"fabric floor ({FABRIC_FLOOR_SHARE:g} x {gbit:g} Gb/s of ACTIVE IB ports on {host})"


def check_compute(records: Records, opts: MergeOptions) -> CheckResult:
    """A rank whose matmul GFLOP/s is more than ``slow_rank_share`` below the median of all ranks."""
    got = _results(records, "compute")
    if (none := _unreached("compute", records, got, _world(records, opts))) is not None:
        return none
    failed = [r for r, res in got.items() if res.get("status") == FAIL]
    if not failed and all(res.get("status") == SKIPPED for res in got.values()):
        return CheckResult("compute", SKIPPED, str(next(iter(got.values())).get("summary")), {})
    if failed:
        return CheckResult("compute", FAIL, f"rank {failed[0]}: {got[failed[0]].get('summary')}",
                           got[failed[0]].get("evidence", {}), failed)
    gflops = {r: float(res["evidence"]["gflops"]) for r, res in got.items() if res.get("evidence", {}).get("gflops")}
    slow, med = slow_ranks(gflops, opts.slow_rank_share)
    evidence = {"gflops": gflops, "median_gflops": round(med, 2), "slow_rank_share": opts.slow_rank_share,
                "threshold_gflops": round(med * (1 - opts.slow_rank_share), 2), "slow_ranks": slow}
    if slow:
        worst = min(slow, key=lambda r: gflops[r])
        return CheckResult("compute", FAIL, f"rank {worst}: {gflops[worst]:.1f} GFLOP/s, "
                           f"{(1 - gflops[worst] / med) * 100:.0f}% below the median {med:.1f}", evidence, slow,
                           "A slow rank paces the whole job: check its GPU clocks/throttling (nvidia-smi -q -d "
                           "PERFORMANCE), CPU frequency governor, noisy neighbours, or drain the node.")
    return CheckResult("compute", PASS, f"{_n(len(gflops), 'rank')} within {opts.slow_rank_share:.0%} of the median "
                       f"{med:.1f} GFLOP/s", evidence)


def slow_ranks(gflops: dict[int, float], share: float) -> tuple[list[int], float]:
    """Ranks strictly below (1 - share) x median, and the median (0.0 without ranks)."""
    if not gflops:
        return [], 0.0
    med = median(gflops.values())
    return sorted(r for r, g in gflops.items() if g < (1 - share) * med), med


def check_clock_skew(records: Records, opts: MergeOptions) -> CheckResult:
    res, early = _rank0("clock_skew", records, opts)
    if early is not None:
        return early
    assert res is not None
    offsets = res.get("evidence", {}).get("offsets", {})
    evidence = {"offsets": offsets, "warn_ms": CLOCK_SKEW_WARN_MS, "fail_ms": CLOCK_SKEW_FAIL_MS}
    if not offsets:
        return CheckResult("clock_skew", PASS, str(res.get("summary")), evidence)
    # The offset is known to +- half the round trip: judge the skew that is certain, |offset| - rtt/2.
    def certain(o: dict[str, float]) -> float:
        return max(0.0, abs(o["offset_ms"]) - o["rtt_ms"] / 2)

    worst_rank, worst = max(offsets.items(), key=lambda kv: certain(kv[1]))
    skew = certain(worst)
    summary = f"rank {worst_rank} is {worst['offset_ms']:+.2f} ms from rank 0 (round trip {worst['rtt_ms']:.2f} ms)"
    advice = "Run NTP/chrony on every node (chronyc tracking); ddpdoctor aligns ranks' traces by wall clock."
    if skew >= CLOCK_SKEW_FAIL_MS:
        return CheckResult("clock_skew", FAIL, summary, evidence, [int(worst_rank)], advice)
    if skew >= CLOCK_SKEW_WARN_MS:
        return CheckResult("clock_skew", WARN, summary, evidence, [int(worst_rank)], advice)
    return CheckResult("clock_skew", PASS, summary, evidence)


def topology_input(result: Any) -> list[Finding] | str:
    """Normalise ddpdoctor.topo.capture.analyze_run_dir's (section, findings) into findings, or the reason there
    are none (NCCL not used, no NCCL lines)."""
    if isinstance(result, tuple) and len(result) == 2:
        section, findings = result
        if isinstance(section, dict) and section.get("nccl_used") is False:
            return f"NCCL not used: {section.get('reason', 'no NCCL output')}"
        result = findings
    if isinstance(result, list) and all(isinstance(f, Finding) for f in result):
        return result
    return "the topology analysis returned no findings list"


def check_topology(topo: list[Finding] | str | None) -> CheckResult:
    """The topo helper's findings (a list), or why they are absent (a string). Info findings do not warn."""
    if topo is None or isinstance(topo, str):
        return CheckResult("nccl_topology", SKIPPED, topo or "NCCL not used", {})
    worst = max((f.severity.rank for f in topo), default=-1)
    status = FAIL if worst >= 2 else WARN if worst == 1 else PASS
    serious = [f for f in topo if f.severity.rank >= 1]
    summary = (f"{len(serious)} findings: {', '.join(f.id for f in serious[:4])}" if serious
               else "no topology problems")
    evidence = {"findings": [{"id": f.id, "severity": f.severity.value, "title": f.title, "advice": f.advice}
                             for f in topo]}
    ranks = sorted({r for f in serious for r in f.ranks})
    return CheckResult("nccl_topology", status, summary, evidence, ranks,
                       "See each topology finding's advice (docs/findings.md).")


def merge(records: Records, opts: MergeOptions, topo: list[Finding] | str | None = None) -> list[CheckResult]:
    """Every check's row, in CHECKS order."""
    rows = [
        check_launcher_env(records, opts),
        check_rendezvous(records, opts),
        check_versions(records, opts),
        check_dist_env(records, opts),
        check_per_rank("collectives", records, opts, "Wrong collective results mean broken hardware or a "
                       "misconfigured transport: rerun with NCCL_DEBUG=INFO and drain the named ranks' nodes."),
        check_bandwidth(records, opts),
        check_latency(records, opts),
        check_compute(records, opts),
        check_per_rank("gpu_health", records, opts, "Drain nodes with uncorrected ECC errors; find what holds GPU "
                       "memory (nvidia-smi) or why clocks are slowed (power, thermal)."),
        check_per_rank("checkpoint_dir", records, opts, "Fix the path, permissions or quota of --checkpoint-dir "
                       "before the job: a checkpoint that fails at hour 10 loses 10 hours."),
        check_clock_skew(records, opts),
        check_topology(topo),
    ]
    order = list(CHECKS)
    return sorted(rows, key=lambda c: order.index(c.id))
