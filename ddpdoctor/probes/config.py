"""The configuration a launcher hands to every rank's bootstrap, through one environment variable."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

ENV_VAR = "DDPDOCTOR_CONFIG"


class TuneTrial(TypedDict):
    """`ddpdoctor tune`'s trial: the DDP keyword arguments (and ``comm_hook``) it sets, and after how many steps
    every rank stops."""

    setting: dict[str, object]
    stop_after: int


class ProbeOptions(TypedDict, total=False):
    """The per-mode options a command puts in $DDPDOCTOR_CONFIG; each probe reads the ones of its mode."""

    mode: str  # the launch's mode, added by the bootstrap for the live watch
    debug: bool  # run
    nccl_debug: bool  # run, profile: NCCL_DEBUG=INFO and a topology dump per rank
    with_stack: bool  # profile
    run_to_completion: bool  # profile: go on after the profiled window
    steps: int  # check-sync: iterations to fingerprint (0: all, never stop)
    data_steps: int  # check-sync: further iterations the data recorder may run
    equivalence: bool  # check-sync --equivalence
    tune: TuneTrial  # a `tune` trial launch
    backend: str  # preflight ("auto", "nccl", "gloo")
    max_size: int | None  # preflight: the bandwidth sweep's largest message
    max_latency_us: float | None
    checkpoint_dir: str | None
    min_free_gb: float
    check_timeout: float


# `--active auto`: at least 5 recorded steps, at most 20 (traces grow with every step).
AUTO_MIN = 5
AUTO_CAP = 20


@dataclass
class Schedule:
    """torch.profiler's schedule: skip ``wait`` steps, warm up ``warmup``, record ``active``, ``repeat`` times.

    The default waits 2 steps because DDP builds its buckets in iteration 0 and rebuilds them after
    iteration 1, so the first steps are not what the job looks like."""

    wait: int = 2
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    # `--active auto`: ``active`` is the cap; recording stops earlier, on every rank at once, when at least
    # ``min_active`` steps are recorded and the step-time interval is within ±10% (probes/window.py).
    auto: bool = False
    min_active: int = 5

    @classmethod
    def parse_active(cls, value: str, wait: int = 2, warmup: int = 1, repeat: int = 1) -> Schedule:
        """``--active N`` or ``--active auto`` (the default: AUTO_CAP at most, AUTO_MIN at least)."""
        if str(value).strip().lower() == "auto":
            return cls(wait=wait, warmup=warmup, active=AUTO_CAP, repeat=repeat, auto=True, min_active=AUTO_MIN)
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"--active: expected a number of steps or 'auto', got {value!r}") from None
        return cls(wait=wait, warmup=warmup, active=n, repeat=repeat)

    def needed(self) -> int:
        """Iterations a script must run for a full window (auto: up to its minimum)."""
        return self.wait + self.warmup + (self.min_active if self.auto else self.active)

    def recorded_steps(self) -> list[int]:
        """The ProfilerStep numbers a run that lasts long enough records."""
        cycle = self.wait + self.warmup + self.active
        steps: list[int] = []
        for r in range(max(1, self.repeat)):
            first = r * cycle + self.wait + self.warmup
            steps.extend(range(first, first + self.active))
        return steps


@dataclass
class ProbeConfig:
    mode: str  # "profile", "run" or "check-sync"
    run_dir: str
    script: str
    script_args: list[str] = field(default_factory=list)
    as_module: bool = False
    schedule: Schedule = field(default_factory=Schedule)
    record_shapes: bool = True
    with_stack: bool = False
    monitor: str | None = None  # "host:port" of the launcher's heartbeat monitor
    options: dict[str, Any] = field(default_factory=dict)  # per-mode options (check-sync, run)

    def probe_options(self) -> ProbeOptions:
        """``options`` with its keys typed (it arrives as raw JSON from the launcher)."""
        return cast(ProbeOptions, self.options)

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ProbeConfig | None:
        raw = (environ if environ is not None else os.environ).get(ENV_VAR)
        if not raw:
            return None
        data = json.loads(raw)
        data["schedule"] = Schedule(**data.get("schedule", {}))
        return cls(**data)


def rank_from_env(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's variables, else SLURM's/MPI's, else a single process."""
    env = environ if environ is not None else os.environ
    for rank_k, world_k, local_k in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ):
        if rank_k in env and world_k in env:
            return int(env[rank_k]), int(env[world_k]), int(env.get(local_k, env[rank_k]))
    return 0, 1, 0
