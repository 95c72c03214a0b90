"""Which ranks read the same data, from the job's parallelism record (rundir Parallelism): ranks that differ only
along a model-parallel mesh dim (a DTensor/TP dim that no FSDP unit shards or replicates over) are one
data-parallel rank; check-sync's sampler checks compare one rank of each such group."""

from __future__ import annotations

from itertools import product

from ddpdoctor.rundir.schema import MeshInfo, Parallelism


def _model_parallel_dims(p: Parallelism) -> dict[int, set[int]]:
    """mesh index -> the dims of that mesh that split the model, not the data."""
    dp_names = {n for u in p.fsdp2_units for n in (u.shard_dim, u.replicate_dim) if n}
    out: dict[int, set[int]] = {}
    for d in p.dtensor_params:
        if d.mesh is None or d.mesh >= len(p.meshes):
            continue
        mesh = p.meshes[d.mesh]
        names = mesh.dim_names or [f"dim{i}" for i in range(len(mesh.shape))]
        out.setdefault(d.mesh, set()).update(i for i, n in enumerate(names) if n not in dp_names)
    return {m: dims for m, dims in out.items() if dims}


def data_groups(p: Parallelism | None) -> list[list[int]] | None:
    """The groups of ranks that read the same data (each sorted, the groups by their lowest rank), or None when
    every rank is its own data-parallel rank (no model-parallel dim recorded, or a mesh without its rank table)."""
    if p is None:
        return None
    mp = _model_parallel_dims(p)
    if not mp:
        return None
    m, dims = next(iter(sorted(mp.items())))
    mesh: MeshInfo = p.meshes[m]
    if not mesh.ranks or len(mesh.ranks) != _size(mesh.shape):
        return None
    strides = [_size(mesh.shape[i + 1:]) for i in range(len(mesh.shape))]
    keep = [i for i in range(len(mesh.shape)) if i not in dims]
    groups: list[list[int]] = []
    for outer in product(*(range(mesh.shape[i]) for i in keep)):
        fixed = dict(zip(keep, outer, strict=True))
        members = []
        for inner in product(*(range(mesh.shape[i]) for i in sorted(dims))):
            coord = {**fixed, **dict(zip(sorted(dims), inner, strict=True))}
            members.append(mesh.ranks[sum(coord[i] * strides[i] for i in range(len(mesh.shape)))])
        groups.append(sorted(members))
    return sorted(groups)


def _size(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
