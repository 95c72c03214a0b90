"""Typed loaders of the run-directory files that every report reads (status.json, sync.json, data.json, hang.json,
heartbeats.json): each validated against rundir/schema.py; a damaged file is bad input naming the file and field.
status.json, hang.json and heartbeats.json come back as the documents they are (rundir/records.py's TypedDicts,
unknown keys kept), for the rules that read them as the monitor and the ranks hold them."""

from __future__ import annotations

from typing import Any, cast

from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.records import HangDoc, HeartbeatsDoc, RankStatusDoc
from ddpdoctor.rundir.schema import DataRecord, GatheredSync, Hang, Heartbeats, RankStatus, SyncRecord


def rank_statuses(run: RunDir) -> dict[int, RankStatusDoc | None]:
    """Each rank's status.json (validated), or None for a rank that wrote none (killed by a signal)."""
    statuses: dict[int, RankStatusDoc | None] = {}
    for rank in run.ranks_present():
        path = run.rank_file(rank, "status.json")
        # The cast is the boundary: the schema has just checked every key the rules read.
        statuses[rank] = cast(RankStatusDoc, artefacts.load_dict(path, RankStatus)) if path.exists() else None
    return statuses


def hang_doc(run: RunDir) -> HangDoc | None:
    """RUN/hang.json as the monitor wrote it (validated), or None when the job did not hang."""
    path = run.root / "hang.json"
    return cast(HangDoc, artefacts.load_dict(path, Hang)) if path.exists() else None


def heartbeats_doc(run: RunDir) -> HeartbeatsDoc | None:
    """RUN/heartbeats.json as the monitor wrote it (validated), or None when there is none."""
    path = run.root / "heartbeats.json"
    return cast(HeartbeatsDoc, artefacts.load_dict(path, Heartbeats)) if path.exists() else None


def rank_sync_records(run: RunDir) -> dict[int, SyncRecord]:
    """rank -> the rank's sync.json, typed (ranks of another node from rank 0's sync-all.json, as below)."""
    return {r: artefacts.validate(d, SyncRecord, run.rank_file(r, "sync.json"))
            for r, d in rank_sync_files(run, "sync.json").items()}


def rank_data_records(run: RunDir) -> dict[int, DataRecord]:
    """rank -> the rank's data.json, typed (ranks of another node from rank 0's sync-all.json, as below)."""
    return {r: artefacts.validate(d, DataRecord, run.rank_file(r, "data.json"))
            for r, d in rank_sync_files(run, "data.json").items()}


# A boundary: the raw JSON of each rank's sync.json/data.json, validated here and typed by the two loaders above.
def rank_sync_files(run: RunDir, name: str) -> dict[int, dict[str, Any]]:
    """rank -> the rank's NAME (sync.json or data.json), validated against its schema. Ranks that wrote none here
    (another node's run directory) come from the copy rank 0 gathered (ranks/rank0/sync-all.json), when there is
    one."""
    out: dict[int, dict[str, Any]] = {}
    for rank in run.ranks_present():
        path = run.rank_file(rank, name)
        if path.exists():
            out[rank] = artefacts.load_dict(path)
    key = {"sync.json": "sync", "data.json": "data"}[name]
    for rank in run.ranks_present():
        path = run.rank_file(rank, "sync-all.json")
        if not path.exists():
            continue
        gathered = artefacts.decode_json(path)
        if isinstance(gathered, dict):
            gathered.pop("schema_version", None)
        artefacts.validate(gathered, dict[int, GatheredSync], path)
        for r, payload in gathered.items():
            if int(r) not in out and isinstance(payload.get(key), dict):
                out[int(r)] = payload[key]
    return out


def rank_text(run: RunDir, rank: int, name: str, missing: str | None = "") -> str | None:
    """A rank's text file (stderr.log, stdout.log), bounded and never through a link; ``missing`` when it cannot
    be read (a rank killed before it wrote one)."""
    from ddpdoctor import safe_io
    from ddpdoctor.errors import BadInput

    try:
        text = safe_io.read_bytes(run.rank_file(rank, name), decompress=False).decode(errors="replace")
    except (OSError, BadInput):
        return missing
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as Path.read_text reads it (universal newlines)
