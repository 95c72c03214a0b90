"""The job-wide watch at scale: a real head (JobAgent on a real TCPStore) against simulated node monitors.

    python benchmarks/job_scale.py [--ranks 1024 4096 32768] [--nodes 8] [--hang-timeout 10] [--run-s 6]

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


def head_run(world: int, nodes: int, hang_timeout: float, run_s: float, step_s: float) -> dict[str, Any]:
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
    procs = [subprocess.Popen([sys.executable, __file__, "--node", str(i + 1), "--first", str(i * per), "--per-node",
                               str(per), "--world", str(world), "--nnodes", str(nodes + 1), "--master-port", str(port),
                               "--hung", str(hung), "--hang-timeout", str(hang_timeout), "--run-s", str(run_s),
                               "--step-s", str(step_s), "--run-root", str(root)],
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
        "ranks": world, "nodes": nodes, "hang_timeout_s": hang_timeout,
        "verdict_after_timeout_s": round(verdict_at - (hang_at + hang_timeout), 2) if mon.hang else None,
        "detection_delay_s": round((mon.hang or {}).get("detected_after_s", 0) - hang_timeout, 2),
        "stacks_and_verdict_s": round((mon.hang or {}).get("reported_after_s", 0)
                                      - (mon.hang or {}).get("detected_after_s", 0), 2),
        "culprit": rank_ranges(d.get("culprit_ranks") or []), "culprit_right": d.get("culprit_ranks") == [hung], "kind": d.get("kind"),
        "bytes_per_rank_per_beat": round(sum(r["envelope_bytes"] for r in results) / world, 1),
        "json_bytes_per_rank": round(sum(r["json_bytes"] for r in results) / world, 1),
        "envelope_kib_per_node": round(results[0]["envelope_bytes"] / 1024, 1),
        "head_cpu_share": round(cpu / watch_s, 3), "head_peak_rss_mib": round(ru1.ru_maxrss / 1024, 1),
        "store_requests_per_s": round(requests / (verdict_at - start), 1),
        "classes": [c["ranks"] for c in (mon.hang or {}).get("classes", [])],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hang-timeout", type=float, default=10.0)
    ap.add_argument("--run-s", type=float, default=6.0)
    ap.add_argument("--step-s", type=float, default=0.5)
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
    if args.node is not None:
        node_main(args)
        return
    for world in args.ranks:
        res = head_run(world, args.nodes, args.hang_timeout, args.run_s, args.step_s)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
