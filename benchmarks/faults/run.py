"""The open fault benchmark (issue 41): real gloo jobs with one known fault each, run under each tool, scored.

    python benchmarks/faults/run.py --list                       # one scenario a line: name, tiers, truth
    python benchmarks/faults/run.py --tier quick                 # CI's canaries, ddpdoctor only
    python benchmarks/faults/run.py --tier full --tool all       # every scenario, ddpdoctor and torch's tools
    python benchmarks/faults/run.py --tier simulated             # 1,024 and 32,768 ranks through the job rules
    python benchmarks/faults/run.py --tier gpu                   # the GPU checks (one line and exit 0 without one)

Writes benchmarks/out/faults-TIER/results.json (every run: the tool's answer, the truth, the times) and table.md
(the table docs/accuracy.md publishes), and prints the table. Run it with ``nice`` on a shared machine: every
scenario is a real launch. Never imported by the package."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import score  # noqa: E402
from scenarios import SCENARIOS, Scenario, tier  # noqa: E402
from tools import NEVER_ENDED, REPO, TOOLS, Outcome, read_ddpdoctor, run_ddpdoctor, run_torchrun  # noqa: E402


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return rev.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


def machine() -> str:
    load = _load()
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} CPU cores, {mem}, load average {load} at start"


def plan(scenarios: list[Scenario], healthy_runs: int) -> list[Scenario]:
    """The runs: every scenario once, the families taken in turn (a run stopped early still covers every family),
    then healthy scenarios again in turn until ``healthy_runs`` healthy runs."""
    families: dict[str, list[Scenario]] = {}
    for s in scenarios:
        families.setdefault("healthy" if s.healthy else s.job, []).append(s)
    runs = [s for group in itertools.zip_longest(*families.values()) for s in group if s is not None]
    healthy = [s for s in scenarios if s.healthy]
    n = len(healthy)
    for s in itertools.cycle(healthy) if healthy else []:
        if n >= healthy_runs:
            break
        runs.append(s)
        n += 1
    return runs


def run_real(scenarios: list[Scenario], tools: list[str], out: Path, healthy_runs: int,
             keep: bool) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    runs = plan(scenarios, healthy_runs)
    commit = _commit()
    work_root = Path(tempfile.mkdtemp(prefix="ddpbench-"))
    try:
        for i, sc in enumerate(runs):
            work = work_root / f"{i:03d}-{sc.name}"
            got: list[Outcome] = []
            started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), _load()
            if "ddpdoctor" in tools:
                got.append(run_ddpdoctor(sc, work / "ddpdoctor"))
            if set(tools) - {"ddpdoctor"}:
                got += [o for o in run_torchrun(sc, work / "torchrun") if o.tool in tools]
            for o in got:
                d = o.to_json()
                d["judged"] = score.judge(d)
                # Which code gave this answer, and how loaded the machine was: a merged table says both.
                d["commit"], d["started_at"], d["load"] = commit, started, load
                results[o.tool].append(d)
                print(f"[{i + 1}/{len(runs)}] {sc.name:34s} {o.tool:15s} {score._cell(d)}  "
                      f"({o.wall_s:.0f} s; says: {o.said[:80]})", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(work_root, ignore_errors=True)
        else:
            print(f"run directories kept in {work_root}")
    return results


def rejudge(o: dict[str, Any]) -> dict[str, Any]:
    """A stored run judged again with this version's reading and scoring: ddpdoctor's answer from the findings it
    kept (so a change in how a report is read applies to every stored run alike), then the marks."""
    if o.get("tool") == "ddpdoctor" and o.get("ran") and o.get("findings"):
        culprits, cause, _, warnings = read_ddpdoctor({"findings": o["findings"]})
        o.update(culprits=culprits, cause=cause, alarm=cause is not None, warnings=warnings)
        if cause is None:
            o["time_to_verdict_s"] = None
    if o.get("tool") == "torchrun" and o.get("ran") and (o.get("said") or "").startswith("never ended"):
        o.update(culprits=None, cause=None, alarm=False, time_to_verdict_s=None, said=NEVER_ENDED)
    o["judged"] = score.judge(o)
    return o


def provenance(results: dict[str, list[dict[str, Any]]]) -> str:
    """The commits the runs ran on (runs a commit) and the load average at their starts, as the table's header
    says them: a merged table may join runs of several commits, and the reader must see it."""
    commits: dict[str, int] = {}
    loads: list[float] = []
    for outs in results.values():
        for o in outs:
            c = o.get("commit") or "unrecorded"
            commits[c] = commits.get(c, 0) + 1
            if isinstance(o.get("load"), (int, float)):
                loads.append(float(o["load"]))
    said = ", ".join(f"{c} ({n} runs)" for c, n in commits.items())
    if loads:
        said += f"; load average at the runs' starts {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
    return "runs' commits: " + said


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", choices=("quick", "full", "simulated", "gpu"), default="quick")
    p.add_argument("--tool", action="append", choices=(*TOOLS, "all"),
                   help="repeatable; default ddpdoctor; all: ddpdoctor, torchrun and flight-recorder")
    p.add_argument("--list", action="store_true", help="print the scenarios, one a line, and exit")
    p.add_argument("--only", action="append", default=[], help="run only these scenarios (repeatable, prefix match)")
    p.add_argument("--healthy-runs", type=int, default=None,
                   help="repeat the healthy scenarios until this many healthy runs (full: 100; quick: none)")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/out/faults-TIER")
    p.add_argument("--keep", action="store_true", help="keep every run directory")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RESULTS_JSON",
                   help="no runs: the table of these results.json files together (runs split between processes)")
    p.add_argument("--rerun", type=Path, nargs="+", default=[], metavar="RESULTS_JSON",
                   help="with --merge: runs that replace the merged files' runs of the same tool and scenario "
                        "(a scenario fixed and run again)")
    a = p.parse_args()
    if a.list:
        from scenarios import SIMULATED
        from score import ranks

        for s in [*SCENARIOS, *SIMULATED]:
            truth = "healthy" if s.healthy else f"culprit {ranks(s.culprits) if s.culprits is not None else 'all'}"
            how = "job rules, no launch" if s.job == "simulated" else f"ddpdoctor {s.command}, step {s.fault_step}"
            print(f"{s.name}\t{','.join(s.tiers)}\t{s.world} ranks, {s.nnodes} node(s)\t{truth}\t{s.cause}\t{how}")
        return 0
    if a.tier == "gpu":
        import gpu_tier
        return gpu_tier.main()
    out = a.out or REPO / "benchmarks" / "out" / f"faults-{a.tier}"
    out.mkdir(parents=True, exist_ok=True)
    header = (f"# Fault benchmark, tier {a.tier}\n\ncommit {_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
              f", {machine()}\n\ncommand: `python benchmarks/faults/run.py {' '.join(sys.argv[1:])}`")
    results: dict[str, list[dict[str, Any]]]
    if a.merge:
        results = {}
        for path in a.merge:
            for tool, outs in json.loads(path.read_text()).items():
                results.setdefault(tool, []).extend(rejudge(o) for o in outs)
        for path in a.rerun:
            for tool, outs in json.loads(path.read_text()).items():
                again = {o["scenario"] for o in outs}
                kept = [o for o in results.get(tool, []) if o["scenario"] not in again]
                results[tool] = kept + [rejudge(o) for o in outs]
        header = header.replace(f"tier {a.tier}", "merged runs")
    elif a.tier == "simulated":
        from simulated import run_simulated
        results = run_simulated()
    else:
        tools = list(TOOLS) if not a.tool or "all" in (a.tool or []) else list(dict.fromkeys(a.tool))
        if not a.tool:
            tools = ["ddpdoctor"]
        scenarios = tier(a.tier)
        if a.only:
            scenarios = [s for s in SCENARIOS if any(s.name.startswith(o) for o in a.only)]
        healthy_runs = a.healthy_runs if a.healthy_runs is not None else (100 if a.tier == "full" else 0)
        results = run_real(scenarios, tools, out, healthy_runs, a.keep)
        if a.tier == "full" and not a.only and "ddpdoctor" in tools:  # ddpdoctor's rules alone: once per table
            from simulated import run_simulated
            results["ddpdoctor (simulated job rules)"] = run_simulated()["ddpdoctor (simulated job rules)"]
    if not a.merge:
        commit = _commit()
        for outs in results.values():
            for o in outs:
                o.setdefault("commit", commit)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = score.markdown(results, header + "\n\n" + provenance(results))
    (out / "table.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
