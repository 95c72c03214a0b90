"""What every command shares: bad-input handling, output (terminal or --json), exit codes, launch options."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from ddpdoctor.commands._torchrun_options import torchrun_options
from ddpdoctor.errors import EXIT_BAD_INPUT, BadInput
from ddpdoctor.findings.model import Severity
from ddpdoctor.report import Report
from ddpdoctor.safe_io import iter_json
from ddpdoctor.terminal_text import one_line

SectionRenderer = Callable[[Report, Any, bool], None]


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input becomes one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BadInput as exc:
            click.echo(f"ddpdoctor: error: {one_line(str(exc))}", err=True)  # also a BadInput built by hand
            sys.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            click.echo("ddpdoctor: interrupted", err=True)
            sys.exit(130)

    return wrapper


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (docs/json.md).")(fn)


FAIL_ON_CHOICES = ("error", "warning", "none")


def fail_on_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The one --fail-on of every command: same choices, same default (docs/findings.md, exit codes)."""
    return click.option(
        "--fail-on",
        type=click.Choice(FAIL_ON_CHOICES),
        default="error",
        show_default=True,
        help="Exit 1 when a finding of this severity or worse is found (none: only a failed job or check exits 1). "
        "Warnings are performance advice: exit 0 unless --fail-on warning.",
    )(fn)


def examples(*lines: str) -> str:
    """A --help epilog of example command lines, kept as written (click rewraps paragraphs unless told not to)."""
    return "\b\nExamples:\n" + "\n".join("  " + line for line in lines)


def emit(
    report: Report,
    *,
    as_json: bool,
    verbose: bool = False,
    fail_on: str = "error",
    sections: SectionRenderer | None = None,
    exit_code: int | None = None,
) -> NoReturn:
    """Print the report and exit with the code its findings imply (or ``exit_code`` when it is worse)."""
    if as_json:
        # never NaN/Infinity or a lone surrogate (docs/json.md); written in pieces: a long run's report is 100s of MB
        for piece in iter_json(report.to_json()):
            click.echo(piece, nl=False)
        click.echo()
    else:
        from ddpdoctor.renderers.console import render
        from ddpdoctor.renderers.views import view_for

        render(report, sections=sections or view_for(report), verbose=verbose)
    code = 0 if fail_on == "none" else report.exit_code(Severity(fail_on))
    if exit_code:
        code = max(code, exit_code if exit_code in (1, 2) else 1)  # never a child's exit code (137, 143 ...)
    if report.stopped:
        code = int(report.stopped["exit_code"])  # ddpdoctor itself was stopped by a signal: 128+signal
    sys.exit(code)


def job_report_elsewhere(result: Any, *, as_json: bool, verbose: bool = False, fail_on: str = "error",
                         sections: SectionRenderer | None = None, command: str = "run") -> None:
    """A node of a multi-node job that is not the head: print the head's report of the whole job (the same
    document, plus which node this is) and exit with the job's code; when the head was lost, this node's own
    report (``head-lost``: what it knows), exit 1. Returns only when there is neither (the store was never
    reached): the caller then finishes quietly."""
    job = getattr(result, "job", None)
    if job is None:
        return
    doc = job.job_report()
    if not isinstance(doc, dict) and job.head_lost is None:
        return
    if result.note:
        click.echo(f"ddpdoctor: {result.note}", err=True)
    if not isinstance(doc, dict):
        # The head is gone: this node reports what it knows (its own ranks, the head's last verdict), exit 1.
        from ddpdoctor.reports.head_lost import assemble

        emit(assemble(command, job.head_lost, job.node_info()), as_json=as_json, verbose=verbose, fail_on=fail_on,
             sections=sections, exit_code=job.head_lost.exit_code)
    from ddpdoctor.reports.sections import load_report

    # The head's document, typed again (so this node renders the head's view of it), with this node's ``node``.
    report = load_report({**doc, "node": job.node_info().to_json()})
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=sections,
         exit_code=1 if result.exit_code else None)


def node_of(result: Any) -> Any:
    """Which node of a multi-node launch this is (job/role.NodeInfo), None for a job of one node: an input of the
    command's report assembly."""
    job = getattr(result, "job", None)
    return job.node_info() if job is not None else None


def share_job_report(result: Any, report: Report) -> None:
    """The head of a multi-node job: hand its report (with the head's ``node``) to every node."""
    job = getattr(result, "job", None)
    if job is None:
        return
    job.publish_report(report.to_json())


def finish_quietly(result: Any) -> NoReturn:
    """Under --launcher none every rank runs ddpdoctor; only rank 0 reports, the others exit with their rank's code."""
    if getattr(result, "note", None):  # a node of a multi-node job: the head's verdict, and where its report is
        click.echo(f"ddpdoctor: {result.note}", err=True)
    else:
        click.echo(f"ddpdoctor: this rank is done (exit {result.exit_code}); rank 0 reports on {result.run_dir.root}",
                   err=True)
    if result.signum:
        sys.exit(128 + result.signum)
    sys.exit(1 if result.exit_code else 0)  # 0/1, never the rank's own code


def default_run_dir(name: str | None) -> Path:
    """ddpdoctor-runs/<name>; without a name, the SLURM job/step when there is one, else a timestamp."""
    if not name:
        job = os.environ.get("SLURM_JOB_ID")
        name = f"slurm-{job}.{os.environ.get('SLURM_STEP_ID', '0')}" if job else time.strftime("%Y%m%d-%H%M%S")
    return Path("ddpdoctor-runs") / name


# kwargs: click's parsed options of the command, as click hands them over (a boundary: the user's own flags)
def pop_launch_spec(mode: str, kwargs: dict[str, Any], *, as_json: bool, **fields: Any) -> Any:
    """The LaunchSpec of a launching command, from the click arguments `launch_options` added (taken out of
    ``kwargs``); ``fields`` are the command's own (schedule, options, env)."""
    from ddpdoctor.launch.flags import pop_torchrun_values
    from ddpdoctor.launch.launcher import LaunchSpec
    from ddpdoctor.rundir.layout import RunDir

    out, name = kwargs.pop("out"), kwargs.pop("name")
    return LaunchSpec(
        mode=mode,
        script=kwargs.pop("script"),
        script_args=list(kwargs.pop("script_args")),
        run_dir=RunDir(out or default_run_dir(name)),
        launcher=kwargs.pop("launcher"),
        quiet=kwargs.pop("quiet"),
        overwrite=kwargs.pop("overwrite"),
        output_to_stderr=as_json,
        torchrun=pop_torchrun_values(kwargs),
        **fields,
    )


def launch_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options of every command that launches a job: torchrun's flags plus where the run directory goes."""
    fn = click.argument("script_args", nargs=-1, type=click.UNPROCESSED)(fn)
    fn = click.argument("script")(fn)
    fn = click.option("--quiet", "-q", is_flag=True, help="Do not echo the ranks' output.")(fn)
    fn = overwrite_option(fn)
    fn = click.option(
        "--launcher",
        type=click.Choice(["torchrun", "none"]),
        default="torchrun",
        show_default=True,
        help="none: the scheduler (srun, mpirun) already started one process per rank.",
    )(fn)
    return torchrun_options(run_dir_options(fn))


def overwrite_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--overwrite", is_flag=True, help="Replace an earlier run in the same run directory.")(fn)


def run_dir_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--out and --name: where a launching command's run directory goes."""
    fn = click.option("--name", default=None, help="Run name: the run directory is ddpdoctor-runs/NAME.")(fn)
    return click.option("--out", "out", type=click.Path(path_type=Path), default=None, help="Run directory.")(fn)


LAUNCH_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}
