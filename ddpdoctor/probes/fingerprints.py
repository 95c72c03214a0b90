"""check-sync's fingerprints: a few float64 numbers per tensor (never the tensor), and the module under watch (a
DDP module, or without DDP the optimizer's parameters) whose gradients, parameters and buffers they cover."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ddpdoctor.probes.records import EqualGroupDoc, SyncModuleDoc

SAMPLES = 4  # sampled elements per tensor, at fixed positions
_POSITIONS: dict[tuple[int, Any], torch.Tensor] = {}


def _positions(n: int, device: Any) -> torch.Tensor:
    key = (n, device)
    pos = _POSITIONS.get(key)
    if pos is None:
        pos = _POSITIONS[key] = torch.tensor([(k * (n - 1)) // (SAMPLES - 1) for k in range(SAMPLES)], device=device)
    return pos


def _table(flats: list[torch.Tensor]) -> list[list[float]]:
    """Fingerprint rows of same-device, same-dtype flat tensors with a few ops per tensor and one host copy."""
    sums = torch.stack([f.sum() for f in flats])
    squares = torch.stack([f.dot(f) for f in flats])
    samples = torch.stack([f.index_select(0, _positions(f.numel(), f.device)) for f in flats])
    numel = torch.tensor([float(f.numel()) for f in flats], dtype=torch.float64)
    # Sums accumulate in the tensor's own precision: converting every element to float64 first costs
    # 30x more, and determinism (not precision) is what a cross-rank comparison needs.
    body = torch.cat([sums[:, None], squares[:, None], samples], dim=1).to(torch.float64).cpu()
    return torch.cat([numel[:, None], body], dim=1).tolist()


def fingerprints(tensors: Sequence[torch.Tensor | None]) -> list[list[float] | None]:
    """Per tensor: [numel, sum, sum of squares, v_0 .. v_3] as float64 (v_k at position k*(n-1)//3), or None.

    O(elements) on the tensor's device and one host transfer per device and dtype for the whole list."""
    groups: dict[Any, list[tuple[int, torch.Tensor]]] = {}
    out: list[list[float] | None] = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if t is None:
            continue
        t = local(t)
        flat = t.detach().reshape(-1)
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.float()  # half, bfloat16, integer buffers
        if flat.numel() == 0:
            out[i] = [0.0] * (3 + SAMPLES)
            continue
        groups.setdefault((flat.device, flat.dtype), []).append((i, flat))
    for items in groups.values():
        for (i, _), row in zip(items, _table([f for _, f in items]), strict=True):
            out[i] = row
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard or replica (what this rank holds); any other tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) and hasattr(t, "placements") else t


def placement_map(params: list[Any]) -> tuple[list[EqualGroupDoc], list[int | None], list[str | None]]:
    """check-sync's one "must be equal across which ranks" map, from the placements (no DTensor: None).

    Per parameter: None, every rank must hold it equal (a plain tensor; the comparison check-sync always made);
    -1, nothing of it must be equal across ranks (sharded on every mesh dim: only its layout must agree);
    k >= 0, ``groups[k]``: this rank and the ranks that differ from it only along the mesh dims the parameter is
    ``Replicate()`` over (HSDP's replicate dim, TP's norm weights) must hold the same local tensor. ``layouts``:
    the global shape, mesh and placements, which must agree on every rank."""
    groups: list[EqualGroupDoc] = []
    index: dict[tuple[int, ...], int] = {}
    per_param: list[int | None] = []
    layouts: list[str | None] = []
    for p in params:
        mesh = getattr(p, "device_mesh", None)
        placements = getattr(p, "placements", None)
        if mesh is None or placements is None:
            per_param.append(None)
            layouts.append(None)
            continue
        names = list(getattr(mesh, "mesh_dim_names", None) or [f"dim{d}" for d in range(mesh.ndim)])
        layouts.append(f"{list(p.shape)} on ({', '.join(f'{n}={s}' for n, s in zip(names, mesh.shape, strict=False))})"
                       f" {', '.join(repr(pl) for pl in placements)}")
        over = [d for d, pl in enumerate(placements) if pl.is_replicate()]
        coord = mesh.get_coordinate()
        if not over or coord is None:
            per_param.append(-1)
            continue
        table = mesh.mesh
        pick = tuple(slice(None) if d in over else coord[d] for d in range(mesh.ndim))
        ranks = tuple(sorted(int(r) for r in table[pick].flatten().tolist()))
        if ranks not in index:
            index[ranks] = len(groups)
            groups.append({"ranks": list(ranks), "over": [names[d] for d in over]})
        per_param.append(index[ranks])
    return groups, per_param, layouts


