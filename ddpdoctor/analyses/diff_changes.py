"""`diff`'s "what else changed": the recorded environment and configuration of two runs, compared fact by fact, each
difference tagged with the parts of the step it could plausibly move (docs/diff.md). Pure; no causation claimed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpdoctor.jsontypes import JsonObject

if TYPE_CHECKING:
    from ddpdoctor.rundir.schema import Manifest

# Variables that change on every launch and mean nothing for speed (ports, run ids, torchrun's bookkeeping).
VOLATILE_ENV = ("MASTER_PORT", "MASTER_ADDR", "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING_PID")
VOLATILE_FLAGS = ("master_port", "rdzv_endpoint", "rdzv_id", "master_addr", "node_rank")

ALL = ["compute", "exposed_comm", "data_wait", "idle", "forward", "backward", "optimizer", "data"]
COMM = ["exposed_comm", "comm_wait", "comm_transfer", "backward", "optimizer", "collectives"]
HOST = ["compute", "idle", "data_wait", "data", "forward", "backward", "optimizer"]
DDP = ["exposed_comm", "backward", "optimizer", "buckets", "collectives"]


def explains(key: str) -> list[str]:
    """The parts of the step a change of this fact could move (a map, not a proof)."""
    if key.startswith(("env.NCCL_", "env.GLOO_", "topology.")) or key in ("world_size", "nodes", "backend"):
        return COMM
    if key.startswith("ddp."):
        return DDP
    if key.startswith(("host.", "env.OMP_", "env.CUDA_VISIBLE")):
        return HOST
    return ALL  # versions, the script, its arguments, TORCH_* variables, the schedule


@dataclass(frozen=True)
class ConfigChange:
    key: str  # e.g. "env.NCCL_ALGO", "ddp.bucket_cap_mb", "versions.torch", "script.sha256"
    base: Any
    new: Any
    explains: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {"key": self.key, "base": self.base, "new": self.new, "explains": list(self.explains)}


# The fabric facts of a run profiled with --nccl-debug (its report's topology.summary, docs/topo.md) compared by diff.
TOPOLOGY_FACTS = ("nodes", "gpus_per_node", "intra_node_transport", "inter_node_transport", "network", "gdr",
                  "nvlink", "nccl_versions", "coll_channels", "rings", "nvls_channels")


def facts(m: Manifest | None, topology: Mapping[str, Any] | None = None) -> JsonObject:
    """A run's manifest (and, when recorded, its NCCL topology summary) as flat facts (key -> JSON value). Empty for
    bare traces (nothing recorded)."""
    out: JsonObject = {}
    for k in TOPOLOGY_FACTS:
        v = (topology or {}).get(k)
        if isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v):
            v = ", ".join(map(str, v))
        if isinstance(v, (str, int, float, bool)):
            out[f"topology.{k}"] = v
    if m is None:
        return out
    for k, v in (m.versions or {}).items():
        if k in ("torch", "cuda", "nccl"):
            out[f"versions.{k}"] = v
    out["versions.ddpdoctor"] = m.ddpdoctor_version
    for k, v in (m.env or {}).items():
        if not k.startswith(VOLATILE_ENV):
            out[f"env.{k}"] = v
    out["world_size"] = m.world_size
    out["nodes"] = len(m.hosts) if m.hosts else None
    out["backend"] = m.backend
    out["script.path"] = m.script
    out["script.sha256"] = m.script_sha256
    out["script.args"] = " ".join(m.script_args)
    for k, v in (m.torchrun_flags or {}).items():
        if k not in VOLATILE_FLAGS:
            out[f"torchrun.{k}"] = v
    if m.schedule is not None:
        out["schedule.active"] = m.schedule.active
    per_node = [r.local_world_size for r in m.ranks if r.local_world_size]
    out["topology.ranks_per_node"] = max(per_node) if per_node else None
    out["topology.gpus_per_host"] = (m.versions or {}).get("device_count") or None
    cpus = [r.host_cpus for r in m.ranks if r.host_cpus]
    out["host.cores_per_rank_host"] = min(cpus) if cpus else None
    out["host.load_1min"] = m.host_load
    mods = {r: ms for r, ms in m.ddp_modules.items() if ms}
    if mods:
        first = mods[min(mods)][0]
        for k in ("bucket_cap_mb", "find_unused_parameters", "static_graph", "gradient_as_bucket_view",
                  "broadcast_buffers", "parameter_count", "parameter_bytes"):
            out[f"ddp.{k}"] = getattr(first, k)
        out["ddp.buckets"] = len(first.buckets) if first.buckets else None
    return {k: v for k, v in out.items() if v not in (None, "", [], {})}


def config_changes(base: Mapping[str, Any], new: Mapping[str, Any]) -> list[ConfigChange]:
    """Every fact recorded on either side whose value differs (a fact missing on one side shows as null there).
    Host load is compared only when it moved by at least one core's worth (1.0): the load average always moves."""
    out = []
    for key in sorted(set(base) | set(new)):
        b, n = base.get(key), new.get(key)
        if b == n:
            continue
        if key == "host.load_1min" and isinstance(b, (int, float)) and isinstance(n, (int, float)) \
                and abs(n - b) < 1.0:
            continue
        out.append(ConfigChange(key, b, n, tuple(explains(key))))
    return out
