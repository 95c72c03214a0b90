"""The simulated tier: jobs of 1,024 and 32,768 ranks (8 nodes) handed to ddpdoctor's job rules as the head sees
them (typed rank records, one NodeState per node: ddpdoctor/job/), with one fault each. No process is launched:
this checks the verdict's logic and cost at sizes this machine cannot launch. What it cannot check: transport,
heartbeats, timing of real nodes (benchmarks/job_scale.py runs the real head against a simulated publisher).
Time to verdict here is the wall time of the head's decision (the stall rule, the diagnosis) in this process, not a
time from a fault."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from scenarios import SIMULATED as CASES  # noqa: E402
from scenarios import Scenario  # noqa: E402

from ddpdoctor.findings.hang import DDP_BUCKETS  # noqa: E402
from ddpdoctor.job import state  # noqa: E402
from ddpdoctor.job.record import RankRecord  # noqa: E402
from ddpdoctor.job.rules import Limits, decide  # noqa: E402

NODES = 8
LIMITS = Limits(None, 600.0, stuck_s=15.0)  # the default rule, 60 s floor
KIND = {"outside-collective": "stuck", "rank-exited": "left-early", "out-of-data": "left-early", "teardown": "stuck", "seq-behind": "collective-mismatch",
        "mismatch": "collective-mismatch", "lost-node": "lost-node", "unknown": "hang"}


def _waiting(rank: int, seq: int = 40, age: float = 70.0) -> RankRecord:
    return RankRecord(rank, step=6, phase="backward", coll=[DDP_BUCKETS, "default_pg", seq, "train.py:9"], age_s=age,
                      idle_s=60.0, moved_s=60.0, slowest_s=0.5)


def _job(sc: Scenario) -> tuple[dict[int, state.NodeState], set[int]]:
    """The job state of one case: every rank waiting in DDP's all-reduce except the fault's rank(s)."""
    n, x = sc.world, sc.fault_rank
    per = n // NODES
    recs = [_waiting(r) for r in range(n)]
    lost: set[int] = set()
    f = sc.fault
    if f == "stuck-data":
        recs[x] = RankRecord(x, step=6, phase="data", where="train.py:20", age_s=70.0, idle_s=40.0, moved_s=60.0,
                             slowest_s=0.5)
    elif f == "exit-early":
        recs[x] = RankRecord(x, step=6, exit=[0, None, 6], exit_age_s=60.0)
    elif f == "seq-behind":
        recs[x] = _waiting(x, seq=39)
    elif f == "extra-collective":
        recs[x] = RankRecord(x, step=6, phase="other", coll=["barrier", "default_pg", 40, "train.py:30"], age_s=70.0,
                             idle_s=60.0, moved_s=60.0, slowest_s=0.5)
    elif f == "crash":
        for r in range(n):
            recs[r] = RankRecord(r, step=6, exit=[1, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection "
                                                     "closed by peer [10.0.0.1]:4242", 6], exit_age_s=20.0)
        recs[x] = RankRecord(x, step=6, exit=[1, "ValueError: corrupt sample in shard 7", 6], exit_age_s=21.0)
    elif f == "lost-node":
        lost = {x // per}
    elif f == "busy-checkpoint":
        recs[x] = RankRecord(x, step=6, phase="checkpoint", where="train.py:40", age_s=70.0, idle_s=0.3,
                             moved_s=60.0, slowest_s=0.5)
    elif f == "all-moving":
        recs = [_waiting(r, age=0.2) for r in range(n)]
    nodes = {}
    for k in range(NODES):
        st = state.NodeState(k, host=f"node{k}", ranks=recs[k * per:(k + 1) * per], seq=1, received=100.0)
        st.lost = k in lost
        nodes[k] = st
    return nodes, lost


def judge_case(sc: Scenario) -> dict[str, Any]:
    nodes, _ = _job(sc)
    t0 = time.perf_counter()
    culprits: list[int] | None = None
    cause: str | None = None
    said = "ok"
    root = state.crash_root(nodes)
    if root:
        culprits, cause, said = root, "crash", "rank-crashed"
    else:
        recs, extra = state.live_records(nodes, 100.0)
        d = decide(recs, LIMITS, 500.0, None, extra_age_s=extra)
        if d.hung:
            diag = state.diagnose(nodes, sc.world, d.stalled)
            culprits, cause, said = diag.culprit_ranks, KIND.get(diag.kind, "hang"), f"hang ({diag.kind})"
        elif d.busy:
            said = f"long-stall (busy: {d.busy[:4]})"
    dt = time.perf_counter() - t0
    culprit_text = culprits if culprits is None or len(culprits) <= 8 else f"{len(culprits)} ranks"
    return {"tool": "ddpdoctor (simulated job rules)", "scenario": sc.name, "ran": True, "not_run": None,
            "culprits": culprits, "cause": cause, "alarm": cause is not None, "fault_at": 0.0,
            "verdict_at": dt if cause is not None else None, "wall_s": dt, "exit_codes": [],
            "said": f"{said}: {culprit_text}", "warnings": [], "time_to_verdict_s": dt if cause is not None else None}


def run_simulated() -> dict[str, list[dict[str, Any]]]:
    import score

    out = []
    for sc in CASES:
        d = judge_case(sc)
        d["judged"] = score.judge(d)
        print(f"{sc.name:40s} {score._cell(d)}  ({d['wall_s'] * 1000:.0f} ms: the head's decision, wall clock)",
              flush=True)
        out.append(d)
    return {"ddpdoctor (simulated job rules)": out}
