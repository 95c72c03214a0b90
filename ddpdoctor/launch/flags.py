"""torchrun's launch flags, taken from the installed torch's own parser, accepted by every launching command with
their meaning intact, and passed on."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.safe_io import write_atomic


@dataclass(frozen=True)
class TorchrunFlag:
    name: str  # dashed spelling, as torchrun documents it
    takes_value: bool
    short: str | None = None
    help: str = ""
    underscored: bool = True  # torchrun also accepts --a_b for --a-b

    @property
    def dest(self) -> str:
        return "tr_" + self.name.lstrip("-").replace("-", "_")


# Short help for the flags users reach for; the others get the first sentence of torchrun's own help.
HELP: dict[str, str] = {
    "--nnodes": "Number of nodes, or MIN:MAX for elastic jobs.",
    "--nproc-per-node": "Processes (ranks) per node: an int, gpu, cpu or auto.",
    "--node-rank": "Rank of this node (static rendezvous).",
    "--rdzv-backend": "Rendezvous backend (c10d, etcd, static).",
    "--rdzv-endpoint": "Rendezvous endpoint HOST:PORT.",
    "--rdzv-id": "Rendezvous (job) id.",
    "--rdzv-conf": "Extra rendezvous configuration, key=value,...",
    "--standalone": "Single-node job with a local c10d rendezvous on a free port.",
    "--max-restarts": "Restarts before the job fails.",
    "--monitor-interval": "Seconds between torchrun's worker checks.",
    "--start-method": "spawn, fork or forkserver.",
    "--role": "User-defined role of the workers.",
    "--master-addr": "Address of the rank-0 node (static rendezvous).",
    "--master-port": "Port on the rank-0 node (static rendezvous).",
    "--local-addr": "Address of this node.",
    "--log-dir": "Where torchrun keeps worker logs (default: inside the run directory).",
    "--redirects": "torchrun's --redirects (default: tee, see --tee).",
    "--tee": "torchrun's --tee (default 3: every stream to file and console).",
    "--local-ranks-filter": "Only show these local ranks' output on the console.",
    "--event-log-handler": "Name of a registered torchelastic event log handler.",
    "--duplicate-stdout-filters": "Also copy the ranks' stdout lines matching these filters to a file.",
    "--duplicate-stderr-filters": "Also copy the ranks' stderr lines matching these filters to a file.",
    "--module": "The script is a module name (python -m).",
    "--no-python": "Not supported: ddpdoctor must run Python to attach its probes.",
    "--run-path": "Run the script with runpy.run_path (the default).",
}

# Used only where torch cannot be imported (ddpdoctor's analysis commands do not need it): torchrun 2.13's flags.
FALLBACK_FLAGS: tuple[TorchrunFlag, ...] = tuple(
    TorchrunFlag(name, takes, short)
    for name, takes, short in (
        ("--nnodes", True, None), ("--nproc-per-node", True, None), ("--rdzv-backend", True, None),
        ("--rdzv-endpoint", True, None), ("--rdzv-id", True, None), ("--rdzv-conf", True, None),
        ("--standalone", False, None), ("--max-restarts", True, None), ("--monitor-interval", True, None),
        ("--start-method", True, None), ("--event-log-handler", True, None), ("--role", True, None),
        ("--module", False, "-m"), ("--no-python", False, None), ("--run-path", False, None),
        ("--log-dir", True, None), ("--redirects", True, "-r"), ("--tee", True, "-t"),
        ("--local-ranks-filter", True, None), ("--duplicate-stdout-filters", True, None),
        ("--duplicate-stderr-filters", True, None), ("--node-rank", True, None), ("--master-addr", True, None),
        ("--master-port", True, None), ("--local-addr", True, None), ("--logs-specs", True, None),
        ("--numa-binding", True, None), ("--signals-to-handle", True, None), ("--shutdown-timeout", True, None),
        ("--virtual-local-rank", False, None),
    )
)

# ddpdoctor runs the script itself (through its bootstrap), so these are not rendered back as flags.
NOT_PASSED = ("--module", "--run-path", "--no-python")


def flags_from_parser(parser: argparse.ArgumentParser) -> tuple[TorchrunFlag, ...]:
    """Every option of torchrun's argparse parser as a TorchrunFlag (positionals and --help left out)."""
    flags: list[TorchrunFlag] = []
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        # torchrun lists the dashed spelling first; older versions had only the underscore one for some flags.
        name = "--" + longs[0][2:].replace("_", "-")
        shorts = [s for s in action.option_strings if not s.startswith("--")]
        underscored = any("_" in s for s in longs) or "-" not in name[2:]
        text = HELP.get(name) or _first_sentence(action.help)
        flags.append(TorchrunFlag(name, action.nargs != 0, shorts[0] if shorts else None, text, underscored))
    return tuple(flags)


