"""The client side of `ddpdoctor capture`: put a request into every node's private control folder of a live run,
wait for the nodes' monitors to relay it and for every rank to finish its part. The monitor side is
ddpdoctor/live/watch.py."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.job.capture_relay import CaptureRequest
from ddpdoctor.live.health import node_names
from ddpdoctor.live.records import PickedUp
from ddpdoctor.live.stacks import group_stacks, stacks_text
from ddpdoctor.live.status import load_status
from ddpdoctor.live.watch import captures_dir, control_dir
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import read_json
from ddpdoctor.rundir.schema import RankStatus
from ddpdoctor.safe_io import write_atomic

PICKUP_S = 15.0  # monitors poll every 0.5 s; more than this means no monitor is running


class CaptureFailed(Exception):
    """The request reached the job but the capture did not complete (one line for the user)."""


def request(run_root: Path, what: str, steps: int | None) -> tuple[str, list[str]]:
    """Write the request for every node; return its id and the nodes asked. BadInput (one line) when this is no
    live job of the caller's."""
    st = load_status(run_root)
    if st["state"] == "finished":
        raise BadInput("the job has finished: there is nothing running to capture", run_root)
    nodes = []
    for node in node_names(run_root):
        try:
            info = os.lstat(control_dir(run_root, node))
        except OSError:
            continue  # that node's monitor has ended
        if info.st_uid != os.getuid():
            raise BadInput("only the job's owner can capture (the control folder belongs to another user)", run_root)
        nodes.append(node)
    if not nodes:
        raise BadInput("not a live `ddpdoctor run` job (no live control folder: the job ran without ddpdoctor's "
                       "live watch, or its ddpdoctor is gone)", run_root)
    cid = f"cap-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    req: CaptureRequest = {"id": cid, "what": what, "steps": steps}
    h = st["health"] or {}
    if len(nodes) > 1 and isinstance(step := h.get("step"), int):
        # One iteration for every node: past the furthest rank by ~3 s of iterations (beats, polls, relay).
        rate = h.get("steps_per_s")
        req["at_step"] = step + max(3, math.ceil(3 * rate) if isinstance(rate, (int, float)) else 3)
    body = json.dumps(req).encode()
    for node in nodes:
        ctl = control_dir(run_root, node)
        try:
            write_atomic(ctl / f"req-{cid}.json", body)
        except OSError as exc:
            raise BadInput(f"cannot write a request into {ctl} ({exc.strerror or exc})", run_root) from exc
    return cid, nodes


