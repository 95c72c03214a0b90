"""Which node of which job this launcher is: node count, node rank, the job's master endpoint (as torchrun finds it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class JobRole:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    rdzv_id: str = ""

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0

    @property
    def key(self) -> str:
        """The job's identity: nodes of one job agree on it; another job sharing the --out does not."""
        return f"{self.master_addr}:{self.master_port}/{self.nnodes}/{self.rdzv_id}"


class NodeInfoDoc(TypedDict):
    """Which node of the job a report comes from (the report's ``node``)."""

    node_rank: int
    nnodes: int
    host: str
    is_head: bool
    head: str | None


@dataclass(frozen=True)
class NodeInfo:
    """Which node printed a report of a multi-node job (the report's ``node`` key, docs/json.md)."""

    node_rank: int
    nnodes: int
    host: str
    is_head: bool
    head: str | None  # the head node's host name (None while this node has not heard from it)

    def to_json(self) -> NodeInfoDoc:
        return {"node_rank": self.node_rank, "nnodes": self.nnodes, "host": self.host, "is_head": self.is_head,
                "head": self.head}


def _max_nodes(value: Any) -> int:
    text = str(value or "1")
    try:
        return int(text.split(":")[-1])
    except ValueError:
        return 1


def job_role(torchrun: Mapping[str, str | int | bool], launcher: str = "torchrun",
             scheduler_env: dict[str, str] | None = None) -> JobRole | None:
    """The role of a multi-node torchrun launch (--nnodes > 1), None for a single-node one.

    The endpoint is torchrun's: --rdzv-endpoint HOST[:PORT], else --master-addr/--master-port (29500). The node rank is
    --node-rank, else $NODE_RANK or $SLURM_NODEID (as a cluster script passes it). Under --launcher none every rank
    is its own launcher: a "node" of one rank, node rank = RANK, the head is rank 0 (``scheduler_env``: the
    launcher's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)."""
    if launcher == "none":
        env = scheduler_env or {}
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        port = str(env.get("MASTER_PORT") or os.environ.get("MASTER_PORT") or DEFAULT_MASTER_PORT)
        return JobRole(world, int(env.get("RANK", "0")), str(env.get("MASTER_ADDR") or os.environ.get("MASTER_ADDR")
                       or "127.0.0.1"), int(port) if port.isdigit() else DEFAULT_MASTER_PORT,
                       os.environ.get("SLURM_JOB_ID", ""))
    if launcher != "torchrun":
        return None
    nnodes = _max_nodes(torchrun.get("--nnodes"))
    if nnodes <= 1:
        return None
    endpoint = torchrun.get("--rdzv-endpoint")
    if endpoint:
        host, _, port = str(endpoint).rpartition(":") if ":" in str(endpoint) else (str(endpoint), "", "")
        addr, mport = host.strip("[]"), int(port) if port.isdigit() else DEFAULT_MASTER_PORT
    else:
        addr = str(torchrun.get("--master-addr") or os.environ.get("MASTER_ADDR") or "127.0.0.1")
        p = str(torchrun.get("--master-port") or os.environ.get("MASTER_PORT") or DEFAULT_MASTER_PORT)
        mport = int(p) if p.isdigit() else DEFAULT_MASTER_PORT
    nr = torchrun.get("--node-rank") or os.environ.get("NODE_RANK") or os.environ.get("SLURM_NODEID") or "0"
    return JobRole(nnodes, int(nr) if str(nr).isdigit() else 0, addr, mport, str(torchrun.get("--rdzv-id") or ""))
