"""The GPU tier (issue 41 item 4): what a CPU machine cannot check, in one script that runs in under 8 minutes on one
GPU and writes everything under one folder (benchmarks/out/faults-gpu/):

1. profile + analyze on CUDA traces of a real DDP job (kernels on the device, communication measured);
2. the ledger's CUDA-event source (DDPDOCTOR_LEDGER_SOURCE=flight-recorder): its durations, its step assignment,
   its cost against the host source (the same job twice) -- the facts that decide whether ``auto`` may pick it;
3. preflight's GPU checks;
4. check-sync on CUDA tensors (with 2+ GPUs also a rank that skips a step: param-divergence expected);
5. a hang on NCCL (2+ GPUs): a rank stuck outside NCCL, ddpdoctor names it.
On a one-GPU machine NCCL refuses two ranks on one device, so 4 and 5's multi-rank parts (cross-rank comparison, a
culprit among ranks, the ledger's caused wait between ranks) are reported as not checked: one rank is run where it
means something. Without a GPU it prints one line and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = HERE / "jobs" / "gpu_train.py"
BUDGET_S = 460.0


def gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ddpdoctor(out: Path, name: str, args: list[str], env: dict[str, str] | None = None,
              timeout: float = 120) -> tuple[int | None, dict[str, Any] | None, float]:
    """Run ``ddpdoctor ARGS --json``; keep its stdout/stderr under out/NAME.*; (exit code, JSON, seconds)."""
    t0 = time.time()
    full = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    try:
        p = subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=REPO, env=full, capture_output=True,
                           text=True, timeout=timeout)
        code, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, so, se = None, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    (out / f"{name}.stdout").write_text(so)
    (out / f"{name}.stderr").write_text(se if isinstance(se, str) else "")
    try:
        doc = json.loads(so)
    except ValueError:
        doc = None
    return code, doc, time.time() - t0


def check_profile(out: Path, n: int) -> dict[str, Any]:
    run = out / "profile"
    code, doc, dt = ddpdoctor(out, "profile", ["profile", "--nproc-per-node", str(n), "--json", "--out", str(run),
                                               "--overwrite", str(JOB)], env={"STEPS": "40"}, timeout=150)
    code2, ana, _ = ddpdoctor(out, "analyze", ["analyze", str(run), "--json"], timeout=90)
    ranks = (ana or {}).get("ranks", [])
    devices = sorted({r.get("device") for r in ranks})
    comm = [r.get("comm_us") for r in ranks]
    ok = code in (0, 1) and ana is not None and devices == ["gpu"] and all(c for c in comm)
    return {"check": "profile + analyze on CUDA traces", "ok": ok, "seconds": round(dt, 1),
            "detail": {"profile_exit": code, "analyze_exit": code2, "devices": devices, "comm_us": comm,
                       "overlap_pct": [r.get("overlap_pct") for r in ranks],
                       "findings": [f["id"] for f in (ana or {}).get("findings", [])]}}


def _ledger(run: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(run.glob("ranks/rank*/ledger.json")):
        try:
            out.append(json.loads(p.read_text()))
        except ValueError:
            out.append({"unreadable": str(p)})
    return out


def _median_step_ms(run: Path) -> float | None:
    import statistics

    times = []
    for p in run.glob("live/*/series.jsonl"):
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            s = rec.get("seconds")
            if isinstance(s, (int, float)):
                times.append(1000.0 * s)
    return statistics.median(times[5:]) if len(times) > 10 else None


def check_ledger(out: Path, n: int) -> dict[str, Any]:
    env = {"STEPS": "150", "FAULT": "straggler" if n >= 2 else "none", "FAULT_RANK": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
    res: dict[str, Any] = {}
    for source in ("host", "flight-recorder"):
        run = out / f"ledger-{source}"
        code, doc, dt = ddpdoctor(out, f"ledger-{source}", ["run", "--nproc-per-node", str(n), "--json", "--out",
                                                            str(run), "--overwrite", str(JOB)],
                                  env={**env, "DDPDOCTOR_LEDGER_SOURCE": source}, timeout=120)
        slow = [f.get("evidence", {}) for f in (doc or {}).get("findings", []) if f.get("id") == "slow-rank"]
        res[source] = {"exit": code, "seconds": round(dt, 1), "median_step_ms": _median_step_ms(run),
                       "ledger": [{k: v for k, v in d.items() if k in ("source", "source_note", "steps", "blocked_ms",
                                                                        "durations_ms", "cost_ms")}
                                  for d in _ledger(run)],
                       "slow_rank": slow}
    fr = res["flight-recorder"]
    used = [d.get("source", "") for d in fr["ledger"]]
    ok = bool(used) and all(str(u).startswith("flight-recorder") for u in used)
    if n >= 2:
        ok = ok and any(s.get("rank") == 1 for s in fr["slow_rank"])
    h, f = res["host"]["median_step_ms"], fr["median_step_ms"]
    cost = None if not (h and f) else round(100.0 * (f - h) / h, 2)
    return {"check": "the ledger's CUDA-event source", "ok": ok, "detail": res, "cost_pct_of_step": cost,
            "auto_may_pick_it": bool(ok and cost is not None and cost <= 0.5),
            "note": "auto may pick it when the source was used on every rank, named the slow rank (2+ GPUs) and "
                    "cost at most 0.5% of the step (one pair of runs: repeat before deciding)"}


def check_preflight(out: Path, n: int) -> dict[str, Any]:
    code, doc, dt = ddpdoctor(out, "preflight", ["preflight", "--nproc-per-node", str(n), "--json"], timeout=150)
    ids = [f["id"] for f in (doc or {}).get("findings", [])]
    return {"check": "preflight's GPU checks", "ok": doc is not None and code in (0, 1), "seconds": round(dt, 1),
            "detail": {"exit": code, "findings": ids, "status": (doc or {}).get("status")}}


def check_sync(out: Path, n: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    code, doc, dt = ddpdoctor(out, "check-sync", ["check-sync", "--nproc-per-node", str(n), "--json", "--out",
                                                  str(out / "check-sync"), "--overwrite", str(JOB)],
                              env={"STEPS": "10"}, timeout=120)
    res["clean"] = {"exit": code, "findings": [f["id"] for f in (doc or {}).get("findings", [])]}
    ok = code == 0
    if n >= 2:
        code2, doc2, _ = ddpdoctor(out, "check-sync-skip", ["check-sync", "--nproc-per-node", str(n), "--json", "--out",
                                                            str(out / "check-sync-skip"), "--overwrite", str(JOB)],
                                   env={"STEPS": "10", "FAULT": "skip-step", "FAULT_STEP": "2"}, timeout=120)
        ids = [f["id"] for f in (doc2 or {}).get("findings", [])]
        res["skip-step"] = {"exit": code2, "findings": ids}
        ok = ok and "param-divergence" in ids
    else:
        res["skip-step"] = "not checked: one GPU (NCCL refuses two ranks on one device; nothing to compare)"
    return {"check": "check-sync on CUDA tensors", "ok": ok, "detail": res}


def check_nccl_hang(out: Path, n: int) -> dict[str, Any]:
    if n < 2:
        return {"check": "a hang on NCCL", "ok": None,
                "detail": "not checked: one GPU. NCCL refuses two ranks on one device, and a hang needs a rank to "
                          "wait for another"}
    code, doc, dt = ddpdoctor(out, "nccl-hang", ["run", "--nproc-per-node", "2", "--hang-timeout", "10", "--json",
                                                 "--out", str(out / "nccl-hang"), "--overwrite", str(JOB)],
                              env={"FAULT": "stuck-io", "FAULT_RANK": "1"}, timeout=150)
    hang = [f for f in (doc or {}).get("findings", []) if f.get("id") == "hang"]
    culprits = hang[0]["evidence"].get("culprit_ranks") if hang else None
    return {"check": "a hang on NCCL", "ok": culprits == [1], "seconds": round(dt, 1),
            "detail": {"exit": code, "culprits": culprits, "kind": hang[0]["evidence"].get("kind") if hang else None}}


def main() -> int:
    n = gpus()
    if n == 0:
        print("gpu tier: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check")
        return 0
    out = REPO / "benchmarks" / "out" / "faults-gpu"
    out.mkdir(parents=True, exist_ok=True)
    ranks = min(n, 2)
    t0 = time.time()
    results: list[dict[str, Any]] = []
    for check in (check_profile, check_ledger, check_preflight, check_sync, check_nccl_hang):
        if time.time() - t0 > BUDGET_S:
            results.append({"check": check.__name__, "ok": None, "detail": "not run: the 8-minute budget is spent"})
            continue
        try:
            results.append(check(out, ranks))
        except Exception as e:  # noqa: BLE001 - one check's failure is its result, the others still run
            results.append({"check": check.__name__, "ok": False, "detail": f"{type(e).__name__}: {e}"})
        print(json.dumps(results[-1])[:400], flush=True)
    import torch

    summary = {"gpus": n, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "seconds": round(time.time() - t0, 1), "checks": results}
    (out / "gpu.json").write_text(json.dumps(summary, indent=1))
    for r in results:
        mark = "n/a " if r["ok"] is None else ("PASS" if r["ok"] else "FAIL")
        print(f"{mark} {r['check']}")
    print(f"everything is in {out} ({summary['seconds']} s)")
    return 0 if all(r["ok"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
