"""The tools measured, each configured as its own docs say, and how each one's answer is read into the benchmark's
terms (culprit ranks, cause class, whether it raised an alarm, when its verdict reached the user):

- ``ddpdoctor``: ``ddpdoctor run`` (hangs, crashes, stragglers, healthy jobs) or ``ddpdoctor check-sync``
  (divergence), ``--json``; the default hang rule with its 60 s floor scaled to 5 s
  (``DDPDOCTOR_DEFAULT_HANG_TIMEOUT=5``, as ddpdoctor's own suite runs it), so busy-is-not-hung stays on.
- ``torchrun``: plain torchrun, the job's entry point under ``@record``; its answer is the "Root Cause (first
  observed failure)" of its failure report. gloo's timeout is scaled down the same way (30 min -> 30 s), or a
  hang would never end.
- ``flight-recorder``: the same launch as ``torchrun`` (one launch serves both) with ``TORCH_FR_BUFFER_SIZE``;
  each rank's buffer is dumped when it fails or is stopped (peer_entry.py), then torch's analyzer
  (``python -m torch.distributed.flight_recorder.fr_trace``) reads the dumps.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launch import NodeRun, launch
from scenarios import Scenario

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOBS = HERE / "jobs"
PEER_GLOO_TIMEOUT_S = "30"
DDPDOCTOR_FLOOR_S = "5"

sys.path.insert(0, str(REPO))
from tests.ports import reserve_port, reserve_port_pair  # noqa: E402


@dataclass
class Outcome:
    """One tool's answer on one run of one scenario."""

    tool: str
    scenario: str
    ran: bool = True
    not_run: str | None = None  # why the scenario could not run here
    culprits: list[int] | None = None  # the rank(s) the tool blames (None: it blames nobody)
    cause: str | None = None  # the tool's cause class in the benchmark's terms (None: no fault reported)
    alarm: bool = False  # the tool reported a fault
    fault_at: float | None = None
    verdict_at: float | None = None
    wall_s: float = 0.0
    exit_codes: list[int | None] = field(default_factory=list)
    said: str = ""  # the tool's own words (its verdict line or finding ids), for the table's reader
    warnings: list[str] = field(default_factory=list)  # warnings that blame nobody (long-stall)
    findings: list[dict[str, Any]] = field(default_factory=list)  # ddpdoctor: its error/warning findings, kept

    @property
    def time_to_verdict_s(self) -> float | None:
        if self.fault_at is None or self.verdict_at is None or not self.alarm:
            return None
        return max(0.0, self.verdict_at - self.fault_at)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["time_to_verdict_s"] = self.time_to_verdict_s
        return out


