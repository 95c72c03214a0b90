"""The job-wide watch at scale: a real head (JobAgent on a real TCPStore) against simulated node monitors.

    python benchmarks/job_scale.py --publisher --ranks 1024 4096 32768   # the head against one cheap publisher
    python benchmarks/job_scale.py [--ranks 1024 4096 32768] [--nodes 8] [--hang-timeout 10] [--run-s 6]
    python benchmarks/job_scale.py --head-only --ranks 1024 4096 32768   # the head's work alone, per read

--publisher (what the issue's 32,768-rank target is measured with on a 2-core machine): the other nodes are one
process that publishes every simulated node's envelope as a node agent would (about once a second and at once on
a step; the records built once and updated in place, so the publisher is cheap) and answers the head's stacks
request for all of them; so what is measured is the head's own cost: its CPU and memory, the store's request
rate, and how long after the hang timeout the verdict comes. Without it, each simulated node is a process running
the real node agent (8 of them starve on 2 cores at 32,768 ranks):

Each simulated node is a process running the real node agent (ddpdoctor/job/agent.py) over a HangMonitor whose rank
links it fills with heartbeats as ranks would send them: every rank steps every --step-s, in DDP's all-reduce at
the end of each step; after --run-s one rank (the middle one) stops in its data loading and the others wait in
the all-reduce. The head decides as in a real run. Prints, per scale: time from the moment the hang-timeout passed
to the verdict, whether the culprit is right, bytes per rank per beat, the head's CPU (share of one core) and peak
memory, and the store's request rate (all nodes and the head). Nothing asserts: the machine is shared."""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = int(s.getsockname()[1])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                continue


def node_main(args: argparse.Namespace) -> None:
    """One simulated node: ranks [first, first + per_node) stepping, then one of them hangs."""
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole
    from ddpdoctor.launch.monitor import HangMonitor, RankLink

    first, n = args.first, args.per_node
    mon = HangMonitor(hang_timeout=args.hang_timeout, on_hang="report")
    mon.world_size = args.world
    role = JobRole(args.nnodes, args.node, "127.0.0.1", args.master_port)
    agent = JobAgent(role, mon, Path(args.run_root))
    t0 = time.time()
    seq = 0
    step = 1
    step_started = t0
    hang_at = float("inf")  # until the head says when (once every node publishes)
    for r in range(first, first + n):
        mon.links[r] = RankLink(r)
    agent.start(t0)
    stuck = False
    last_place: tuple[int, bool] = (0, False)
    while time.time() < min(hang_at, t0 + 600) + args.hang_timeout + 40 and agent.verdict is None:
        now = time.time()
        if hang_at == float("inf") and agent.store is not None:
            try:
                hang_at = float(agent.store.get("bench/hang_at") or "inf")
                if hang_at != float("inf"):
                    agent.store.requests = 0  # count from the start of the measured run
            except (RuntimeError, ValueError):
                pass
        if not stuck and now >= hang_at:
            stuck = True
        elif not stuck and hang_at != float("inf"):
            # Every node on one step clock (all ranks of a DDP job step together), counted from the head's start.
            k = int((now - (hang_at - args.run_s)) / args.step_s)
            step, step_started = 1 + k, hang_at - args.run_s + k * args.step_s
        elif not stuck and now - step_started >= args.step_s:
            step += 1
            step_started = now
        seq += 1
        if (step, stuck) != last_place:  # as the monitor counts a rank's new place
            mon.changes = getattr(mon, "changes", 0) + 1
            last_place = (step, stuck)
        for r in range(first, first + n):
            hung = stuck and r == args.hung
            coll = None if hung else {"op": "allreduce", "group": "default_pg", "seq": 2 * step,
                                      "sizes": [[1024]], "call_site": "train.py:41"}
            mon.links[r].beat = {
                "type": "beat", "rank": r, "time": now, "step": step, "phase": "data" if hung else "backward",
                "step_started": step_started, "last_step_s": args.step_s, "max_step_s": args.step_s,
                "collective": coll, "where": "loader.py:77" if hung else "train.py:41",
            }
        time.sleep(0.25)  # ranks beat ~1/s; the agent publishes at once on a change that matters
    time.sleep(2)
    assert agent.store is not None
    from ddpdoctor.job.state import envelope

    env = envelope(args.node, "sim", 1, agent._records())
    size = len(agent.store.seal(f"node/{args.node}", env))
    print(json.dumps({"node": args.node, "requests": agent.store.requests, "bytes_out": agent.store.bytes_out,
                      "envelope_bytes": size, "json_bytes": len(json.dumps(env, separators=(",", ":"))), "ranks": n,
                      "publications": agent.seq}), flush=True)
    os._exit(0)  # skip TCPStore's teardown at exit (its threads)


