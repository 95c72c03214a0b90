"""The `ddpdoctor` command line: one click group; each command lives in ddpdoctor/commands/<name>.py.

Commands load lazily so that `ddpdoctor topo` or `ddpdoctor logs` never pay for importing torch."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("ddpdoctor.commands.profile", "Launch a DDP script like torchrun, profile a few steps on every rank, report."),
    "run": ("ddpdoctor.commands.run", "Launch a DDP script like torchrun under hang and crash watch, without profiling."),
    "analyze": ("ddpdoctor.commands.analyze", "Analyse a run directory or PyTorch profiler traces (GPU or CPU)."),
    "diff": ("ddpdoctor.commands.diff", "Compare two runs: which part of the step changed, on which rank, beyond noise."),
    "check-sync": ("ddpdoctor.commands.check_sync", "Check that gradients, parameters, buffers and data shards agree across ranks."),
    "logs": ("ddpdoctor.commands.logs", "Explain logs of a job that ran without ddpdoctor (hangs, crashes, mismatches)."),
    "topo": ("ddpdoctor.commands.topo", "Read NCCL_DEBUG=INFO output and topology dumps; flag a misconfigured fabric."),
    "status": ("ddpdoctor.commands.status", "Live state of a job under `ddpdoctor run`: steps/s, slowest ranks, alerts."),
    "capture": ("ddpdoctor.commands.capture", "Profile N iterations of a running job, or dump its stacks, without a restart."),
    "preflight": ("ddpdoctor.commands.preflight", "Check the cluster and the job's environment before a big run."),
    "tune": ("ddpdoctor.commands.tune", "Try variants of DDP's options for real (A/B launches) and report the measured gain."),
}


class OneLineUsage(click.ClickException):
    """A command line click refuses (an unknown option, a count out of range): one line and exit 2, like every
    other bad input, not click's three-line usage block."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        from ddpdoctor.terminal_text import one_line

        click.echo(f"ddpdoctor: error: {one_line(self.format_message())}", err=True)


def _one_line(exc: click.UsageError) -> OneLineUsage:
    ctx = exc.ctx
    where = ctx.command_path if ctx is not None else "ddpdoctor"
    return OneLineUsage(f"{exc.format_message()} (`{where} --help` lists the options)")


class LazyGroup(click.Group):
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # a command's own options, parsed as it is invoked
            raise _one_line(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or importlib.util.find_spec(entry[0]) is None:
            return None
        module = importlib.import_module(entry[0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=(
    "\b\nExamples:\n"
    "  ddpdoctor profile --nproc-per-node 2 train.py      # why is it slow?\n"
    "  ddpdoctor run --nproc-per-node 2 train.py          # why does it hang or crash?\n"
    "  ddpdoctor check-sync --nproc-per-node 2 train.py   # do the ranks agree?\n"
    "  ddpdoctor logs slurm-12345.out                     # explain a job that ran without ddpdoctor\n"
    "  ddpdoctor COMMAND --help                           # each command's options and examples"))
@click.version_option(package_name="ddpdoctor", prog_name="ddpdoctor")
def main() -> None:
    """ddpdoctor: find out why a PyTorch DDP job is slow, hangs or trains wrong, without changing its code.

    Exit codes: 0 nothing wrong (warnings are advice: exit 0 unless --fail-on warning), 1 an error finding or the
    job failed, 2 bad input, 128+N when ddpdoctor itself was stopped by signal N."""
