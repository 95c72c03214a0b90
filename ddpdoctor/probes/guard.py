"""A probe's failure stays the probe's: it becomes a note in ranks/rankR/probe-notes.json and the probe switches off.

Probes run inside the user's ranks, on the user's objects (models returning anything, datasets of any
kind): an exception there must never reach the script. ``Guard.call`` runs one hook; on an Exception it
records where and why, turns its probe off (later hooks return at once) and returns ``None`` so the
user's code goes on as if ddpdoctor were absent. ``SystemExit`` (check-sync's clean stop) and
``KeyboardInterrupt`` pass through: they are not failures."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from ddpdoctor.safe_io import write_atomic

NOTES_FILE = "probe-notes.json"
MAX_NOTES = 20  # per rank: one failing hook per step would otherwise fill the disk

T = TypeVar("T")


class ProbeNote(TypedDict):
    """One failure: which probe, in which hook, at which step, the error and the line that raised it."""

    probe: str
    where: str
    step: int | None
    error: str
    at: str | None


class ProbeNotes:
    """One rank's list of probe failures, rewritten (atomically) at each new one; failures are rare."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.notes: list[ProbeNote] = []

    def add(self, probe: str, where: str, exc: BaseException, step: int | None) -> None:
        if len(self.notes) >= MAX_NOTES:
            return
        tb = traceback.extract_tb(exc.__traceback__)
        self.notes.append({
            "probe": probe, "where": where, "step": step, "error": f"{type(exc).__name__}: {exc}"[:500],
            "at": f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else None,
        })
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.notes))
        except OSError:
            pass  # a full disk must not break the job either


class Guard:
    """The on/off switch of one probe, and the wrapper its hooks run in."""

    def __init__(self, name: str, notes: ProbeNotes, step: Callable[[], int | None] = lambda: None) -> None:
        self.name = name
        self.notes = notes
        self.enabled = True
        self._step = step

    def call(self, where: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)`` when the probe is on; on an Exception: note it, switch off, return None."""
        if not self.enabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the whole point: the user's job never sees it
            self.fail(where, exc)
            return None

    def fail(self, where: str, exc: BaseException) -> None:
        self.enabled = False
        try:
            step = self._step()
        except Exception:  # noqa: BLE001
            step = None
        self.notes.add(self.name, where, exc, step)


def read_probe_notes(rank_dirs: dict[int, Path]) -> list[str]:
    """One report note per (probe, where, error) across ranks, naming the ranks; unreadable files are skipped."""
    grouped: dict[tuple[str, str, str], list[int]] = {}
    meta: dict[tuple[str, str, str], Mapping[str, object]] = {}  # a note as read back (JSON in)
    for rank, rank_dir in sorted(rank_dirs.items()):
        path = rank_dir / NOTES_FILE
        try:
            if not path.is_file() or path.stat().st_size > 1_000_000:
                continue
            items = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            key = (str(item.get("probe")), str(item.get("where")), str(item.get("error")))
            grouped.setdefault(key, []).append(rank)
            meta.setdefault(key, item)
    out = []
    for key, ranks in grouped.items():
        probe, where, error = key
        step = meta[key].get("step")
        at = f" at step {step}" if isinstance(step, int) else ""
        out.append(f"ddpdoctor's {probe} probe failed in {where}{at} on rank(s) {ranks} ({error}) and switched itself "
                   "off; the job ran on as without it")
    return out