def publisher_main(args: argparse.Namespace) -> None:
    """Every simulated node's publications from one process (--publisher): nodes 1..nnodes-1, ``per_node`` ranks
    each, stepping every --step-s until the head's hang_at, then the rank ``hung`` stops in its data loading while
    the others wait in the all-reduce."""
    from ddpdoctor.job import state
    from ddpdoctor.job.record import RankRecord
    from ddpdoctor.job.store import JobStore, job_port

    store = JobStore("127.0.0.1", job_port(args.master_port), os.environ["DDPDOCTOR_JOB_TOKEN"], is_head=False)
    nodes = list(range(1, args.nnodes))
    recs = {n: [RankRecord(r, step=1, phase="backward", coll=["allreduce", "default_pg", 2, "train.py:41"],
                           sizes=[[1024]], where="train.py:41", slowest_s=args.step_s)
                for r in range((n - 1) * args.per_node, n * args.per_node)] for n in nodes}
    stack_ok = "File \"train.py\", line 41, in train\n    loss.backward()\nFile \"torch/autograd\", in backward"
    stack_hung = "File \"train.py\", line 30, in train\n    batch = next(it)\nFile \"loader.py\", line 77, in next"
    seq = {n: 0 for n in nodes}
    sent = {n: (0.0, -1) for n in nodes}
    hang_at, answered, step_started, step = float("inf"), set(), time.time(), 1
    t_end = time.time() + 900
    while time.time() < t_end:
        now = time.time()
        got = store.get_many(["bench/hang_at", "req", "verdict"])
        if "verdict" in got:
            break
        if hang_at == float("inf") and got.get("bench/hang_at") is not None:
            hang_at = float(got["bench/hang_at"])
            t_end = hang_at + 90  # the head gives up 60 s past the timeout
            store.requests = 0  # count from the start of the measured run
        stuck = now >= hang_at
        if hang_at != float("inf") and not stuck:
            k = int((now - (hang_at - args.run_s)) / args.step_s)
            step, step_started = 1 + k, hang_at - args.run_s + k * args.step_s
        for n in nodes:
            last_t, last_step = sent[n]
            if now - last_t < 1.0 and step == last_step:
                continue  # as a node agent: a beat about once a second, at once on a new place
            for rec in recs[n]:
                hung = stuck and rec.rank == args.hung
                rec.step, rec.age_s, rec.beat_age_s = step, round(now - step_started, 2), 0.2
                if hung:
                    rec.phase, rec.coll, rec.sizes, rec.where = "data", None, None, "loader.py:77"
                elif rec.coll is not None:
                    rec.coll[2] = 2 * step
            seq[n] += 1
            store.put(f"node/{n}", state.envelope(n, f"sim{n}", seq[n], recs[n]))
            sent[n] = (now, step)
        req = got.get("req")
        if isinstance(req, dict) and req.get("id") not in answered:
            answered.add(req.get("id"))
            for n in nodes:
                store.put(f"stacks/{n}", {str(r.rank): stack_hung if r.rank == args.hung else stack_ok
                                          for r in recs[n]})
        time.sleep(0.1)
    env = state.envelope(nodes[0], "sim", 1, recs[nodes[0]])
    print(json.dumps({"node": "publisher", "requests": store.requests, "bytes_out": store.bytes_out,
                      "envelope_bytes": len(store.seal(f"node/{nodes[0]}", env)) * len(nodes),
                      "json_bytes": len(json.dumps(env, separators=(",", ":"))) * len(nodes)}), flush=True)
    os._exit(0)