class WatchedModule:
    """One DDP module under watch (or, without DDP, the optimizer's parameters: ``ddp`` is None)."""

    def __init__(self, index: int, ddp: Any, plain: list[tuple[str, Any]] | None = None,
                 plain_buffers: list[tuple[str, Any, bool]] | None = None) -> None:
        self.index = index
        self.ddp = ddp
        self.used = False  # a forward (or, without DDP, an optimizer step) ran in this iteration
        self.synced_forwards = 0
        self.unsynced_forwards = 0
        self.local_sums: list[Any] = []  # per backward, the sums of this rank's own gradients (before DDP's all-reduce)
        self.total_synced = 0  # synced forwards under grad since the start: the job's iteration count (probes/sync)
        self.last_forward_synced: bool | None = None
        self.buffers_done_step = -1
        self.buffers_synced_now: bool | None = None  # DDP broadcast the buffers before the current forward
        self.built_by: str | None = None
        self.buffers: list[Any] = []  # without DDP: the buffers fingerprinted at each step end (probes/sync)
        self.batchnorm_buffers: list[str] = []
        self.buffer_group: list[int | None] = []
        if ddp is None:
            self.param_names = [n for n, _ in plain or []]
            self.params = [p for _, p in plain or []]
            self.buffer_names = [n for n, _, _ in plain_buffers or []]
            self.buffers = [b for _, b, _ in plain_buffers or []]
            self.batchnorm_buffers = [n for n, _, bn in plain_buffers or [] if bn]
            # one map over parameters and buffers, so both index the same groups
            self.groups, group, layouts = placement_map(self.params + self.buffers)
            n = len(self.params)
            self.param_group, self.layouts, self.buffer_group = group[:n], layouts[:n], group[n:]
            self.ignored: list[str] = []
            self.frozen: list[str] = []
            return
        ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
        named = list(ddp.module.named_parameters())
        self.param_names = [n for n, p in named if p.requires_grad and n not in ignored]
        self.params = [p for n, p in named if p.requires_grad and n not in ignored]
        self.ignored = sorted(n for n, p in named if n in ignored)
        self.frozen = sorted(n for n, p in named if not p.requires_grad)
        self.buffer_names = [n for n, _ in ddp.module.named_buffers()]

    def describe(self) -> SyncModuleDoc:
        ddp = self.ddp
        if ddp is None:
            doc: SyncModuleDoc = {
                "index": self.index, "module_class": "optimizer parameters", "ddp": False,
                "params": self.param_names, "ignored_params": [], "frozen_params": [], "buffers": self.buffer_names,
                "batchnorm_buffers": self.batchnorm_buffers, "broadcast_buffers": False,
                "find_unused_parameters": False}
            if any(g is not None for g in self.param_group):  # DTensor parameters (FSDP2, HSDP, TP)
                doc["equal_groups"] = self.groups
                doc["param_equal_group"] = self.param_group
                doc["param_layouts"] = self.layouts
            if any(g is not None for g in self.buffer_group):  # DTensor buffers (rare): the same map
                doc["equal_groups"] = self.groups
                doc["buffer_equal_group"] = self.buffer_group
            return doc
        return {
            "index": self.index,
            "ddp": True,
            "module_class": type(ddp.module).__name__,
            "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", True)),
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "built_by": self.built_by,
            "params": self.param_names,
            "ignored_params": self.ignored,
            "frozen_params": self.frozen,
            "buffers": self.buffer_names,
            "batchnorm_buffers": [
                f"{mn}.{bn}" if mn else bn
                for mn, m in ddp.module.named_modules()
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                for bn, _ in m.named_buffers(recurse=False)
            ],
        }
