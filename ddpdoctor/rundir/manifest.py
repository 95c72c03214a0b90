"""manifest.json: what the job was (written by the launcher) and what each rank reported (merged at the end)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput
from ddpdoctor.jsontypes import JsonObject, JsonValue
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import RunDir, write_json
from ddpdoctor.rundir.records import RunEndedDoc
from ddpdoctor.rundir.schema import Manifest, Parallelism, RankInfo, RankStatus

T = TypeVar("T")

SCHEMA = 1


def write_initial(run: RunDir, mode: str, script: str | None, script_args: list[str], launcher: str,
                  torchrun_flags: Mapping[str, JsonValue], schedule: Mapping[str, JsonValue] | None,
                  options: Mapping[str, JsonValue]) -> None:
    """The launch as plain data, written as given (the launcher passes its spec's parts: the run directory knows
    nothing of it)."""
    from ddpdoctor.version import __version__

    data: JsonObject = {
        "schema": SCHEMA,
        "ddpdoctor_version": __version__,
        "mode": mode,
        "command_line": list(sys.argv),
        "script": script,
        # what `diff` names when two runs differ (analyses/diff_changes.py): the script's content and the host's load
        "script_sha256": script_sha256(script),
        "host_load": _load_1min(),
        # the kernel's OOM-kill count at launch, to tell an OOM kill from another SIGKILL (findings/crash.py)
        "oom_kills_at_start": oom_kills(),
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


def oom_kills() -> int | None:
    """The host's OOM-kill count since boot (/proc/vmstat ``oom_kill``, Linux 4.13+); None where unreadable."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _load_1min() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on this platform
        return None


def _read_optional(path: Path, schema: type[T]) -> T | None:
    """A rank's file, validated; None when missing or damaged (the rank died writing it, or wrote none)."""
    try:
        return artefacts.load_optional(path, schema)
    except BadInput:
        return None


def finalize(run: RunDir, exit_code: int | None, duration_s: float, killed_by: str | None,
             ended: RunEndedDoc | None = None, disk_full: Mapping[str, JsonValue] | None = None
             ) -> JsonObject:
    """Merge every rank's info.json and status.json into the manifest. The manifest's own JSON is updated in
    place, so that fields this ddpdoctor does not know (a newer one wrote them) are kept. ``disk_full``: the disk
    under the run directory filled during the run (rundir/reserve.py facts: when, what ddpdoctor could not write)."""
    ranks: list[JsonObject] = []
    ddp_modules: JsonObject = {}
    parallelism: Parallelism | None = None
    differs: list[int] = []
    first_info: RankInfo | None = None
    hosts: set[str] = set()
    for rank in run.ranks_present():
        info = _read_optional(run.rank_file(rank, "info.json"), RankInfo) or RankInfo()
        status = _read_optional(run.rank_file(rank, "status.json"), RankStatus)
        first_info = first_info or info
        if info.host:
            hosts.add(info.host)
        ranks.append({
            "rank": rank,
            "local_rank": info.local_rank,
            "host": info.host,
            "pid": info.pid,
            "host_cpus": info.host_cpus,
            "local_world_size": info.local_world_size,
            "exit_code": status.exit_code if status else None,
            "exception": status.exception if status else None,
            "steps_completed": status.steps_completed if status else None,
            "status": "no status written (killed by a signal, e.g. SIGKILL or the OOM killer?)" if status is None else "exited",
        })
        if info.ddp_modules:
            ddp_modules[str(rank)] = artefacts.to_dict(info.ddp_modules)
        if info.parallelism is not None:
            if parallelism is None:
                parallelism = info.parallelism
            elif _parallelism_key(info.parallelism) != _parallelism_key(parallelism):
                differs.append(rank)
    info0 = first_info or RankInfo()
    data = artefacts.load_dict(run.manifest)  # the JSON as written (raw JSON in, updated, written back)
    data.update(
        finished=True,
        exit_code=exit_code,
        duration_s=round(duration_s, 3),
        killed_by=killed_by,
        oom_kills_at_end=oom_kills(),
        ended=dict(ended) if ended else {"how": "exited", "exit_code": exit_code},
        world_size=info0.world_size,
        ranks=ranks,
        hosts=sorted(hosts),
        backend=info0.process_group.backend if info0.process_group else None,
        versions=info0.versions,
        env=info0.env,
        ddp_modules=ddp_modules,
    )
    if parallelism is not None:
        data["parallelism"] = artefacts.to_dict(parallelism)
        data["parallelism_differs"] = differs
    if disk_full:
        data["disk_full"] = dict(disk_full)
    try:
        write_json(run.manifest, data)
    except OSError:
        # A full disk: the file keeps its start ("running"), but this process knows how the job ended; its own
        # report reads that (load/load_typed), never "a rank without a status was killed" (issue 40 item 7).
        _UNWRITTEN[os.path.abspath(run.manifest)] = data
        raise
    return data


# manifest.json's end as this process meant to write it, when the disk had no room for it (finalize).
_UNWRITTEN: dict[str, JsonObject] = {}


def _parallelism_key(p: Parallelism) -> tuple[object, ...]:
    """What must agree across ranks: the kinds and each unit's name and size (a rank whose units differ builds a
    different model: its collectives will not match)."""
    return (tuple(p.kinds), tuple((u.fqn, u.numel, u.kind) for u in p.fsdp2_units), p.dtensor_param_count)


# A boundary: manifest.json's raw JSON, for tools that show it as written.
def load(run: RunDir) -> dict[str, Any]:
    """manifest.json as its raw JSON (for tools that show it as written), every known field checked against its
    type (BadInput naming the field otherwise). ddpdoctor itself reads ``load_typed``."""
    unwritten = _UNWRITTEN.get(os.path.abspath(run.manifest))
    return dict(unwritten) if unwritten is not None else artefacts.load_dict(run.manifest)


def load_typed(run: RunDir) -> Manifest:
    """manifest.json as a typed, validated Manifest (its end as this process meant to write it, when the disk had
    no room for it)."""
    unwritten = _UNWRITTEN.get(os.path.abspath(run.manifest))
    if unwritten is not None:
        return artefacts.validate(safe_io.loads_json(json.dumps(unwritten, default=str)), Manifest,
                                  str(run.manifest))
    return artefacts.load(run.manifest, Manifest)