def _env(sc: Scenario, marks: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "TORCH_FR_", "TORCHELASTIC_"))}
    env.update({"FAULT": sc.fault, "FAULT_RANK": str(sc.fault_rank), "FAULT_STEP": str(sc.fault_step),
                "FAULT_MARK_DIR": str(marks), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update(sc.env)
    env.update(extra)
    return env


def _fault_time(marks: Path) -> float | None:
    times = []
    for p in marks.glob("fault-rank*.json"):
        try:
            times.append(float(json.loads(p.read_text())["t"]))
        except (OSError, ValueError, KeyError):
            continue
    return min(times) if times else None


def _node_args(sc: Scenario, node: int, port: int | None) -> list[str]:
    if sc.nnodes == 1:
        return []
    return ["--nnodes", str(sc.nnodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port)]


def _not_run(runs: list[NodeRun]) -> str | None:
    for r in runs:
        if "oom scenario:" in r.stderr or "oom scenario:" in r.stdout:
            line = next(ln for ln in (r.stderr + r.stdout).splitlines() if "oom scenario:" in ln)
            return line.split("oom scenario:", 1)[1].strip()
    return None


def _cleanup_cgroups() -> None:
    base = Path("/sys/fs/cgroup/memory")
    for d in base.glob("ddpbench_oom_*"):
        try:
            d.rmdir()  # empty once its process is gone
        except OSError:
            pass


# -- ddpdoctor ---------------------------------------------------------------------------------------------
_HANG_KIND = {"outside-collective": "stuck", "rank-exited": "left-early", "out-of-data": "left-early",
              "loader-exhausted": "left-early", "teardown": "stuck", "seq-behind": "collective-mismatch",
              "mismatch": "collective-mismatch", "lost-node": "lost-node", "unknown": "hang"}
_SYNC = {"grad-divergence": "divergence:grads", "grads-never-synced": "divergence:grads",
         "param-divergence": "divergence:params", "buffer-divergence": "divergence:buffers",
         "nonfinite-values": "divergence:nan"}
_VERDICT_LINE = re.compile(r"^ddpdoctor: (hang detected|job hung|job failed|slow-rank|slowdown|stall)\b")


def _divergence_cause(f: dict[str, Any]) -> str:
    """The cause class of a ``divergence`` finding, from the first field that differs (findings/divergence.py)."""
    items = [i for i in (f.get("evidence") or {}).get("items") or [] if isinstance(i, dict)]
    first = items[0] if items else {}
    field = first.get("field")
    if field == "loss":
        return "divergence:nan"
    if field == "opt":
        return "divergence:skip-step"
    if field == "colls":
        mine, job = first.get("rank_value"), first.get("others_value")
        # More collectives in one record: its record spans two iterations (it skipped an optimizer step), the
        # finding's own reading; fewer: it issued fewer collectives.
        more = isinstance(mine, int) and isinstance(job, int) and mine > job
        return "divergence:skip-step" if more else "collective-mismatch"
    if field == "graphs":
        return "divergence:compile"
    if field in ("dry", "epoch"):
        return "left-early"  # its loader ran out first (the hang scenarios' class for a shorter shard)
    return "collective-mismatch"


def read_ddpdoctor(report: dict[str, Any]) -> tuple[list[int] | None, str | None, list[str], list[str]]:
    """(culprits, cause class, the error/warning finding ids, warnings that blame nobody) of a ddpdoctor report."""
    fs = [f for f in report.get("findings", []) if f.get("severity") in ("error", "warning")]
    ids = [f["id"] for f in fs]
    by = {f["id"]: f for f in reversed(fs)}  # the first of each id
    # Said, not blamed: a long stall (busy, not hung) and torch's own abort at interpreter exit after every rank
    # finished (docs/findings.md#job-aborted-after-finish); both are counted apart in the table.
    # job-stopped: the benchmark stopped a launch past its time (SIGTERM, as a scheduler would); that is not a
    # verdict of the tool's.
    quiet = [i for i in ids if i in ("long-stall", "aborted-after-finish", "job-stopped")]
    culprits: list[int] | None = None
    cause: str | None = None
    if "divergence" in by:
        # The per-step fingerprint (issue 38) names the step where ranks parted; a hang or check-sync finding that
        # follows is its consequence, so it is the verdict.
        culprits, cause = list(by["divergence"].get("ranks") or []), _divergence_cause(by["divergence"])
    elif "hang" in by:
        ev = by["hang"].get("evidence", {})
        culprits = list(ev.get("culprit_ranks") or [])
        cause = _HANG_KIND.get(str(ev.get("kind")), "hang")
    elif "rank-left-early" in by:
        culprits, cause = list(by["rank-left-early"].get("ranks") or []), "left-early"
    elif "rank-crashed" in by:
        f = by["rank-crashed"]
        ev = f.get("evidence", {})
        culprits = [ev["rank"]] if isinstance(ev.get("rank"), int) else list(f.get("ranks") or [])
        text = json.dumps(ev).lower()
        # "killed by a signal ... (SIGKILL or the OOM killer)" names both: only an OOM said alone is an OOM verdict.
        said_oom = ("oom" in text or "out of memory" in text) and "sigkill or the oom" not in text
        cause = "oom" if said_oom else "crash"
    elif "rank-no-status" in by:
        culprits, cause = list(by["rank-no-status"].get("ranks") or []), "crash"
    elif "head-lost" in by:
        culprits, cause = None, "lost-node"
    if "collective-mismatch" in by:
        if culprits is None:
            culprits = list(by["collective-mismatch"].get("ranks") or [])
        cause = "collective-mismatch"
    if cause is None:
        for fid, kind in _SYNC.items():
            if fid in by:
                culprits, cause = list(by[fid].get("ranks") or []), kind
                break
    if cause is None and any(i.startswith("sampler-") for i in ids):
        f = next(by[i] for i in ids if i.startswith("sampler-"))
        culprits, cause = list(f.get("ranks") or []), "divergence:data"
    if cause is None and "slow-rank" in by:
        ev = by["slow-rank"].get("evidence", {})
        culprits = [ev["rank"]] if isinstance(ev.get("rank"), int) else list(by["slow-rank"].get("ranks") or [])
        cause = f"straggler:{ev.get('phase')}" if ev.get("phase") else "straggler"
    if cause is None and any(i in ("slowdown", "stall") for i in ids):
        cause = "slowdown"
    if cause is None and [i for i in ids if i not in quiet]:
        cause = "other:" + ",".join(sorted(set(i for i in ids if i not in quiet)))
    return culprits, cause, ids, quiet


def run_ddpdoctor(sc: Scenario, work: Path) -> Outcome:
    marks, out = work / "marks", work / "run"
    marks.mkdir(parents=True)
    port = reserve_port_pair() if sc.nnodes > 1 else None
    cmds = []
    for node in range(sc.nnodes):
        cmds.append([sys.executable, "-m", "ddpdoctor", sc.command, "--nproc-per-node", str(sc.nproc),
                     *_node_args(sc, node, port), "-q", "--json", "--out", str(out), str(JOBS / f"{sc.job}.py")])
    env = _env(sc, marks, {"DDPDOCTOR_DEFAULT_HANG_TIMEOUT": DDPDOCTOR_FLOOR_S})
    runs, started = launch(cmds, REPO, env, sc.timeout_s)
    _cleanup_cgroups()
    o = Outcome("ddpdoctor", sc.name, exit_codes=[r.code for r in runs], wall_s=max(r.ended_at for r in runs) - started)
    o.not_run = _not_run(runs)
    if o.not_run:
        o.ran = False
        return o
    o.fault_at = _fault_time(marks)
    try:
        report = json.loads(runs[0].stdout)
    except ValueError:
        o.said = "no JSON report: " + (runs[0].stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:200]
        o.alarm = any(r.code not in (0, None) for r in runs) or any(r.timed_out for r in runs)
        o.cause = "no-report" if o.alarm else None
        return o
    o.culprits, o.cause, ids, o.warnings = read_ddpdoctor(report)
    o.findings = [{k: f.get(k) for k in ("id", "severity", "ranks", "title", "evidence")}
                  for f in report.get("findings", []) if f.get("severity") in ("error", "warning")]
    for f in o.findings:  # stacks and positions are kilobytes per rank: the run directory has them
        ev = f.get("evidence")
        if isinstance(ev, dict):
            f["evidence"] = {k: v for k, v in ev.items() if k not in ("stacks", "positions", "flight_recorder")}
    o.alarm = o.cause is not None
    o.said = ",".join(dict.fromkeys(ids)) or "ok"
    if o.alarm:
        lines = [t for t, ln in runs[0].stderr_lines if _VERDICT_LINE.match(ln)]
        o.verdict_at = min(lines) if lines else runs[0].ended_at
    return o


# -- torchrun and the Flight Recorder (one launch) ---------------------------------------------------------------
_ROOT = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:={5,}|\Z)", re.S)


def read_torchrun(stderr: str) -> tuple[list[int] | None, str | None, str]:
    """torchrun's root cause: (rank, cause class, its own words). Each node's torchrun prints the first failure it
    observed on its own node; of several nodes' tables the earliest (its ``time``) is the job's, as a user reading
    every node's log would take it."""
    blocks = [m.group(1) for m in _ROOT.finditer(stderr)]
    if not blocks:
        return None, None, ""

    def when(b: str) -> str:
        t = re.search(r"time\s*:\s*(\S+)", b)
        return t.group(1) if t else "~"

    block = min(blocks, key=when)
    rank = re.search(r"rank\s*:\s*(\d+)", block)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
    tb = re.search(r"traceback\s*:\s*(.*)", block, re.S)
    words = (tb.group(1).strip().splitlines() or [""])[-1][:200] if tb else ""
    text = block.lower()
    if "timed out" in text or "timeout" in text:
        cause = "hang"
    elif "mismatch" in text or "doesn't match" in text:
        cause = "collective-mismatch"
    elif "connection closed by peer" in text or "connection reset" in text:
        cause = "crash"  # it names a victim's error as the root cause
    else:
        cause = "crash"
    if code and int(code.group(1)) < 0:
        words = words or f"exitcode {code.group(1)}"
    return ([int(rank.group(1))] if rank else None), cause, words


NEVER_ENDED = "never ended (stopped by the benchmark)"
_FR_MISSING = re.compile(r"missing ranks: \{([\d, ]+)\}")
_FR_CULPRIT = re.compile(r"Culprit rank (\d+)")


def read_flight_recorder(dumps: Path, world: int) -> tuple[list[int] | None, str | None, str]:
    """Run torch's analyzer on the dumps: (culprits, cause class, its own words)."""
    files = sorted(dumps.glob("fr_*"))
    if not files:
        return None, None, "no dump"
    args = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps), "-p", "fr_"]
    if len(files) < world:
        args.append("--allow-incomplete-ranks")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    text = p.stdout + p.stderr
    culprit = sorted({int(x) for x in _FR_CULPRIT.findall(text)})
    if culprit:
        return culprit, "collective-mismatch", "Culprit rank " + ",".join(map(str, culprit))
    missing = _FR_MISSING.findall(text)
    if missing:
        ranks = sorted({int(x) for x in missing[0].split(",")})
        return ranks, "hang", f"missing ranks {ranks}"
    if p.returncode != 0:
        return None, None, "analyzer failed: " + (text.strip().splitlines() or [""])[-1][:160]
    return None, None, "no mismatch found"


