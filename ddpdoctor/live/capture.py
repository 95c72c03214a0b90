"""The client side of `ddpdoctor capture`: put a request into a live run's private control folder, wait for the
job's monitor to relay it and for every rank to finish its part. The monitor side is ddpdoctor/live/watch.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.live.status import load_status
from ddpdoctor.live.watch import captures_dir, control_dir

PICKUP_S = 15.0  # the monitor polls every 0.5 s; more than this means no monitor is running


class CaptureFailed(Exception):
    """The request reached the job but the capture did not complete (one line for the user)."""


def request(run_root: Path, what: str, steps: int | None) -> str:
    """Write the request; return its id. BadInput (one line) when this is no live job of the caller's."""
    st = load_status(run_root)
    if st["state"] == "finished":
        raise BadInput("the job has finished: there is nothing running to capture", run_root)
    ctl = control_dir(run_root)
    try:
        info = os.lstat(ctl)
    except OSError:
        raise BadInput("not a live `ddpdoctor run` job (no live control folder: the job ran without ddpdoctor's "
                       "live watch, or its ddpdoctor is gone)", run_root) from None
    if info.st_uid != os.getuid():
        raise BadInput("only the job's owner can capture (the control folder belongs to another user)", run_root)
    cid = f"cap-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    body = json.dumps({"id": cid, "what": what, "steps": steps}).encode()
    tmp = ctl / f".{cid}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, ctl / f"req-{cid}.json")
    except OSError as exc:
        raise BadInput(f"cannot write a request into the control folder ({exc.strerror or exc})", run_root) from exc
    return cid


def wait_picked_up(run_root: Path, cid: str) -> dict[str, Any]:
    """The monitor's record of the request (RUN/captures/<id>/capture.json)."""
    path = captures_dir(run_root) / cid / "capture.json"
    deadline = time.time() + PICKUP_S
    while time.time() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    (control_dir(run_root) / f"req-{cid}.json").unlink(missing_ok=True)
    raise CaptureFailed(f"the job's monitor did not take the request within {PICKUP_S:.0f} s (has the job ended?)")


def wait_window(run_root: Path, cid: str, state: dict[str, Any], timeout_s: float) -> Path:
    """Wait until every rank wrote its window (ranks/rankR/done.json); return the window folder."""
    if state.get("error"):
        raise CaptureFailed(f"the monitor refused the request: {state['error']}")
    out = captures_dir(run_root) / cid
    ranks = [int(r) for r in state.get("ranks") or []]
    if not ranks:
        raise CaptureFailed("no rank of the job is connected to its monitor")
    deadline = time.time() + timeout_s
    while True:
        missing = [r for r in ranks if not (out / "ranks" / f"rank{r}" / "done.json").is_file()]
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
            missing = [r for r in ranks if not (out / "ranks" / f"rank{r}" / "done.json").is_file()]
            if missing:
                raise CaptureFailed(f"the job ended before ranks {missing} finished the window")
            return out
        time.sleep(0.3)


def wait_stacks(run_root: Path, cid: str, timeout_s: float) -> Path:
    out = captures_dir(run_root) / cid
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if json.loads((out / "capture.json").read_text()).get("done"):
                return out / "stacks.txt"
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise CaptureFailed(f"no stacks within {timeout_s:.0f} s")


def _refusals(out: Path) -> dict[int, str]:
    try:
        lines = (out / "replies.jsonl").read_text().splitlines()
    except OSError:
        return {}
    refused: dict[int, str] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not rec.get("accepted"):
            refused[int(rec.get("rank", -1))] = str(rec.get("reason"))
    return refused
