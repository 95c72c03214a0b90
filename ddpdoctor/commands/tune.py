"""`ddpdoctor tune`: launch the script with variants of DDP's options or FSDP2's knobs (no code change), measure
each against the script's own settings in interleaved short launches, and report which one is faster, by how much,
with intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import (
    LAUNCH_CONTEXT,
    cli_errors,
    emit,
    examples,
    fail_on_option,
    json_option,
    launch_options,
    pop_launch_spec,
)
from ddpdoctor.commands._watch import watch_options
from ddpdoctor.errors import BadInput


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__, epilog=examples(
    "ddpdoctor tune --nproc-per-node 2 train.py --epochs 1",
    "ddpdoctor tune --nproc-per-node 8 --try 'bucket_cap_mb=50,100' --try gradient_as_bucket_view=True train.py",
    "ddpdoctor tune --nproc-per-node 8 --gpus-total 512 --rounds 4 --json train.py > tune.json",
))
@launch_options
@watch_options
@click.option("--try", "tries", multiple=True, metavar="OPTION=V[,V...]",
              help="Also measure these settings, one variant per value: bucket_cap_mb, gradient_as_bucket_view, "
              "static_graph, find_unused_parameters, comm_hook (fp16, bf16); on FSDP2: forward_prefetch, backward_prefetch "
              "(units ahead), reshard_after_forward. Repeatable.")
@click.option("--rounds", default=2, show_default=True,
              help="Launches of each variant, each between two baseline launches (A B A C A | C A B A).")
@click.option("--warmup", default=5, show_default=True,
              help="Iterations of each launch left out (DDP rebuilds its buckets after iteration 1).")
@click.option("--steps", default=20, show_default=True, help="Iterations measured in each launch, after --warmup.")
@click.option("--max-variants", default=4, show_default=True,
              help="At most this many variants (--try first); 2 x rounds x variants + 1 launches in all.")
@click.option("--no-auto", is_flag=True, help="Measure only the --try settings, none chosen by the rules.")
@click.option("--gpus-total", type=int, default=None,
              help="GPUs of the real job: the report gives a gain in GPU-hours per day at that size.")
@click.option("--loss-tolerance", type=float, default=None,
              help="Relative loss difference above which a variant changes numerics [default: 1e-4].")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write the HTML report here (RUN/report.html is always written).")
@json_option
@fail_on_option
@cli_errors
def command(tries: tuple[str, ...], rounds: int, warmup: int, steps: int, max_variants: int, no_auto: bool,
            gpus_total: int | None, loss_tolerance: float | None, html_path: Path | None, as_json: bool,
            fail_on: str, **kwargs: Any) -> None:
    from ddpdoctor.analyses.tune import FSDP_OPTIONS, LOSS_REL_TOL, Setting
    from ddpdoctor.commands import tune_trials
    from ddpdoctor.findings.tune import fsdp_plan, parse_try, plan
    from ddpdoctor.launch.monitor import make_watcher
    from ddpdoctor.launch.user_files import MAX_DEPTH, FolderGuard
    from ddpdoctor.renderers import progress
    from ddpdoctor.renderers.outputs import write_outputs
    from ddpdoctor.renderers.tensorboard_tune import write_tune_scalars
    from ddpdoctor.reports.tune import ScriptHashes, TuneDesign, assemble
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.report import save_report

    watch = (kwargs.pop("hang_timeout"), kwargs.pop("startup_timeout"), kwargs.pop("on_hang"))
    kwargs.pop("on_divergence", None)  # tune's trials are short launches of one script: divergence is run's
    make_watcher(*watch)  # a bad timeout is bad input before anything runs
    settings: list[Setting] = []
    for t in tries:
        try:
            settings.extend(parse_try(t))
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    if rounds < 1 or warmup < 3 or steps < 3 or max_variants < 1:
        raise BadInput("--rounds and --max-variants must be >= 1, --warmup and --steps >= 3")
    if no_auto and not settings:
        raise BadInput("--no-auto measures only the --try settings: give at least one --try")
    tolerance = LOSS_REL_TOL if loss_tolerance is None else loss_tolerance
    if not tolerance > 0:
        raise BadInput(f"--loss-tolerance must be positive, not {tolerance}")
    if gpus_total is not None and gpus_total < 1:
        raise BadInput(f"--gpus-total must be >= 1, not {gpus_total}")
    spec = pop_launch_spec("tune", kwargs, as_json=as_json)
    if spec.launcher != "torchrun":
        raise BadInput("tune launches the job several times: run it with torchrun's flags, not --launcher none")
    if str(spec.torchrun.get("--nnodes") or "1") not in ("1", "1:1"):
        raise BadInput("tune runs on one node (its trials are launched one after another by this process); "
                       "tune on one node, then use the setting on many")
    root = spec.run_dir.root
    tune_trials.prepare_root(root, spec.overwrite)
    script = Path(spec.script)
    before = tune_trials.file_sha256(script) if not spec.as_module else None
    show = progress.enabled(as_json)
    # The launches write in their own place: what the script changes in its folder or the working directory (a
    # checkpoint it resumes from and saves) is put back after each launch (launch/user_files.py).
    # The script's folder a few levels deep; the working directory's own files (relative paths land there).
    folders = [(Path.cwd(), 1)] + ([] if spec.as_module else [(script.resolve().parent, MAX_DEPTH)])
    guard = FolderGuard(folders, skip=[root], keep=root / ".user-files")
    guard.snapshot()
    experiment = tune_trials.Experiment(spec, root, watch, warmup, steps, show, guard)
    try:
        prep = experiment.profile([float(s["bucket_cap_mb"]) for s in settings if "bucket_cap_mb" in s])
        fsdp_tries = [t for t in settings if any(k in FSDP_OPTIONS for k in t)]
        if prep.fsdp_units:
            if len(fsdp_tries) != len(settings):
                raise BadInput("the script built FSDP2: --try takes FSDP2's knobs (forward_prefetch, "
                               "backward_prefetch, reshard_after_forward), not DDP's options")
            the_plan = fsdp_plan(prep.fsdp_units, settings, max_variants)
        elif fsdp_tries:
            raise BadInput("the script built DistributedDataParallel: --try takes DDP's options, not FSDP2's knobs")
        else:
            the_plan = plan(prep.cfg, prep.whatif, prep.flag_ids, prep.grad_counts, settings, max_variants)
        if no_auto:
            the_plan.candidates = [c for c in the_plan.candidates if c.source == "--try"]
        chosen = {c.label: c.setting for c in the_plan.chosen}
        trials = experiment.run(chosen, rounds)
    except tune_trials.JobFailed as exc:
        click.echo(f"ddpdoctor: {exc}", err=True)
        raise SystemExit(1) from None
    except tune_trials.Stopped as exc:
        click.echo(f"ddpdoctor: stopped by signal {exc.signum}; the launches so far are in {root}", err=True)
        raise SystemExit(128 + exc.signum) from None
    finally:
        guard.drop()
    after = tune_trials.file_sha256(script) if not spec.as_module else None
    report = assemble(trials, the_plan, prep, design=TuneDesign(
        warmup=warmup, steps=steps, rounds=rounds, profile_run=str(root / "profile"), trials_dir=str(root / "trials"),
    ), script=ScriptHashes(path=spec.script, sha256_before=before, sha256_after=after), tolerance=tolerance,
        gpus_total=gpus_total)
    run = RunDir(root)
    save_report(run, report)
    write_outputs(report, root, html_path, None, [], show_progress=False)
    write_tune_scalars(trials, root / "scalars")
    emit(report, as_json=as_json, fail_on=fail_on)
