"""The analyze pipeline: find the inputs (run dirs, trace folders, trace files), reduce each rank (per-rank
summaries, or traces read in parallel processes), then the cross-rank analyses. Findings and the Report are
ddpdoctor/reports/analyze.py's (analyses never start rules)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.analyses import crossrank
from ddpdoctor.analyses import summary as summ
from ddpdoctor.analyses.rank import RankResult
from ddpdoctor.analyses.results import Analysis, DDPModuleEntry
from ddpdoctor.errors import BadInput
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.schema import Manifest, RankSummary
from ddpdoctor.traces.loader import rank_from_filename
from ddpdoctor.traces.split import usable_cores

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class AnalyzeOptions:
    window: str = "all"  # "all": every recorded step; "hta": work launched before the last ProfilerStep begins
    reread: bool = False  # re-read traces even where per-rank summaries exist
    workers: int | None = None  # parallel processes for traces (default: one per usable core, at most one per unit)
    on_bytes: Callable[[int], None] | None = None  # progress hook: input bytes of each finished unit (views)


@dataclass
class _Unit:
    """One rank's input: trace files to read (grouped by rank in a run dir) or a summary.json to merge."""

    files: list[Path]
    rank: int | None = None
    summary: Path | None = None


def _is_trace_name(p: Path) -> bool:
    return p.is_file() and p.name.endswith(TRACE_SUFFIXES)


def _run_dir_units(run: RunDir, opts: AnalyzeOptions) -> list[_Unit]:
    by_rank: dict[int | None, list[Path]] = defaultdict(list)
    for f in run.trace_files():
        by_rank[rank_from_filename(f)].append(f)
    units: list[_Unit] = []
    for rank, files in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        s = run.rank_file(rank, "summary.json") if rank is not None else None
        if s is not None and s.is_file() and not opts.reread and opts.window == "all":
            units.append(_Unit(files, rank, s))
        elif rank is None:
            units.extend(_Unit([f]) for f in files)
        else:
            units.append(_Unit(sorted(files), rank))
    return units


def discover(paths: list[Path], opts: AnalyzeOptions) -> tuple[list[_Unit], Manifest | None]:
    """Units of work and the first run directory's manifest (for the "ddp" section); a damaged manifest is bad
    input naming the file and field."""
    units: list[_Unit] = []
    manifest: Manifest | None = None
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise BadInput("no such file or directory", p)
        if p.is_dir():
            run = RunDir(p)
            if run.is_run_dir():
                if manifest is None:
                    manifest = artefacts.load(run.manifest, Manifest)
                found = _run_dir_units(run, opts)
                if not found:
                    raise BadInput("run directory holds no profiler traces (traces/*.pt.trace.json.gz)", p)
                units.extend(found)
                continue
            files = sorted(f for f in p.rglob("*") if _is_trace_name(f))
            if not files:
                raise BadInput("no profiler traces (*.json, *.json.gz) in this folder", p)
            units.extend(_Unit([f]) for f in files)
        else:
            units.append(_Unit([p]))
    return units, manifest


def _reduce(unit: _Unit, window: str, workers: int = 1) -> RankResult:
    note = None
    if unit.summary is not None:
        try:
            summary = artefacts.load(unit.summary, RankSummary)
            if summary.schema in (None, summ.SCHEMA) or not unit.files or not _fsdp_summary(summary.calls, unit.summary):
                result = summ.from_summary(summary)
                # The rank wrote its own paths; name the files where they are now (the run dir may have moved).
                result.input.path = ",".join(str(f) for f in unit.files) or str(unit.summary)
                if summary.schema not in (None, summ.SCHEMA) and _fsdp_summary(summary.calls, unit.summary):
                    result.notes.append(f"summary.json of an older ddpdoctor (schema {summary.schema}, now "
                                        f"{summ.SCHEMA}) and no trace to read again: its figures are as it computed "
                                        "them (an FSDP2 rank's overlap counted FSDP's own ranges as compute)")
                return result
        except BadInput as exc:
            if not unit.files:
                raise
            note = f"{exc}; its trace was read instead"  # a damaged summary: the trace itself is the truth
    result = summ.analyze_files(unit.files, rank=unit.rank, window=window, workers=workers)
    if note:
        result.notes.append(note)
    return result


def _fsdp_summary(calls: list[Any], path: Path) -> bool:
    """Whether a summary may hold figures an older ddpdoctor got wrong (summary SCHEMA 1: FSDP's ranges counted as
    compute): its rank built FSDP (info.json), or, for a run older than that record, it all-gathered or
    reduce-scattered (what FSDP does every step; a DDP job that all-gathers a metric is read again too, harmlessly).
    A DDP summary's figures did not change: it is kept, so old DDP run directories analyse as before."""
    from ddpdoctor.rundir.schema import RankInfo

    try:
        info = artefacts.load_optional(path.parent / "info.json", RankInfo)
    except BadInput:
        info = None
    if info is not None and info.parallelism is not None:
        return any(k in ("fsdp2", "hsdp", "replicate", "fsdp1") for k in info.parallelism.kinds)
    return any(c.op in ("all_gather", "reduce_scatter") for c in calls)


def _reduce_safe(unit: _Unit, window: str, workers: int = 1) -> RankResult | tuple[str, str | None]:
    try:
        return _reduce(unit, window, workers)
    except BadInput as exc:
        return exc.problem, exc.path


def _unit_bytes(unit: _Unit) -> int:
    try:
        return sum(f.stat().st_size for f in unit.files) if unit.summary is None else 0
    except OSError:
        return 0