def repair_gloo_dumps(dumps: Path, into: Path) -> Path:
    """Copies of the dumps whose ``pg_config`` is keyed as their entries name the group. On gloo, torch 2.13 dumps
    the default group's config under the name '' while its entries say ('0', 'default_pg'), and the analyzer stops
    with KeyError ('0', rank) before any heuristic runs; this shows what its heuristics would say."""
    into.mkdir(exist_ok=True)
    for f in dumps.glob("fr_*"):
        with open(f, "rb") as fh:
            d = pickle.load(fh)  # our own ranks' dumps, written by peer_entry.py in this run
        groups = {tuple(e["process_group"]) for e in d.get("entries", []) if e.get("process_group")}
        old = list((d.get("pg_config") or {}).values())
        if groups and old:
            d["pg_config"] = {g[0]: {"name": g[0], "desc": g[1], "ranks": old[0]["ranks"]} for g in sorted(groups)}
        with open(into / f.name, "wb") as fh:
            pickle.dump(d, fh)
    return into


def run_torchrun(sc: Scenario, work: Path) -> tuple[Outcome, Outcome, Outcome]:
    """One plain torchrun launch: torchrun's answer, the Flight Recorder's, and the Flight Recorder's on repaired
    gloo dumps (repair_gloo_dumps)."""
    marks, dumps = work / "marks", work / "fr"
    marks.mkdir(parents=True)
    dumps.mkdir()
    port = reserve_port()
    cmds = []
    for node in range(sc.nnodes):
        cmds.append([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(sc.nproc),
                     "--nnodes", str(sc.nnodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                     "--master-port", str(port), str(HERE / "peer_entry.py"), str(JOBS / f"{sc.job}.py")])
    extra = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "fr_")}
    if "SCENARIO_GLOO_TIMEOUT" not in sc.env:
        extra["SCENARIO_GLOO_TIMEOUT"] = PEER_GLOO_TIMEOUT_S
    env = _env(sc, marks, extra)
    runs, started = launch(cmds, REPO, env, sc.timeout_s)
    _cleanup_cgroups()
    wall = max(r.ended_at for r in runs) - started
    codes = [r.code for r in runs]
    tr = Outcome("torchrun", sc.name, exit_codes=codes, wall_s=wall)
    fr = Outcome("flight-recorder", sc.name, exit_codes=codes, wall_s=wall)
    fx = Outcome("flight-recorder-repaired", sc.name, exit_codes=codes, wall_s=wall)
    reason = _not_run(runs)
    if reason:
        tr.ran = fr.ran = fx.ran = False
        tr.not_run = fr.not_run = fx.not_run = reason
        return tr, fr, fx
    fault_at = _fault_time(marks)
    tr.fault_at = fr.fault_at = fx.fault_at = fault_at
    failed = any(r.code not in (0, None) for r in runs) or any(r.timed_out for r in runs)
    stderr = "".join(r.stderr for r in runs)
    tr.culprits, tr.cause, tr.said = read_torchrun(stderr)
    if any(r.timed_out for r in runs):
        tr.culprits, tr.cause, tr.said = None, None, NEVER_ENDED  # what it printed after our SIGTERM is no verdict
    elif tr.cause is None and failed:
        tr.cause, tr.said = "crash", "failed, no table"
    tr.alarm = tr.cause is not None
    tr.verdict_at = max(r.ended_at for r in runs) if tr.alarm and not any(r.timed_out for r in runs) else None
    fr.culprits, fr.cause, fr.said = read_flight_recorder(dumps, sc.world)
    fr.alarm = fr.cause is not None
    fr.verdict_at = tr.verdict_at if fr.alarm else None  # the analyzer runs once the dumps exist: the job's end
    fx.culprits, fx.cause, fx.said = read_flight_recorder(repair_gloo_dumps(dumps, work / "fr-repaired"), sc.world)
    fx.alarm = fx.cause is not None
    fx.verdict_at = tr.verdict_at if fx.alarm else None
    return tr, fr, fx


TOOLS = ("ddpdoctor", "torchrun", "flight-recorder", "flight-recorder-repaired")