def _first_sentence(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return "torchrun's flag of this name."
    text = " ".join(text.split()).replace("%", "%%")
    for m in re.finditer(r"\. ", text):
        if not text[: m.start()].endswith(("e.g", "i.e", "etc")):
            return text[: m.start() + 1]
    return text


@functools.lru_cache(maxsize=1)
def torchrun_flags() -> tuple[TorchrunFlag, ...]:
    """The installed torch's torchrun flags (its own parser, so every flag of every torch version passes).

    Importing torch takes seconds, so the table is cached on disk, keyed by the installed torchrun's file
    (torch version, size, mtime); `--help` and every launch after the first read the cache."""
    key, cache = _cache_key(), _cache_file()
    if key and cache is not None:
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                return tuple(TorchrunFlag(**f) for f in data["flags"])
        except (OSError, ValueError, TypeError, KeyError):
            pass
    try:
        from torch.distributed.run import get_args_parser
    except Exception:  # noqa: BLE001 - no (or a broken) torch: the launch itself will say so
        return FALLBACK_FLAGS
    flags = flags_from_parser(get_args_parser())
    if key and cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache, json.dumps({"key": key, "flags": [dataclasses.asdict(f) for f in flags]}))
        except OSError:
            pass  # a read-only home: parse every time
    return flags


def _cache_key() -> str | None:
    """torch's version and its run.py's size and mtime, found without importing torch."""
    import importlib.metadata  # here, not at the top: `analyze` and `logs` never ask and it costs ~15 ms to import

    try:
        dist = importlib.metadata.distribution("torch")
        run_py = Path(str(dist.locate_file("torch/distributed/run.py")))
        st = run_py.stat()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    return f"{dist.version}|{run_py}|{st.st_size}|{st.st_mtime_ns}"


def _cache_file() -> Path | None:
    if os.environ.get("DDPDOCTOR_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ddpdoctor" / "torchrun-flags.json"


# A torchrun flag's value as given: its text (a flag that takes one), True (a switch), or a number (the Python API).
FlagValue = str | int | bool


# A boundary: click's keyword arguments for the whole command, whatever its other options are.
def pop_torchrun_values(kwargs: dict[str, Any]) -> dict[str, FlagValue]:
    """Take the torchrun flags out of a click kwargs dict (the command's keyword arguments, as click gives them:
    a boundary): {dashed name: value} for those given."""
    given: dict[str, FlagValue] = {}
    for flag in torchrun_flags():
        value = kwargs.pop(flag.dest, None)
        if value not in (None, False):
            given[flag.name] = value
    return given


def torchrun_argv(given: dict[str, FlagValue]) -> list[str]:
    """Render given flags back into torchrun's command line, in torchrun's own spelling."""
    known = {f.name: f for f in torchrun_flags()}
    argv: list[str] = []
    for name, value in given.items():
        if name in NOT_PASSED:
            continue
        flag = known.get(name)
        if flag is None or flag.takes_value:
            argv += [name, str(value)]
        elif value:
            argv.append(name)
    return argv
