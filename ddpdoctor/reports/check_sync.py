"""`check-sync`'s report (and `capture --check-sync`'s): what the ranks' fingerprints and data records say about
cross-rank agreement and data sharding, as a SyncChecksSection with its findings and notes."""

from __future__ import annotations

import msgspec

from ddpdoctor.analyses.data_shards import DataAnalysis, LoaderFacts
from ddpdoctor.analyses.sync import SyncAnalysis, TensorCheck, equal_over
from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import Finding
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import RunDirSection, SyncChecksSection
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.loaders import rank_data_records, rank_sync_records
from ddpdoctor.rundir.schema_sync import SyncModule


def sync_parts(run: RunDir) -> tuple[SyncChecksSection | None, list[Finding], list[str]]:
    """The check-sync analysis of ``run``: its section (None when no rank recorded anything), findings, notes."""
    from ddpdoctor.analyses.data_shards import analyze_data
    from ddpdoctor.analyses.sync import analyze_sync
    from ddpdoctor.findings.sync import sync_findings
    from ddpdoctor.findings.sync_data import data_findings
    from ddpdoctor.probes.guard import read_probe_notes

    records = rank_sync_records(run)
    data = rank_data_records(run)
    present = run.ranks_present()
    if not records:
        return None, [], ["no rank wrote sync.json: the script ended before check-sync could record anything"]
    notes: list[str] = []
    missing = sorted(set(present) - set(records))
    if missing:
        notes.append(f"ranks {missing} wrote no sync.json; they are not compared")
    analysis = analyze_sync(records)
    world = max(r.world_size or 1 for r in records.values())
    groups = _data_groups(run)
    if groups and len(groups) < world:
        # Ranks of one tensor-parallel group read the same data: one of each is the data-parallel rank compared.
        notes.append(f"the sampler was checked per data-parallel group: {len(groups)} group(s) of ranks that read "
                     f"the same data ({', '.join(str(g) for g in groups[:4])}{' …' if len(groups) > 4 else ''}), "
                     "one rank of each compared")
        data = {g[0]: data[g[0]] for g in groups if g[0] in data}
        world = len(groups)
    shards = analyze_data(data, world)
    notes.extend(read_probe_notes({r: run.rank_dir(r) for r in present}))
    findings = [*sync_findings(analysis), *data_findings(shards, world)]
    notes.extend(shards.notes)
    stop_after = max(r.stop_after or 0 for r in records.values())
    if stop_after and analysis.steps_run < stop_after:
        notes.append(f"the script ended after {analysis.steps_run} of the {stop_after} steps asked for")
    if not analysis.modules:
        notes.append("no DistributedDataParallel module was built: gradients, parameters and buffers were not compared")
    elif all(m.ddp is False for m in analysis.modules) and (sharded := sharded_params(analysis.modules)):
        # 1-D FSDP shards every parameter: no two ranks hold the same values, so only the layouts can agree (#37)
        n = sum(len(v) for v in sharded)
        shown = ", ".join([x for v in sharded for x in v][:4]) + (" …" if n > 4 else "")
        notes.append(f"compared across ranks: {analysis.layouts.comparisons} layout comparison(s) (global shape, "
                     f"mesh, placements), {analysis.params.comparisons} parameter value comparison(s) (replicated "
                     f"parameters), {analysis.buffers.comparisons} buffer comparison(s), "
                     f"{analysis.optimizer_steps.comparisons} optimizer step-count comparison(s); not compared: {n} "
                     f"sharded parameter(s) ({shown}) whose values have no peer (each rank holds its own shard, "
                     "sharded on every mesh dim)")
    elif all(m.ddp is False for m in analysis.modules) and any(m.param_layouts for m in analysis.modules):
        notes.append("no DistributedDataParallel module was built: the parameters the optimizer updates were "
                     "compared across the ranks their placements say must hold them equal (a DTensor Replicate()d "
                     "over a mesh dim across that dim, a plain tensor across every rank; a sharded one by layout "
                     f"only): {analysis.params.comparisons} parameter, {analysis.buffers.comparisons} buffer, "
                     f"{analysis.optimizer_steps.comparisons} optimizer step-count and "
                     f"{analysis.layouts.comparisons} layout comparison(s)")
    elif all(m.ddp is False for m in analysis.modules) and analysis.params.comparisons:
        notes.append("no DistributedDataParallel module was built: the parameters the optimizer updates were "
                     "compared across ranks")
    elif analysis.grads.comparisons == 0 and analysis.params.comparisons > 0:
        closures = max(r.closure_steps or 0 for r in records.values())
        notes.append("gradients were not compared: no DDP module had run a forward and backward when the optimizer "
                     "stepped" + (f" ({closures} step(s) took a closure)" if closures else "")
                     + "; the parameters after each step were compared")
    data_steps = max(r.data_steps or 0 for r in records.values())
    for facts in shards.loaders:
        sampler = next((s for s in facts.sampler.values() if s is not None), None)
        if sampler and sampler.shuffle and not sampler.replacement and min(facts.epochs_seen.values()) < 2:
            notes.append(_one_epoch_note(facts, analysis.steps_run, stop_after, data_steps))
    return SyncChecksSection.from_json({"checks": _checks(analysis, shards)}), findings, notes


