"""Records what data and tensor parallelism each rank built: DDP, FSDP2 units with their mesh (1-D or HSDP 2-D),
FSDP1, DTensor meshes and placements (info.json's ``parallelism``), without a change to the script.

FSDP2 is seen where every `fully_shard` call passes: ``FSDPState.init`` (one per call, whatever name the script
imported `fully_shard` under); FSDP1 at ``FullyShardedDataParallel.__init__``; tensor parallelism at
``parallelize_module``. Those modules are patched only once the script imports them (a post-import hook), so a
DDP job pays no import of FSDP or DTensor. The units are described lazily (at step 3 and at the end), when FSDP has
named them (its lazy init runs at the first forward): nothing runs per step."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import weakref
from collections.abc import Callable
from typing import Any

from ddpdoctor.probes.records import (
    DTensorParamDoc,
    FSDP1ModuleDoc,
    FSDPUnitDoc,
    MeshDoc,
    ParallelismDoc,
)

# The module FSDPState lives in, per torch version (2.6+ public path first; 2.4-2.5 the composable one).
FSDP2_STATE_MODULES = ("torch.distributed.fsdp._fully_shard._fsdp_state",
                       "torch.distributed._composable.fsdp._fsdp_state")
FSDP1_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"
TP_MODULE = "torch.distributed.tensor.parallel.api"
MAX_MESH_RANKS = 4096  # a mesh's rank table is recorded up to this size (check-sync's groups read it)
MAX_DTENSOR_PARAMS = 256  # tensor-parallel parameters listed per rank (the count is always complete)
MAX_UNIT_PARAM_NAMES = 64


class _PostImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` right after one of ``names`` is executed by an import (torch's own or the
    script's), through the loader the other finders chose."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.callbacks or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callbacks[name]

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)  # type: ignore[attr-defined]
                try:
                    callback(module)
                except Exception:  # noqa: BLE001 - recording must never break an import
                    pass

        spec.loader = _Loader()
        return spec


class ParallelismRecorder:
    """Holds weak references to what the rank built; ``describe`` turns them into the typed record."""

    def __init__(self, ddp_count: Callable[[], int] = lambda: 0) -> None:
        self._ddp_count = ddp_count
        self._fsdp2: list[weakref.ReferenceType[Any]] = []
        self._fsdp1: list[tuple[weakref.ReferenceType[Any], FSDP1ModuleDoc]] = []
        self._tp_roots: list[weakref.ReferenceType[Any]] = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._finder: _PostImport | None = None
        self._last: ParallelismDoc | None = None

    # -- installation -----------------------------------------------------------------------------------
    def install(self) -> None:
        callbacks: dict[str, Callable[[Any], None]] = {name: self._patch_fsdp2 for name in FSDP2_STATE_MODULES}
        callbacks[FSDP1_MODULE] = self._patch_fsdp1
        callbacks[TP_MODULE] = self._patch_tp
        for name, callback in list(callbacks.items()):
            if name in sys.modules:  # imported before the script ran (by a sitecustomize, say)
                callback(sys.modules[name])
                del callbacks[name]
        self._finder = _PostImport(callbacks)
        sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for owner, attr, orig in reversed(self._restore):
            setattr(owner, attr, orig)
        self._restore.clear()

    def _wrap(self, owner: Any, attr: str, after: Callable[..., None]) -> None:
        orig = getattr(owner, attr, None)
        if orig is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            try:
                after(out, *args, **kwargs)
            except Exception:  # noqa: BLE001 - recording must never break the user's model
                pass
            return out

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        self._restore.append((owner, attr, orig))
        setattr(owner, attr, wrapper)

    def _patch_fsdp2(self, module: Any) -> None:
        state_cls = getattr(module, "FSDPState", None)
        if state_cls is not None:
            self._wrap(state_cls, "init", lambda _out, state, *a, **k: self._fsdp2.append(weakref.ref(state)))

    def _patch_fsdp1(self, module: Any) -> None:
        cls = getattr(module, "FullyShardedDataParallel", None)
        if cls is not None:
            self._wrap(cls, "__init__", lambda _out, fsdp, *a, **k: self._fsdp1.append(
                (weakref.ref(fsdp), _fsdp1_doc(fsdp))))

    def _patch_tp(self, module: Any) -> None:
        self._wrap(module, "parallelize_module", lambda out, *a, **k: self._tp_roots.append(weakref.ref(out)))

    def fsdp2_states(self) -> list[Any]:
        """The FSDPStates the script built that are still alive (tune's probe sets FSDP2's knobs on them)."""
        return [s for ref in self._fsdp2 if (s := ref()) is not None]

    # -- the record -----------------------------------------------------------------------------------------
    @property
    def built_anything(self) -> bool:
        return bool(self._fsdp2 or self._fsdp1 or self._tp_roots)

    def describe(self) -> ParallelismDoc:
        """What this rank built, as far as it is alive; what was freed keeps its last description."""
        import torch

        meshes: list[MeshDoc] = []
        units = [u for ref in self._fsdp2 if (s := ref()) is not None for u in _describe_state(s, meshes)]
        if self._fsdp2 and not units and self._last is not None:
            units = self._last["fsdp2_units"]
            meshes = self._last["meshes"]
        fsdp1 = [doc for _, doc in self._fsdp1]
        fsdp_param_ids: set[int] = set()
        for ref in self._fsdp2:
            state = ref()
            for group in _param_groups(state) if state is not None else []:
                fsdp_param_ids.update(id(fp.sharded_param) for fp in getattr(group, "fsdp_params", []))
        roots = [r for ref in self._tp_roots if (r := ref()) is not None]
        dtensor_params, dtensor_count = _describe_dtensors(roots, fsdp_param_ids, meshes)
        if self._tp_roots and not roots and self._last is not None:
            # the script's globals are gone (it ended): what was described while the model lived stands; its
            # mesh indices are the last record's
            dtensor_params, dtensor_count = self._last["dtensor_params"], self._last["dtensor_param_count"]
            meshes = self._last["meshes"] if not units else meshes
        ddp = self._ddp_count()
        kinds: list[str] = []
        if ddp:
            kinds.append("ddp")
        if any(u["kind"] == "fsdp" for u in units):
            kinds.append("fsdp2")
        if any(u["kind"] == "hsdp" for u in units):
            kinds.append("hsdp")
        if any(u["kind"] == "replicate" for u in units):
            kinds.append("replicate")
        if fsdp1:
            kinds.append("fsdp1")
        if dtensor_count or self._tp_roots:
            kinds.append("tp")
        doc: ParallelismDoc = {
            "kinds": kinds,
            "ddp_modules": ddp,
            "fsdp2_units": units,
            "fsdp1_modules": fsdp1,
            "meshes": meshes,
            "dtensor_params": dtensor_params,
            "dtensor_param_count": dtensor_count,
            "torch": torch.__version__,
        }
        self._last = doc
        return doc


def _param_groups(state: Any) -> list[Any]:
    groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.11+: a list
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [one] if one is not None else []
    return list(groups)


def mesh_index(mesh: Any, meshes: list[MeshDoc]) -> int:
    """The index of ``mesh`` in ``meshes``, appended once (a mesh is known by its dim names, shape and ranks)."""
    names = [str(n) for n in (getattr(mesh, "mesh_dim_names", None) or ())]
    shape = [int(s) for s in mesh.shape]
    size = 1
    for s in shape:
        size *= s
    ranks = [int(r) for r in mesh.mesh.flatten().tolist()] if size <= MAX_MESH_RANKS else []
    doc: MeshDoc = {"device_type": str(mesh.device_type), "dim_names": names, "shape": shape, "ranks": ranks}
    for i, known in enumerate(meshes):
        if known == doc:
            return i
    meshes.append(doc)
    return len(meshes) - 1


def _dim_name(mesh_doc: MeshDoc, dim: int | None) -> str | None:
    if dim is None:
        return None
    names = mesh_doc["dim_names"]
    return names[dim] if dim < len(names) else f"dim{dim}"


def _describe_state(state: Any, meshes: list[MeshDoc]) -> list[FSDPUnitDoc]:
    modules = list(getattr(state, "_modules", ()) or ())
    out: list[FSDPUnitDoc] = []
    for group in _param_groups(state):
        info = group.mesh_info
        m = mesh_index(info.mesh, meshes)
        shard_dim = getattr(info, "shard_mesh_dim", None)
        replicate_dim = getattr(info, "replicate_mesh_dim", None)
        kind = ("hsdp" if shard_dim is not None and replicate_dim is not None
                else "fsdp" if shard_dim is not None else "replicate")
        params = list(getattr(group, "fsdp_params", []))
        numel = sum(int(_prod(fp._orig_size)) for fp in params)
        itemsize = [fp.sharded_param.element_size() for fp in params]
        post = getattr(group, "post_forward_mesh_info", None)
        reshard: bool | int = post is not None
        if post is not None and getattr(post, "shard_mesh_size", None) not in (None, getattr(info, "shard_mesh_size", None)):
            reshard = int(post.shard_mesh_size)
        mp = getattr(group, "mp_policy", None)
        names = [str(getattr(fp, "_param_fqn", None) or getattr(fp._module_info, "param_name", "?")) for fp in params]
        fqn = getattr(group, "_module_fqn", None)
        out.append({
            "fqn": fqn if fqn is not None else ",".join(type(mod).__name__ for mod in modules),
            "module_class": ",".join(_orig_class(mod) for mod in modules),
            "kind": kind,
            "mesh": m,
            "shard_dim": _dim_name(meshes[m], shard_dim),
            "replicate_dim": _dim_name(meshes[m], replicate_dim),
            "param_tensors": len(params),
            "param_names": names[:MAX_UNIT_PARAM_NAMES],
            "numel": numel,
            "bytes": sum(int(_prod(fp._orig_size)) * s for fp, s in zip(params, itemsize, strict=True)),
            "sharded_bytes": sum(_prod(getattr(fp, "sharded_size", fp._orig_size)) * s for fp, s in zip(params, itemsize, strict=True)),
            "reshard_after_forward": reshard,
            "forward_prefetch": _prefetch_names(state, "_states_to_forward_prefetch"),
            "backward_prefetch": _prefetch_names(state, "_states_to_backward_prefetch"),
            "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
            "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None)),
            "is_root": bool(getattr(state, "_is_root", False)),
        })
    return out


def _prefetch_names(state: Any, attr: str) -> list[str]:
    names: list[str] = []
    for other in getattr(state, attr, None) or []:
        for group in _param_groups(other):
            names.append(str(getattr(group, "_module_fqn", None) or "?"))
    return names


def _orig_class(module: Any) -> str:
    # fully_shard swaps the class for FSDP<Name>: the user knows the original name.
    name = type(module).__name__
    return name[4:] if name.startswith("FSDP") and len(name) > 4 else name


def _prod(size: Any) -> int:
    n = 1
    for s in size:
        n *= int(s)
    return n


def _dtype(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _describe_dtensors(roots: list[Any], skip: set[int], meshes: list[MeshDoc]) -> tuple[list[DTensorParamDoc], int]:
    """The DTensor parameters under the tensor-parallel roots that FSDP does not own (its own are its units')."""
    from torch.distributed.tensor import DTensor

    out: list[DTensorParamDoc] = []
    count = 0
    seen: set[int] = set()
    for root in roots:
        for name, p in root.named_parameters():
            if id(p) in seen or id(p) in skip or not isinstance(p, DTensor):
                continue
            seen.add(id(p))
            count += 1
            if len(out) < MAX_DTENSOR_PARAMS:
                out.append({"name": name, "mesh": mesh_index(p.device_mesh, meshes),
                            "placements": [repr(pl) for pl in p.placements], "shape": [int(s) for s in p.shape]})
    return out, count


def _fsdp1_doc(fsdp: Any) -> FSDP1ModuleDoc:
    strategy = getattr(fsdp, "sharding_strategy", None)
    module = getattr(fsdp, "_fsdp_wrapped_module", None) or getattr(fsdp, "module", None)
    return {
        "module_class": type(module).__name__ if module is not None else "?",
        "sharding_strategy": getattr(strategy, "name", None) if strategy is not None else None,
        "world_size": int(getattr(fsdp, "world_size", 0) or 0),
        "use_orig_params": bool(getattr(fsdp, "_use_orig_params", False)),
    }