def head_run(world: int, nodes: int, hang_timeout: float, run_s: float, step_s: float,
             publisher: bool = False) -> dict[str, Any]:
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.grouping import rank_ranges
    from ddpdoctor.job.role import JobRole
    from ddpdoctor.launch.monitor import HangMonitor

    port = free_port()
    os.environ["DDPDOCTOR_JOB_TOKEN"] = secrets.token_hex(16)
    root = Path(tempfile.mkdtemp(prefix="ddpdoctor-jobscale-"))
    mon = HangMonitor(hang_timeout=hang_timeout, on_hang="report")
    mon.world_size = world
    mon.run_root = root
    role = JobRole(nodes + 1, 0, "127.0.0.1", port)  # node 0: the head's own launcher (no ranks here)
    agent = JobAgent(role, mon, root)
    per = world // nodes
    hung = world // 2 + 1
    start = time.time()
    rss_idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # torch and the store, before any job state
    if publisher:
        procs = [subprocess.Popen([sys.executable, __file__, "--publish", "--per-node", str(per), "--world", str(world),
                                   "--nnodes", str(nodes + 1), "--master-port", str(port), "--hung", str(hung),
                                   "--run-s", str(run_s), "--step-s", str(step_s)],
                                  stdout=subprocess.PIPE, text=True, env=os.environ)]
    else:
        procs = [subprocess.Popen([sys.executable, __file__, "--node", str(i + 1), "--first", str(i * per),
                                   "--per-node", str(per), "--world", str(world), "--nnodes", str(nodes + 1),
                                   "--master-port", str(port), "--hung", str(hung), "--hang-timeout",
                                   str(hang_timeout), "--run-s", str(run_s), "--step-s", str(step_s),
                                   "--run-root", str(root)],
                                  stdout=subprocess.PIPE, text=True, env=os.environ)
                 for i in range(nodes)]
    agent.start(start)
    # The nodes' start-up (importing torch on a loaded machine) comes first: the clock starts when all publish.
    while any(st.seq < 0 for n, st in agent.nodes.items() if n) and time.time() < start + 600:
        agent.read_nodes()
        time.sleep(0.5)
    start = time.time()
    hang_at = start + run_s
    assert agent.store is not None
    agent.store.put("bench/hang_at", hang_at)
    agent.store.requests = 0
    job = SimpleNamespace(started=start, kill=lambda *a: None, proc=SimpleNamespace(pid=os.getpid()))
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_watch = time.time()
    while mon.hang is None and time.time() < hang_at + hang_timeout + 60:
        agent.decide(mon, job, time.time())  # type: ignore[arg-type]
        time.sleep(0.1)
    verdict_at = time.time()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    watch_s = verdict_at - t_watch
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    d = (mon.hang or {}).get("diagnosis") or {}
    requests = sum(r["requests"] for r in results) + (agent.store.requests if agent.store else 0)
    return {
        "ranks": world, "nodes": nodes, "mode": "publisher" if publisher else "node agents",
        "hang_timeout_s": hang_timeout,
        "verdict_after_timeout_s": round(verdict_at - (hang_at + hang_timeout), 2) if mon.hang else None,
        "detection_delay_s": round((mon.hang or {}).get("detected_after_s", 0) - hang_timeout, 2),
        "stacks_and_verdict_s": round((mon.hang or {}).get("reported_after_s", 0)
                                      - (mon.hang or {}).get("detected_after_s", 0), 2),
        "culprit": rank_ranges(d.get("culprit_ranks") or []), "culprit_right": d.get("culprit_ranks") == [hung], "kind": d.get("kind"),
        "bytes_per_rank_per_beat": round(sum(r["envelope_bytes"] for r in results) / world, 1),
        "json_bytes_per_rank": round(sum(r["json_bytes"] for r in results) / world, 1),
        "envelope_kib_per_node": round(results[0]["envelope_bytes"] / (nodes if publisher else 1) / 1024, 1),
        "head_cpu_share": round(cpu / watch_s, 3), "head_peak_rss_mib": round(ru1.ru_maxrss / 1024, 1),
        "head_rss_before_job_mib": round(rss_idle / 1024, 1),
        "store_requests_per_s": round(requests / (verdict_at - start), 1),
        "classes": [c["ranks"] for c in (mon.hang or {}).get("classes", [])][:4],
    }