def reduce_all(units: list[_Unit], opts: AnalyzeOptions) -> tuple[list[RankResult], list[str]]:
    """Each unit in its own process when there are several and more than one core; bad files become warnings
    as long as one file is usable."""
    workers = opts.workers or min(len(units), usable_cores())
    tick = opts.on_bytes or (lambda n: None)
    if workers > 1 and sum(1 for u in units if u.summary is None) > 1:
        # multiprocessing only when it is used
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_reduce_safe, u, opts.window): u for u in units}
            for done in as_completed(futures):
                tick(_unit_bytes(futures[done]))
            out = [f.result() for f in futures]
    else:
        # One trace to read: its own events shared among the cores (traces/split.py; big GPU traces only).
        share = opts.workers or usable_cores()
        out = []
        for u in units:
            out.append(_reduce_safe(u, opts.window, share))
            tick(_unit_bytes(u))
    good = [r for r in out if isinstance(r, RankResult)]
    bad = [r for r in out if not isinstance(r, RankResult)]
    if not good:
        raise BadInput(*bad[0])
    return good, [f"skipped {path}: {problem}" for problem, path in bad]


def _assign_order_ranks(results: list[RankResult]) -> list[str]:
    """Ranks from neither distributedInfo nor the file name are numbered after the known ones, in input order."""
    known = {r.metrics.rank for r in results if r.input.rank_source != "order"}
    nxt = max(known, default=-1) + 1
    notes = []
    for r in results:
        if r.input.rank_source == "order":
            r.metrics.rank = r.input.rank = nxt
            records: list[Any] = [*r.calls, *r.buckets, *r.grad_ready, *r.syncs]
            for x in records:
                x.rank = nxt
            notes.append(f"{r.input.path}: no rank in the trace or its name; called rank {nxt} (input order)")
            nxt += 1
    return notes


def _check_duplicates(results: list[RankResult]) -> None:
    seen: dict[int, str] = {}
    for r in results:
        if r.metrics.rank in seen:
            raise BadInput(f"two traces claim rank {r.metrics.rank} (the other is {seen[r.metrics.rank]})", r.input.path)
        seen[r.metrics.rank] = r.input.path


NO_STEPS_ADVICE = ("record with `ddpdoctor profile`, or call prof.step() once per training step inside "
                   "torch.profiler.profile(schedule=...) so that each step is a ProfilerStep#N")


def _check_steps(results: list[RankResult]) -> list[str]:
    """Nothing per step is measurable without ProfilerStep#N events. A trace without any (the profiler used without
    a schedule, serving frameworks) is still a trace: its figures hold over the whole trace, and the findings say so
    (no-profiler-steps) while the per-step rules stay quiet; a note names each rank without steps among ranks with."""
    without = [r for r in results if r.metrics.steps == 0]
    if len(without) == len(results):
        return [f"no ProfilerStep in {'the trace' if len(results) == 1 else 'any trace'}: overlap, exposed "
                "communication and collectives are over the whole trace; step time and every per-step figure "
                f"need steps: {NO_STEPS_ADVICE}"]
    return [f"rank {r.metrics.rank}: no ProfilerStep in its trace, so its step times are unknown; {NO_STEPS_ADVICE}"
            for r in without]


def ddp_section(manifest: Manifest | None) -> list[DDPModuleEntry]:
    """The DDP modules of the lowest rank that reported them (configuration and bucket layout)."""
    mods = {r: m for r, m in (manifest.ddp_modules if manifest else {}).items() if m}
    if not mods:
        return []
    rank = min(mods)
    return [DDPModuleEntry(rank, i, m) for i, m in enumerate(mods[rank])]


def analyze_paths(paths: list[Path], options: AnalyzeOptions | None = None) -> Analysis:
    opts = options or AnalyzeOptions()
    if opts.window not in ("all", "hta"):
        raise BadInput(f"unknown window {opts.window!r} (all or hta)")
    units, manifest = discover(paths, opts)
    results, notes = reduce_all(units, opts)
    notes += _assign_order_ranks(results)
    _check_duplicates(results)
    notes += _check_steps(results)
    results.sort(key=lambda r: r.metrics.rank)
    for r in results:
        notes.extend(r.notes)
        if r.metrics.comm_us == 0:
            notes.append(f"rank {r.metrics.rank}: no communication in the trace, so overlap_pct is null")
    matched = crossrank.match(results)
    id_note = crossrank.comms_id_check(results)
    if id_note:
        notes.append(id_note)
    offsets, note = crossrank.clock_offsets(results, matched)
    if note:
        notes.append(note)
    if any(offsets.values()):
        crossrank.shift(results, offsets)
        matched = crossrank.match(results)
    calls = [c for r in results for c in r.calls]
    # Without DDP (an FSDP2 or tensor-parallel job) an all-reduce launched in backward is no DDP bucket: gloo runs
    # FSDP's reduce-scatter as one. The bucket rules and the bucket what-if do not apply.
    no_ddp = bool(manifest and manifest.parallelism and "ddp" not in manifest.parallelism.kinds)
    return Analysis(
        inputs=[r.input for r in results],
        window=opts.window,
        ranks=[r.metrics for r in results],
        calls=calls,
        buckets=[] if no_ddp else [b for r in results for b in r.buckets],
        grad_ready=[] if no_ddp else [g for r in results for g in r.grad_ready],
        syncs=[s for r in results for s in r.syncs],
        bandwidth=crossrank.bandwidth_fit(calls),
        matched=matched,
        stragglers=crossrank.stragglers(results, matched),
        comm_split=crossrank.exposed_split(results, matched),
        clock_offsets_us=offsets,
        ddp=ddp_section(manifest),
        fsdp=[u for r in results for u in r.fsdp],
        parallelism=manifest.parallelism if manifest else None,
        notes=notes,
        host_cpus={e.rank: (e.host_cpus, e.local_world_size) for e in (manifest.ranks if manifest else [])
                   if e.host_cpus and e.local_world_size},
    )