def wait_picked_up(run_root: Path, cid: str, nodes: list[str]) -> PickedUp:
    """The nodes' records of the request (RUN/captures/<id>/capture-NODE.json), merged: ranks together."""
    out = captures_dir(run_root) / cid
    deadline = time.time() + PICKUP_S
    records: dict[str, Mapping[str, object]] = {}  # the monitors' capture-NODE.json (watch.py), read back: untrusted
    nodes = list(nodes)
    while time.time() < deadline and len(records) < len(nodes):
        for node in list(nodes):
            try:
                rec = json.loads((out / f"capture-{node}.json").read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(rec, dict):
                continue  # not a monitor's record (it writes one JSON object)
            records[node] = rec
            # Without a shared filesystem the head forwarded the request through the job store; those nodes'
            # records (and their ranks' window files) arrive here relayed by the head (job/capture_relay.py).
            fwd = rec.get("forwarded")
            nodes += [n for n in (fwd if isinstance(fwd, list) else []) if isinstance(n, str) and n not in nodes]
        time.sleep(0.2)
    if not records:
        for node in nodes:
            (control_dir(run_root, node) / f"req-{cid}.json").unlink(missing_ok=True)
        raise CaptureFailed(f"the job's monitor did not take the request within {PICKUP_S:.0f} s (has the job ended?)")
    errors = [str(r["error"]) for r in records.values() if r.get("error")]
    ranks = sorted({x for r in records.values() if isinstance(rs := r.get("ranks"), list) for x in rs
                    if isinstance(x, int)})
    missing = [n for n in nodes if n not in records]
    return {"nodes": sorted(records), "ranks": ranks, "error": errors[0] if errors else None,
            "missing_nodes": missing}


def wait_window(run_root: Path, cid: str, state: PickedUp, timeout_s: float) -> Path:
    """Wait until every rank wrote its window (ranks/rankR/done.json); return the window folder."""
    if state.get("error"):
        raise CaptureFailed(f"the monitor refused the request: {state['error']}")
    out = captures_dir(run_root) / cid
    ranks = state["ranks"]
    if not ranks:
        raise CaptureFailed("no rank of the job is connected to its monitor")
    deadline = time.time() + timeout_s
    while True:
        missing = [r for r in ranks if not _done_path(out, r).is_file()]
        if not missing:
            return out
        refused = _refusals(out)
        if refused:
            r, reason = next(iter(refused.items()))
            raise CaptureFailed(f"rank {r} refused the capture: {reason}")
        if time.time() > deadline:
            raise CaptureFailed(f"ranks {missing} did not finish the window within {timeout_s:.0f} s "
                                f"(fewer iterations left than asked for, or the job is stuck: try --stacks)")
        if load_status(run_root)["state"] == "finished":
            time.sleep(1.0)  # the last ranks' files land just before the manifest says finished
            missing = [r for r in ranks if not _done_path(out, r).is_file()]
            if missing:
                raise CaptureFailed(f"the job ended before ranks {missing} finished the window")
            return out
        time.sleep(0.3)


def wait_stacks(run_root: Path, cid: str, nodes: list[str], timeout_s: float) -> Path:
    """Every node's stacks, grouped into classes across the job: RUN/captures/<id>/stacks.txt (owner-only)."""
    out = captures_dir(run_root) / cid
    deadline = time.time() + timeout_s
    stacks: dict[int, str | None] = {}
    beats: dict[int, Mapping[str, object]] = {}
    pending = set(nodes)
    while pending and time.time() < deadline:
        for node in sorted(pending):
            try:
                done = json.loads((out / f"capture-{node}.json").read_text()).get("done")
                raw = json.loads((out / f"stacks-{node}.json").read_text()) if done else None
            except (OSError, ValueError):
                continue
            if raw is None:
                continue
            pending.discard(node)
            for r, text in (raw.get("stacks") or {}).items():
                stacks[int(r)] = text if isinstance(text, str) else None
                beats[int(r)] = (raw.get("beats") or {}).get(r) or {}
        time.sleep(0.3)
    if not stacks:
        raise CaptureFailed(f"no stacks within {timeout_s:.0f} s")
    path = out / "stacks.txt"
    write_atomic(path, stacks_text(group_stacks(stacks, beats)))
    return path


def misaligned_note(window: Path, ranks: list[int]) -> str | None:
    """A note when the ranks' windows did not start on the same iteration (a request that reached a rank late)."""
    firsts = {r: d.get("first_step") for r in ranks if (d := _window_done(window, r)) is not None}
    if len(set(firsts.values())) <= 1:
        return None
    return (f"the ranks' windows started on different iterations ({firsts}): a request reached some ranks late; "
            "cross-rank comparisons of this window pair different iterations")


def relay_note(window: Path) -> str | None:
    """A note when some ranks' window files were too large to come through the job store (job/capture_relay.py):
    they stay in their own node's run directory (RUN/captures/ID there)."""
    try:
        left = json.loads((window / "relay.json").read_text()).get("left_out")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(left, dict) or not left:
        return None
    ranks = sorted(int(r) for r in left if str(r).isdigit())
    return (f"ranks {ranks}: some window files were too large to relay through the job store and stay in their "
            f"node's own run directory ({window.name} under its captures/); this window's analysis lacks them")


def _done_path(window: Path, rank: int) -> Path:
    """What a rank writes when its part of a window is over (probes/live.py): its iterations, or its error."""
    return window / "ranks" / f"rank{rank}" / "done.json"


def _window_done(window: Path, rank: int) -> Mapping[str, object] | None:
    """That rank's done.json as an object; None while it has not written one (or wrote something else)."""
    try:
        data = read_json(_done_path(window, rank))
    except BadInput:
        return None
    return data if isinstance(data, dict) else None


def _refusals(out: Path) -> dict[int, str]:
    """Ranks that refused the request: replies.jsonl, and replies-NODE.jsonl relayed from the job's other nodes."""
    lines: list[str] = []
    for path in sorted(out.glob("replies*.jsonl")):
        try:
            lines += path.read_text().splitlines()
        except OSError:
            continue
    refused: dict[int, str] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not rec.get("accepted"):
            refused[int(rec.get("rank", -1))] = str(rec.get("reason"))
    return refused


def auto_capture_notes(run_root: Path) -> list[str]:
    """What became of each automatic profile window (`--capture-on-slowdown`, RUN/captures/auto-*): where to
    analyse it, or why nothing was recorded (the job ended first, a rank refused or failed). One note per window."""
    root = captures_dir(run_root)
    try:
        windows = sorted(p for p in root.iterdir() if p.name.startswith("auto-") and p.is_dir())
    except OSError:
        return []
    last = _last_iteration(run_root)
    notes = []
    for out in windows:
        records = []
        for rec in sorted(out.glob("capture-*.json")):
            try:
                data = json.loads(rec.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                records.append(data)
        ranks = sorted({int(r) for d in records for r in d.get("ranks") or [] if isinstance(r, int)})
        at = max((d["at_step"] for d in records if isinstance(d.get("at_step"), int)), default=None)
        why = next((str(d["reason"]) for d in records if d.get("reason")), "an alert")
        done = {r: d for r in ranks if (d := _window_done(out, r)) is not None}
        failed = {r: d["error"] for r, d in done.items() if d.get("error")}
        refused = _refusals(out)
        head = f"the automatic profile window asked when {why} fired ({out})"
        if failed:
            r, err = next(iter(failed.items()))
            notes.append(f"{head} failed on rank {r} ({str(err)[:200]}); the job itself was not affected")
        elif refused:
            r, reason = next(iter(refused.items()))
            notes.append(f"{head} was refused by rank {r}: {reason}")
        elif ranks and len(done) == len(ranks):
            steps = sorted({(d.get("first_step"), d.get("last_step")) for d in done.values()}, key=str)
            span = f"iterations {steps[0][0]}-{steps[0][1]}" if len(steps) == 1 else f"windows {steps}"
            notes.append(f"ddpdoctor profiled {span} on every rank automatically when {why} fired: "
                         f"`ddpdoctor analyze {out}`")
        elif at is not None and isinstance(last, int) and last <= at and not done:
            notes.append(f"{head} was to start after iteration {at}, but the job ended at iteration {last}: nothing "
                         "was recorded (on a job this short, `ddpdoctor profile` records a window from the start)")
        else:
            missing = [r for r in ranks if r not in done]
            notes.append(f"{head} is incomplete: ranks {missing or ranks} did not finish it")
    return notes


def _last_iteration(run_root: Path) -> int | None:
    """The furthest iteration any rank finished: its exit status (steps_completed), else the live snapshot."""
    steps = []
    for path in run_root.glob("ranks/rank*/status.json"):
        try:
            n = artefacts.load(path, RankStatus).steps_completed
        except BadInput:
            continue
        if n is not None:
            steps.append(n)
    if steps:
        return max(steps)
    try:
        step = (load_status(run_root).get("health") or {}).get("step")
    except BadInput:
        return None
    return step if isinstance(step, int) else None