def head_only(world: int, nodes: int, hang_timeout: float) -> dict[str, Any]:
    """The head's own work per read at ``world`` ranks, without simulated nodes competing for the same cores: decode
    every node's envelope (as read off the store), the stall rule, the diagnosis. What the head adds to a verdict."""
    from ddpdoctor.job import state
    from ddpdoctor.job.record import record
    from ddpdoctor.job.rules import Limits, decide

    now = time.time()
    per, hung = world // nodes, world // 2 + 1
    envs = []
    for n in range(nodes):
        recs = []
        for r in range(n * per, (n + 1) * per):
            coll = None if r == hung else {"op": "allreduce", "group": "default_pg", "seq": 24, "sizes": [[1024]],
                                           "call_site": "train.py:41"}
            beat = {"step": 12, "phase": "data" if r == hung else "backward", "step_started": now - 12, "time": now,
                    "max_step_s": 0.5, "collective": coll, "where": "loader.py:77" if r == hung else "train.py:41"}
            recs.append(record(r, beat, None, now, now - 100, active_at=now - 12, moved_at=now - 12))
        envs.append(json.dumps(state.envelope(n + 1, "sim", 1, recs)))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    nodes_st = {n + 1: state.NodeState(n + 1) for n in range(nodes)}
    for n, text in enumerate(envs):
        nodes_st[n + 1].update(json.loads(text), now)
    t1 = time.perf_counter()
    recs_all, extra = state.live_records(nodes_st, now)
    d = decide(recs_all, Limits(hang_timeout, 600.0), 100.0, world, extra)
    t2 = time.perf_counter()
    diag = state.diagnose(nodes_st, world, d.stalled)
    t3 = time.perf_counter()
    return {"ranks": world, "mode": "head-only", "decode_ms": round(1e3 * (t1 - t0), 1),
            "rule_ms": round(1e3 * (t2 - t1), 1), "diagnose_ms": round(1e3 * (t3 - t2), 1),
            "culprit_right": diag.culprit_ranks == [hung],
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_growth_for_the_job_state_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hang-timeout", type=float, default=10.0)
    ap.add_argument("--run-s", type=float, default=6.0)
    ap.add_argument("--step-s", type=float, default=0.5)
    ap.add_argument("--publisher", action="store_true",
                    help="the other nodes as one cheap publisher process (the head's own cost is what is measured)")
    ap.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)  # the publisher process itself
    ap.add_argument("--head-only", action="store_true",
                    help="measure the head's own work per read (decode, rule, diagnosis), no simulated nodes")
    # a simulated node (started by the benchmark itself)
    ap.add_argument("--node", type=int)
    ap.add_argument("--first", type=int)
    ap.add_argument("--per-node", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--nnodes", type=int)
    ap.add_argument("--master-port", type=int)
    ap.add_argument("--hung", type=int)
    ap.add_argument("--run-root")
    args = ap.parse_args()
    if args.publish:
        publisher_main(args)
        return
    if args.node is not None:
        node_main(args)
        return
    rows: list[dict[str, Any]] = []
    for world in args.ranks:
        if args.head_only:
            print(json.dumps(head_only(world, args.nodes, args.hang_timeout)), flush=True)
            continue
        res = head_run(world, args.nodes, args.hang_timeout, args.run_s, args.step_s, args.publisher)
        print(json.dumps(res), flush=True)
        rows.append(res)
    if rows:
        print(table(rows))


def table(rows: list[dict[str, Any]]) -> str:
    """The figures as a markdown table (docs/hangs.md#scale)."""
    head = ("| ranks | verdict after the timeout | culprit | head CPU (share of a core) | head peak RSS (before the job) "
            "| store requests/s | bytes per rank per beat |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['ranks']:,} | {r['verdict_after_timeout_s']} s | {'right' if r['culprit_right'] else 'WRONG'}"
                     f" ({r['kind']}) | {100 * r['head_cpu_share']:.1f} % | {r['head_peak_rss_mib']:.0f} MiB "
                     f"({r['head_rss_before_job_mib']:.0f}) | {r['store_requests_per_s']} | "
                     f"{r['bytes_per_rank_per_beat']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
