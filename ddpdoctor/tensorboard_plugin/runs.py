"""What the TensorBoard tab shows, as plain data: the run directories under a log dir and each one's report,
and the timeline of every rank's trace on one clock. No TensorBoard import here, so tests call it directly."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS, group_ranks, legend
from ddpdoctor.report import Report
from ddpdoctor.reports.perf_json import RankJson
from ddpdoctor.safe_io import loads_json, read_bytes
from ddpdoctor.tensorboard_plugin.access import opened_file, opened_subdir

MAX_DEPTH = 4  # logdir/a/b/c/RUN: deeper folders are not searched (a log dir may hold a whole home directory)
MAX_RUNS = 500
MAX_REPORT_BYTES = 256 << 20
# Events drawn per run: past this the shortest events are left out (and the page says so).
MAX_TIMELINE_EVENTS = 300_000


def is_run_dir(path: Path) -> bool:
    """A real folder holding a regular report.json (lstat: a link named report.json is not a run)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(path / "report.json").st_mode)
    except OSError:
        return False


def find_runs(logdir: Path) -> dict[str, Path]:
    """{name: path} of every run directory (one with a report.json) under ``logdir``, names relative to it."""
    runs: dict[str, Path] = {}
    logdir = Path(logdir)
    if not logdir.is_dir():
        return runs
    for root, dirs, _files in os.walk(logdir):
        here = Path(root)
        depth = len(here.relative_to(logdir).parts)
        if is_run_dir(here):
            runs[here.relative_to(logdir).as_posix() or "."] = here
            dirs[:] = []  # a run's own folders (ranks/, traces/) hold no runs
        elif depth >= MAX_DEPTH:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if len(runs) >= MAX_RUNS:
            break
    return dict(sorted(runs.items()))


def read_report_bytes(run: Path, decompress: bool = False) -> bytes:
    """report.json as it is on disk: a regular file, never through a link, bounded."""
    return read_bytes(run / "report.json", MAX_REPORT_BYTES, decompress=decompress, follow_links=False)


class RunRow(TypedDict, total=False):
    """One row of the tab's run list (``error`` alone, after ``run``, when its report.json is unreadable)."""

    run: str
    error: str
    command: str
    status: str
    findings: dict[str, int]  # severity -> count
    why: str
    ranks: int | None
    exit_code: int | None
    has_traces: bool
    mtime: float


class TimelineTrack(TypedDict):
    """A thread or GPU stream: each event [start_us, dur_us, depth, name_index, cat_index]."""

    name: str
    depth: int
    events: list[list[float | int]]


class TimelineRank(TypedDict):
    rank: int
    label: str
    role: str | None
    clock_offset_us: float
    tracks: list[TimelineTrack]


class GroupRow(TypedDict):
    """One row of the tab's rank table at a job's scale: a rank that matters, or a class of alike ranks."""

    label: str
    ranks: str
    count: int
    shown_rank: int
    step_time_us: float | None
    comm_us: float | None
    single: bool


class RankGroups(TypedDict):
    rows: list[GroupRow]
    legend: str
    all_ranks: int
    max_rows: int


class Timeline(TypedDict):
    """The tab's timeline of every rank's complete events on rank 0's clock (names and cats indexed once)."""

    t0_us: float
    ranks: list[TimelineRank]
    names: list[str]
    cats: list[str]
    truncated: bool
    events: int
    max_events: int
    groups: RankGroups | None  # a big job: the classes of alike ranks drawn (rank_groups), else None
    asked: list[int] | None  # the ranks a person asked to see
    traces_not_read: int

def load_report(run: Path) -> Report:
    data = loads_json(read_report_bytes(run, decompress=True))
    if not isinstance(data, dict):
        raise ValueError("report.json is not an object")
    from ddpdoctor.reports.sections import load_report as load_typed

    return load_typed(data)  # typed sections, as the command assembled them


def run_summary(name: str, run: Path) -> RunRow:
    """One row of the run list: verdict, findings by severity, ranks, exit code."""
    try:
        report = load_report(run)
    except (OSError, ValueError) as exc:
        return {"run": name, "error": f"report.json unreadable: {exc}"}
    from ddpdoctor.reports.sections import JobSection, PerfSection

    counts: dict[str, int] = {}
    for f in report.findings:
        counts[f.severity.value] = counts.get(f.severity.value, 0) + 1
    perf, job = report.section(PerfSection), report.section(JobSection)
    from ddpdoctor.renderers.html import lead_finding

    lead = lead_finding(report.findings)
    return {
        "run": name, "command": report.command, "status": report.status, "findings": counts,
        "why": lead.title if lead else "no findings",
        "ranks": len(perf.ranks if perf and isinstance(perf.ranks, list) else []) or (job.job.world_size if job else None),
        "exit_code": job.job.exit_code if job else None,
        "has_traces": bool(trace_files(run)), "mtime": (run / "report.json").lstat().st_mtime,
    }


