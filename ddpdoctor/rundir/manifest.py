"""manifest.json: what the job was (written by the launcher) and what each rank reported (merged at the end)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import RunDir, write_json
from ddpdoctor.rundir.schema import Manifest

SCHEMA = 1


def write_initial(run: RunDir, mode: str, script: str | None, script_args: list[str], launcher: str,
                  torchrun_flags: dict[str, Any], schedule: dict[str, Any] | None, options: dict[str, Any]) -> None:
    """The launch as plain data (the launcher passes its spec's parts: the run directory knows nothing of it)."""
    from ddpdoctor.version import __version__

    data = {
        "schema": SCHEMA,
        "ddpdoctor_version": __version__,
        "mode": mode,
        "command_line": list(sys.argv),
        "script": script,
        # what `diff` names when two runs differ (analyses/diff_changes.py): the script's content and the host's load
        "script_sha256": script_sha256(script),
        "host_load": _load_1min(),
        "script_args": list(script_args),
        "launcher": launcher,
        "launcher_host": socket.gethostname(),
        "torchrun_flags": dict(torchrun_flags),
        "schedule": schedule if mode == "profile" else None,
        "options": options,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "finished": False,
        # How the run ended; "running" until the launcher says otherwise. A manifest still "running" whose run
        # directory is not locked (launch/runlock.py) belongs to a ddpdoctor that was killed (SIGKILL) or crashed.
        "ended": {"how": "running"},
    }
    write_json(run.manifest, data)


def script_sha256(script: str | None) -> str | None:
    """The script file's SHA-256 (None for a module or a file that cannot be read: the hash is only a hint)."""
    import hashlib

    from ddpdoctor.safe_io import read_bytes

    if not script:
        return None
    try:
        return hashlib.sha256(read_bytes(Path(script), 64 << 20, decompress=False)).hexdigest()
    except (OSError, BadInput):
        return None


def _load_1min() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on this platform
        return None


def _read_optional(path: Any) -> dict[str, Any] | None:
    """A rank's file as validated JSON; None when missing or damaged (the rank died writing it, or wrote none)."""
    try:
        return artefacts.load_dict(path)
    except BadInput:
        return None


def finalize(run: RunDir, exit_code: int | None, duration_s: float, killed_by: str | None,
             ended: dict[str, Any] | None = None, disk_full: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge every rank's info.json and status.json into the manifest. ``disk_full``: the disk under the run
    directory filled during the run (rundir/reserve.py facts: when, what ddpdoctor could not write)."""
    data = load(run)
    ranks: list[dict[str, Any]] = []
    ddp_modules: dict[str, Any] = {}
    first_info: dict[str, Any] | None = None
    for rank in run.ranks_present():
        info = _read_optional(run.rank_file(rank, "info.json")) or {}
        status = _read_optional(run.rank_file(rank, "status.json"))
        first_info = first_info or info
        ranks.append({
            "rank": rank,
            "local_rank": info.get("local_rank"),
            "host": info.get("host"),
            "pid": info.get("pid"),
            "host_cpus": info.get("host_cpus"),
            "local_world_size": info.get("local_world_size"),
            "exit_code": status.get("exit_code") if status else None,
            "exception": status.get("exception") if status else None,
            "steps_completed": status.get("steps_completed") if status else None,
            "status": "no status written (killed by a signal, e.g. SIGKILL or the OOM killer?)" if status is None else "exited",
        })
        if info.get("ddp_modules"):
            ddp_modules[str(rank)] = info["ddp_modules"]
    info0 = first_info or {}
    pg = info0.get("process_group") or {}
    data.update(
        finished=True,
        exit_code=exit_code,
        duration_s=round(duration_s, 3),
        killed_by=killed_by,
        ended=ended or {"how": "exited", "exit_code": exit_code},
        world_size=info0.get("world_size"),
        ranks=ranks,
        hosts=sorted({r["host"] for r in ranks if r.get("host")}),
        backend=pg.get("backend"),
        versions=info0.get("versions"),
        env=info0.get("env"),
        ddp_modules=ddp_modules,
    )
    if disk_full:
        data["disk_full"] = disk_full
    write_json(run.manifest, data)
    return data


def load(run: RunDir) -> dict[str, Any]:
    """manifest.json as JSON, every known field checked against its type (BadInput naming the field otherwise)."""
    return artefacts.load_dict(run.manifest)


def load_typed(run: RunDir) -> Manifest:
    """manifest.json as a typed, validated Manifest."""
    return artefacts.load(run.manifest, Manifest)
