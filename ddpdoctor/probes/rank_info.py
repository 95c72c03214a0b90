"""What a rank knows about itself: host, process, versions, the launch environment and its process group."""

from __future__ import annotations

import os
import socket

import torch

from ddpdoctor.probes.records import ProcessGroupDoc, RankInfoDoc, Versions

ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MASTER_", "TORCHELASTIC_")


def versions() -> Versions:
    nccl = None
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - NCCL is absent from CPU builds
        nccl = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def launch_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = environ if environ is not None else os.environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) and k != "TORCHELASTIC_ERROR_FILE"}


def process_group_info() -> ProcessGroupDoc | None:
    """The default process group as this rank sees it, or None when there is none (yet)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    info: ProcessGroupDoc = {"backend": str(dist.get_backend()), "world_size": dist.get_world_size()}
    try:
        world = dist.distributed_c10d._world
        info["groups"] = [
            {"name": world.pg_names.get(pg, "?"), "ranks": sorted(ranks.keys()) if isinstance(ranks, dict) else list(ranks)}
            for pg, ranks in world.pg_group_ranks.items()
        ]
    except Exception:  # noqa: BLE001 - private API; optional detail
        pass
    return info


def basic(rank: int, world_size: int, local_rank: int) -> RankInfoDoc:
    return {
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        # how many cores this rank may run on, and how many ranks share its host: a host with fewer cores than
        # ranks (plus their launcher) delays whichever rank the OS puts aside (findings/perf_balance.py)
        "host_cpus": _usable_cpus(),
        "local_world_size": _int_env("LOCAL_WORLD_SIZE"),
        "versions": versions(),
        "env": launch_env(),
    }


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
