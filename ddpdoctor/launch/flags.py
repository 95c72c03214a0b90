"""torchrun's launch flags, accepted by every launching command with their meaning intact, and passed on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class TorchrunFlag:
    name: str  # dashed spelling, as torchrun documents it
    takes_value: bool
    short: str | None = None
    help: str = ""

    @property
    def dest(self) -> str:
        return "tr_" + self.name.lstrip("-").replace("-", "_")


# Everything torchrun 2.4-2.13 accepts except the ones ddpdoctor sets itself (see LaunchSpec).
TORCHRUN_FLAGS: tuple[TorchrunFlag, ...] = (
    TorchrunFlag("--nnodes", True, help="Number of nodes, or MIN:MAX for elastic jobs."),
    TorchrunFlag("--nproc-per-node", True, help="Processes (ranks) per node: an int, gpu, cpu or auto."),
    TorchrunFlag("--node-rank", True, help="Rank of this node (static rendezvous)."),
    TorchrunFlag("--rdzv-backend", True, help="Rendezvous backend (c10d, etcd, static)."),
    TorchrunFlag("--rdzv-endpoint", True, help="Rendezvous endpoint HOST:PORT."),
    TorchrunFlag("--rdzv-id", True, help="Rendezvous (job) id."),
    TorchrunFlag("--rdzv-conf", True, help="Extra rendezvous configuration, key=value,..."),
    TorchrunFlag("--standalone", False, help="Single-node job with a local c10d rendezvous on a free port."),
    TorchrunFlag("--max-restarts", True, help="Restarts before the job fails."),
    TorchrunFlag("--monitor-interval", True, help="Seconds between torchrun's worker checks."),
    TorchrunFlag("--start-method", True, help="spawn, fork or forkserver."),
    TorchrunFlag("--role", True, help="User-defined role of the workers."),
    TorchrunFlag("--master-addr", True, help="Address of the rank-0 node (static rendezvous)."),
    TorchrunFlag("--master-port", True, help="Port on the rank-0 node (static rendezvous)."),
    TorchrunFlag("--local-addr", True, help="Address of this node."),
    TorchrunFlag("--log-dir", True, help="Where torchrun keeps worker logs (default: inside the run directory)."),
    TorchrunFlag("--redirects", True, short="-r", help="torchrun's --redirects (default: tee, see --tee)."),
    TorchrunFlag("--tee", True, short="-t", help="torchrun's --tee (default 3: every stream to file and console)."),
    TorchrunFlag("--local-ranks-filter", True, help="Only show these local ranks' output on the console."),
    TorchrunFlag("--numa-binding", True, help="torchrun's NUMA binding mode."),
    TorchrunFlag("--signals-to-handle", True, help="Signals torchrun forwards to workers."),
    TorchrunFlag("--shutdown-timeout", True, help="Seconds between SIGTERM and SIGKILL for workers."),
    TorchrunFlag("--event-log-handler", True, help="torchrun's event log handler."),
    TorchrunFlag("--module", False, short="-m", help="The script is a module name (python -m)."),
    TorchrunFlag("--no-python", False, help="Not supported: ddpdoctor must run Python to attach its probes."),
    TorchrunFlag("--run-path", False, help="Run the script with runpy.run_path (the default)."),
)


def torchrun_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with every torchrun flag (dashed and underscore spellings)."""
    for flag in reversed(TORCHRUN_FLAGS):
        underscored = "--" + flag.name[2:].replace("-", "_")
        decls = [flag.name] + ([underscored] if underscored != flag.name else [])
        if flag.short:
            decls.insert(0, flag.short)
        decls.append(flag.dest)
        if flag.takes_value:
            fn = click.option(*decls, default=None, help=flag.help, show_default=False)(fn)
        else:
            fn = click.option(*decls, is_flag=True, default=False, help=flag.help)(fn)
    return fn


def pop_torchrun_values(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the torchrun flags out of a click kwargs dict: {dashed name: value} for those given."""
    given: dict[str, Any] = {}
    for flag in TORCHRUN_FLAGS:
        value = kwargs.pop(flag.dest, None)
        if value not in (None, False):
            given[flag.name] = value
    return given


def torchrun_argv(given: dict[str, Any]) -> list[str]:
    """Render given flags back into torchrun's command line, in torchrun's own spelling."""
    argv: list[str] = []
    for flag in TORCHRUN_FLAGS:
        if flag.name not in given or flag.name in ("--module", "--run-path", "--no-python"):
            continue
        if flag.takes_value:
            argv += [flag.name, str(given[flag.name])]
        else:
            argv.append(flag.name)
    return argv