def _data_groups(run: RunDir) -> list[list[int]] | None:
    from ddpdoctor.analyses.mesh_groups import data_groups
    from ddpdoctor.rundir import manifest as manifest_mod

    try:
        return data_groups(manifest_mod.load_typed(run).parallelism)
    except BadInput:  # no manifest (a capture window): every rank is its own data-parallel rank
        return None


def assemble(run: RunDir, job_exit: int | None, *, locked: bool) -> Report:
    """`check-sync` once its job ended: the watched run's report (job, hang, crashes) plus the sync checks.
    ``locked``: a live ddpdoctor still holds the run directory (see reports/watched.py)."""
    from ddpdoctor.reports.watched import watched_report

    base = watched_report(run, "check-sync", locked=locked)
    section, findings, notes = sync_parts(run)
    if job_exit:
        notes.append(f"the script failed (exit code {job_exit}); its ranks' output is in "
                     f"{run.root}/ranks/rankR/stderr.log")
    return Report("check-sync", parts=[*base.parts, *([section] if section else [])],
                  findings=[*base.findings, *findings], notes=[*base.notes, *notes], stopped=base.stopped)


def assemble_capture(window: RunDir, misaligned: str | None) -> Report:
    """`capture --check-sync`: the window folder's sync checks."""
    section, findings, notes = sync_parts(window)
    return Report("capture", parts=[RunDirSection(str(window.root)), *([section] if section else [])],
                  findings=findings, notes=[*([misaligned] if misaligned else []), *notes])


def _one_epoch_note(facts: LoaderFacts, steps: int, stop_after: int, data_steps: int) -> str:
    """Why set_epoch was not judged for a shuffling loader, and how many steps it would take."""
    per_epoch = facts.steps_per_epoch
    text = (f"DataLoader #{facts.loader} shuffles but did not reach a second epoch in the {steps} step(s) the script "
            "ran, so whether each epoch gets a new order (sampler.set_epoch) was not checked")
    if per_epoch:
        text += f"; an epoch is {per_epoch} steps here"
        if stop_after and per_epoch + 1 > stop_after + data_steps:
            text += f": run with --data-steps {per_epoch + 1 - stop_after} (or --steps 0) to reach the second one"
    return text


def _checks(analysis: SyncAnalysis, shards: DataAnalysis) -> JsonObject:
    def tensor(check: TensorCheck) -> JsonObject:
        return {"comparisons": check.comparisons, "steps": sorted(set(check.steps)), "diverged": len(check.diverged),
                "within_tolerance": len(check.within_tolerance), "first_step": check.first_step}

    out: JsonObject = {
        "ranks": analysis.ranks,
        "steps_checked": analysis.steps_checked,
        "steps_run": analysis.steps_run,
        "modules": [{"index": m.index, "class": m.module_class, "parameters": len(m.params),
                     "buffers": len(m.buffers), "broadcast_buffers": m.broadcast_buffers}
                    for m in analysis.modules],
        "grads": tensor(analysis.grads),
        "params": tensor(analysis.params),
        "buffers": tensor(analysis.buffers),
        "data": [{"loader": e.loader, "epoch": e.epoch, "by": e.kind,
                  "samples_per_rank": {str(r): n for r, n in e.samples_per_rank.items()},
                  "batches_per_rank": {str(r): n for r, n in e.batches_per_rank.items()}, "shared": e.overlap,
                  "missing": e.missing} for e in shards.epochs],
        "equivalence": msgspec.to_builtins(analysis.equivalence),
    }
    if analysis.optimizer_steps.comparisons:
        out["optimizer_steps"] = tensor(analysis.optimizer_steps)
    if analysis.layouts.comparisons:
        out["layouts"] = {"comparisons": analysis.layouts.comparisons, "differ": len(analysis.layouts.differ)}
    return out


def sharded_params(modules: list[SyncModule]) -> list[list[str]]:
    """Per module, the names of the parameters sharded on every mesh dim (equal_over: no rank must agree with
    another on their values, only on their layout)."""
    out = []
    for m in modules:
        names = [m.params[j] if j < len(m.params) else f"#{j}" for j in range(len(m.param_equal_group))
                 if equal_over(m, j) == ()]
        if names:
            out.append(names)
    return out