def trace_files(run: Path) -> list[Path]:
    """The run's traces: regular files in its own traces/ folder (never a link, to a file or a folder)."""
    folder = run / "traces"
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.pt.trace.json*") if not p.is_symlink() and p.is_file())


def _depths(events: list[tuple[float, float, int]]) -> list[int]:
    """Nesting depth of each (ts, dur, i) event within its track: a stack of open end times."""
    out = [0] * len(events)
    stack: list[float] = []
    for ts, dur, i in sorted(events, key=lambda e: (e[0], -e[1])):
        while stack and stack[-1] <= ts:
            stack.pop()
        out[i] = len(stack)
        stack.append(ts + dur)
    return out


def parse_ranks(text: str, limit: int = MAX_RANK_ROWS) -> list[int]:
    """"512,600-603" -> [512, 600, 601, 602, 603]: the ranks a person asked to see, at most ``limit`` of them (a
    range is never expanded past the limit, whatever its size). ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or len(part) > 15:
            raise ValueError(f"not a rank or a range of ranks: {part[:20]!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"empty range: {part!r}")
        for r in range(first, min(last, first + limit) + 1):
            if r not in out:
                out.append(r)
            if len(out) >= limit:
                return out
    return out


def _figure(r: RankJson, stepless: bool) -> float | None:
    v = r.get("comm_us") if stepless else (r.get("step_time_us") or {}).get("median")
    return float(v) if isinstance(v, (int, float)) and v == v else None


def rank_groups(sections: Mapping[str, Any]) -> RankGroups | None:
    """At more than MAX_RANK_ROWS ranks, what the tab shows instead of one row per rank, as the terminal and the
    HTML report do (renderers/rank_classes.py): the ranks that matter (stragglers, slowest, fastest), one row each,
    and the classes of alike ranks as ranges, each drawn through one member (the one nearest its class's median).
    None when every rank fits."""
    # The report's JSON (a boundary), each row checked for its rank before it is read as a RankJson.
    ranks = cast("list[RankJson]", [r for r in sections.get("ranks") or []
                                    if isinstance(r, dict) and isinstance(r.get("rank"), int)])
    stragglers = [r for r in (sections.get("stragglers") or {}).get("ranks") or [] if isinstance(r, int)]
    rows = group_ranks(ranks, stragglers)
    if rows is None:
        return None
    stepless = not any(_figure(r, False) is not None for r in ranks)
    by_rank = {int(r["rank"]): r for r in ranks}
    out: list[GroupRow] = []
    for row in rows:
        shown = row.ranks[0]
        if len(row.ranks) > 1:
            values = {m: v for m in row.ranks if (v := _figure(by_rank[m], stepless)) is not None}
            known = sorted(values.values())
            if known:
                mid = known[len(known) // 2]
                shown = min(values, key=lambda m: (abs(values[m] - mid), m))
        step = (row.row.get("step_time_us") or {}).get("median")
        out.append({"label": row.label, "ranks": row.ranges, "count": len(set(row.ranks)), "shown_rank": shown,
                    "step_time_us": step, "comm_us": row.row.get("comm_us"), "single": len(row.ranks) == 1})
    return {"rows": out, "legend": legend(stepless), "all_ranks": len(by_rank), "max_rows": MAX_RANK_ROWS}


def timeline(run: Path, ranks: list[int] | None = None) -> Timeline:
    """Every rank's complete ("X") events on rank 0's clock (the report's clock offsets), as compact rows:
    tracks per rank (a thread or a GPU stream), each event [start_us, dur_us, depth, name_index, cat_index].

    A big job (more than MAX_RANK_ROWS ranks) is drawn through the ranks that matter and one member of each class
    of alike ranks (rank_groups), or through ``ranks`` when asked; only those ranks' traces are read."""
    from ddpdoctor.renderers.chrome_trace import read_trace

    report = load_report(run)
    s = report.sections
    groups = rank_groups(s)
    roles: dict[int, str] = {}
    if ranks:
        wanted: set[int] | None = set(ranks[:MAX_RANK_ROWS])
    elif groups is not None:
        wanted = {g["shown_rank"] for g in groups["rows"]}
        for g in reversed(groups["rows"]):  # a rank both single and a class's member is named by its single row
            roles[g["shown_rank"]] = g["label"] if g["single"] else f"{g['label']}: ranks {g['ranks']} ({g['count']})"
    else:
        wanted = None
    offsets = {int(k): float(v) for k, v in (s.get("clock_offsets_us") or {}).items()
               if str(k).lstrip("-").isdigit() and isinstance(v, (int, float))}
    known = {Path(str(i.get("path"))).name: i.get("rank") for i in s.get("inputs") or [] if isinstance(i, dict)}
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    ranks_out: list[TimelineRank] = []
    raw_events: list[tuple[int, str, float, float, str, str]] = []  # rank, track, ts, dur, name, cat
    hosts: dict[int, str | None] = {}
    skipped = 0
    with contextlib.ExitStack() as stack:
        # traces/ opened once (never through a link), each trace opened through it once: a name swapped for a link
        # after the listing reads nothing else (issue 40 item 3).
        tdir = stack.enter_context(opened_subdir(run, "traces"))
        for i, path in enumerate(trace_files(run) if tdir is not None else []):
            rank = known.get(path.name)
            if wanted is not None and (not isinstance(rank, int) or rank not in wanted):
                skipped += 1  # a big job: the trace of a rank not drawn is not read (unnamed traces neither)
                continue
            assert tdir is not None
            with opened_file(tdir, path.name) as handle:
                if handle is None:
                    continue
                trace = read_trace(handle)
            _events(trace, path, i, rank, offsets, hosts, raw_events)
    truncated = len(raw_events) > MAX_TIMELINE_EVENTS
    if truncated:
        raw_events.sort(key=lambda e: -e[3])
        raw_events = raw_events[:MAX_TIMELINE_EVENTS]
    t0 = min((e[2] for e in raw_events), default=0.0)
    by_track: dict[tuple[int, str], list[tuple[float, float, str, str]]] = {}
    for rank, track, ts, dur, name, cat in raw_events:
        by_track.setdefault((rank, track), []).append((ts - t0, dur, name, cat))
    for rank in sorted({r for r, _ in by_track}):
        tracks: list[TimelineTrack] = []
        for (r, track), evs in sorted(by_track.items(), key=lambda kv: (_track_order(kv[0][1]), kv[0][1])):
            if r != rank:
                continue
            depth = _depths([(e[0], e[1], i) for i, e in enumerate(evs)])
            rows = [[round(ts, 3), round(dur, 3), depth[i], names.setdefault(name, len(names)),
                     cats.setdefault(cat, len(cats))] for i, (ts, dur, name, cat) in enumerate(evs)]
            tracks.append({"name": track, "depth": max(depth, default=0) + 1, "events": rows})
        host = hosts.get(rank)
        role = roles.get(rank)
        ranks_out.append({"rank": rank, "label": f"rank {rank}" + (f" ({host})" if host else "")
                          + (f" · {role}" if role else ""), "role": role,
                          "clock_offset_us": offsets.get(rank, 0.0), "tracks": tracks})
    return {"t0_us": t0, "ranks": ranks_out, "names": list(names), "cats": list(cats), "truncated": truncated,
            "events": len(raw_events), "max_events": MAX_TIMELINE_EVENTS, "groups": groups,
            "asked": sorted(wanted) if ranks and wanted is not None else None, "traces_not_read": skipped}


def _track_order(name: str) -> int:
    """CPU threads first, then devices (GPU streams), then the rest."""
    if name.startswith("thread") or ":" not in name:
        return 0
    return 1 if name.upper().startswith("GPU") else 2


def _events(trace: Any, path: Path, i: int, rank: object, offsets: Mapping[int, float], hosts: dict[int, str | None],
            raw_events: list[tuple[int, str, float, float, str, str]]) -> None:
    """One rank's complete events (rank, track, ts on rank 0's clock, dur, name, cat) added to ``raw_events``."""
    from ddpdoctor.renderers.chrome_trace import event_args, raw_text
    from ddpdoctor.renderers.merge import TraceStats, trace_rank

    rank = rank if isinstance(rank, int) else trace_rank(trace, path, i)
    hosts[rank] = trace.host
    offset = offsets.get(rank, 0.0)
    stats = TraceStats(trace)
    threads: dict[tuple[Any, Any], str] = {}
    for chunk in trace.chunks():
        for ev in chunk:
            if ev.ph == "M" and ev.name == "thread_name":
                threads[(ev.pid, ev.tid)] = str(event_args(ev).get("name") or "")
            if ev.ph != "X" or not isinstance(ev.ts, (int, float)) or not isinstance(ev.dur, (int, float)):
                continue
            if ev.pid == stats.main_pid:
                track = threads.get((ev.pid, ev.tid)) or f"thread {ev.tid}"
            else:
                label = stats.labels.get(ev.pid, f"pid {ev.pid}")
                track = f"{label}: {threads.get((ev.pid, ev.tid)) or ev.tid}"
            name = ev.name if isinstance(ev.name, str) else ""
            raw_events.append((rank, track, float(ev.ts) - offset, float(ev.dur), name, raw_text(ev.cat)))
