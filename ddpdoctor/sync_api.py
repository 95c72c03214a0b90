"""`ddpdoctor.check_sync(...)` for test suites, and the report that `check-sync` builds from a run directory."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.probes.guard import read_probe_notes
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def load_rank_files(run: RunDir, name: str) -> dict[int, dict[str, Any]]:
    """rank -> the rank's NAME (sync.json or data.json), validated against its schema (rundir/schema.py). Ranks
    that wrote none here (another node's run directory) come from the copy rank 0 gathered
    (ranks/rank0/sync-all.json), when there is one."""
    from ddpdoctor.rundir import artefacts
    from ddpdoctor.rundir.schema import GatheredSync

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


def sync_report(run: RunDir, report: Report | None = None) -> Report:
    """Add the check-sync analysis of ``run`` to ``report`` (a new one by default)."""
    from ddpdoctor.analyses.data_shards import analyze_data
    from ddpdoctor.analyses.sync import analyze_sync
    from ddpdoctor.findings.sync import sync_findings
    from ddpdoctor.findings.sync_data import data_findings

    report = report or Report(command="check-sync")
    records = load_rank_files(run, "sync.json")
    data = load_rank_files(run, "data.json")
    present = run.ranks_present()
    if not records:
        report.notes.append("no rank wrote sync.json: the script ended before check-sync could record anything")
        return report
    missing = sorted(set(present) - set(records))
    if missing:
        report.notes.append(f"ranks {missing} wrote no sync.json; they are not compared")
    analysis = analyze_sync(records)
    world = max(int(r.get("world_size", 1)) for r in records.values())
    shards = analyze_data(data, world)
    report.notes.extend(read_probe_notes({r: run.rank_dir(r) for r in present}))
    report.findings.extend(sync_findings(analysis))
    report.findings.extend(data_findings(shards, world))
    report.notes.extend(shards.notes)
    stop_after = max(int(r.get("stop_after", 0) or 0) for r in records.values())
    if stop_after and analysis.steps_run < stop_after:
        report.notes.append(f"the script ended after {analysis.steps_run} of the {stop_after} steps asked for")
    if not analysis.modules:
        report.notes.append("no DistributedDataParallel module was built: gradients, parameters and buffers were not compared")
    elif all(m.get("ddp") is False for m in analysis.modules):
        report.notes.append("no DistributedDataParallel module was built: the parameters the optimizer updates were "
                            "compared across ranks")
    elif analysis.grads.comparisons == 0 and analysis.params.comparisons > 0:
        closures = max(int(r.get("closure_steps", 0) or 0) for r in records.values())
        report.notes.append("gradients were not compared: no DDP module had run a forward and backward when the "
                            "optimizer stepped" + (f" ({closures} step(s) took a closure)" if closures else "")
                            + "; the parameters after each step were compared")
    data_steps = max(int(r.get("data_steps", 0) or 0) for r in records.values())
    for facts in shards.loaders:
        sampler = next((s for s in facts.sampler.values() if s), None) or {}
        if sampler.get("shuffle") and not sampler.get("replacement") and min(facts.epochs_seen.values()) < 2:
            report.notes.append(_one_epoch_note(facts, analysis.steps_run, stop_after, data_steps))
    report.sections["checks"] = _checks_section(analysis, shards)
    return report


def _one_epoch_note(facts: Any, steps: int, stop_after: int, data_steps: int) -> str:
    """Why set_epoch was not judged for a shuffling loader, and how many steps it would take."""
    per_epoch = facts.steps_per_epoch
    text = (f"DataLoader #{facts.loader} shuffles but did not reach a second epoch in the {steps} step(s) the script "
            "ran, so whether each epoch gets a new order (sampler.set_epoch) was not checked")
    if per_epoch:
        text += f"; an epoch is {per_epoch} steps here"
        if stop_after and per_epoch + 1 > stop_after + data_steps:
            text += f": run with --data-steps {per_epoch + 1 - stop_after} (or --steps 0) to reach the second one"
    return text


def _checks_section(analysis: Any, shards: Any) -> dict[str, Any]:
    def tensor(check: Any) -> dict[str, Any]:
        return {"comparisons": check.comparisons, "steps": sorted(set(check.steps)), "diverged": len(check.diverged),
                "within_tolerance": len(check.within_tolerance), "first_step": check.first_step}

    return {
        "ranks": analysis.ranks,
        "steps_checked": analysis.steps_checked,
        "steps_run": analysis.steps_run,
        "modules": [{"index": m["index"], "class": m.get("module_class"), "parameters": len(m.get("params", [])),
                     "buffers": len(m.get("buffers", [])), "broadcast_buffers": m.get("broadcast_buffers")}
                    for m in analysis.modules],
        "grads": tensor(analysis.grads),
        "params": tensor(analysis.params),
        "buffers": tensor(analysis.buffers),
        "data": [{"loader": e.loader, "epoch": e.epoch, "by": e.kind, "samples_per_rank": {str(r): n for r, n in e.samples_per_rank.items()},
                  "batches_per_rank": {str(r): n for r, n in e.batches_per_rank.items()}, "shared": e.overlap,
                  "missing": e.missing} for e in shards.epochs],
        "equivalence": analysis.equivalence,
    }


def render_sync_sections(report: Report, out: Any, verbose: bool) -> None:
    """Terminal view of the "checks" section: what was compared, and the data shards per epoch."""
    from rich.table import Table

    checks = report.sections.get("checks")
    if not checks:
        _print_run_dir(report, out)
        return
    line = f"checked {checks['steps_checked']} step(s) on ranks {checks['ranks']}"
    if checks.get("steps_run", 0) > checks["steps_checked"]:
        line += f"; the data recorder ran on to step {checks['steps_run']}"
    out.print(line)
    table = Table(title="Cross-rank comparisons")
    for col in ("what", "steps", "comparisons", "differ", "within tolerance"):
        table.add_column(col)
    for key in ("grads", "params", "buffers"):
        c = checks[key]
        table.add_row(key, str(len(c["steps"])), str(c["comparisons"]), str(c["diverged"]), str(c["within_tolerance"]))
    out.print(table)
    if checks["data"]:
        data = Table(title="Data shards (training loaders)")
        for col in ("loader", "epoch", "samples per rank", "batches per rank", "shared", "unseen"):
            data.add_column(col)
        for e in checks["data"][: None if verbose else 6]:
            data.add_row(str(e["loader"]), str(e["epoch"]), str(e["samples_per_rank"]), str(e["batches_per_rank"]),
                         str(e["shared"]), "-" if e["missing"] is None else str(e["missing"]))
        out.print(data)
    _print_run_dir(report, out)


def _print_run_dir(report: Report, out: Any) -> None:
    from rich.markup import escape

    run_dir = report.sections.get("run_dir")
    if run_dir:
        out.print(f"[dim]run directory: {escape(str(run_dir))}[/dim]")


def run_check_sync(spec: Any, watcher: Any = None) -> tuple[Report, int]:
    """Launch ``spec`` (mode "check-sync"), check, analyse: (report, the job's exit code). The report is also
    saved as RUN/report.json."""
    from ddpdoctor.findings.watched import watched_report
    from ddpdoctor.launch.launcher import launch
    from ddpdoctor.launch.monitor import make_watcher
    from ddpdoctor.rundir.report import save_report

    steps = spec.options.get("steps", 5)
    if steps < 0:
        raise BadInput(f"--steps must be >= 0, not {steps}")
    # Watched like every launch: a check-sync run that hangs is reported with its culprit, not left hanging.
    result = launch(spec, watcher if watcher is not None else make_watcher(None, 600.0, "kill"))
    if not result.reports:
        from ddpdoctor.commands._common import finish_quietly

        finish_quietly(result)
    report = watched_report(spec.run_dir, "check-sync")
    sync_report(spec.run_dir, report)
    if result.exit_code:
        report.notes.append(f"the script failed (exit code {result.exit_code}); its ranks' output is in "
                            f"{spec.run_dir.root}/ranks/rankR/stderr.log")
    save_report(spec.run_dir, report)
    return report, result.exit_code


def check_sync(script: str, *script_args: str, nproc_per_node: int = 2, steps: int = 5, equivalence: bool = False,
               data_steps: int = 500,
               out: str | Path | None = None, torchrun: dict[str, Any] | None = None, quiet: bool = True) -> Report:
    """Run SCRIPT under `ddpdoctor check-sync` and return its Report (``.status``, ``.findings``, ``.to_json()``).

    For test suites::

        report = ddpdoctor.check_sync("train.py", "--epochs", "1", nproc_per_node=2)
        assert report.status == "ok", report.findings

    ``report.sections["job"]["exit_code"]`` is the script's own exit code. Raises BadInput for a bad script path."""
    from ddpdoctor.launch.launcher import LaunchSpec

    flags = {"--nproc-per-node": str(nproc_per_node), **(torchrun or {})}
    run_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="ddpdoctor-check-sync-"))
    spec = LaunchSpec(mode="check-sync", script=script, script_args=list(script_args), run_dir=RunDir(run_dir),
                      torchrun=flags, options={"steps": steps, "equivalence": equivalence, "data_steps": data_steps}, quiet=quiet)
    report, _ = run_check_sync(spec)
    return report
