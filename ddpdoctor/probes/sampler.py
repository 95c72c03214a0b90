"""Records, in each rank, which dataset samples every DataLoader epoch yields (indices, or fingerprints for iterable datasets).

Map-style loaders: the loader's index sampler (the batch sampler, or the sampler) is wrapped; at an epoch's
first batch the wrapper draws the whole epoch's indices from the real sampler at once (the same draws, in
the same order, from the same random generators the loader would have used) and records them, then hands
them out.
Iterable datasets have no indices: each yielded sample (row of the batch's first tensor) is hashed instead.
Nothing here changes which samples the script sees.

A pass (one ``iter()``) counts as an epoch only once a training step followed one of its batches: a
``next(iter(loader))`` peek at a batch size is recorded as a peek and its indices are dropped. Each
loader's dataset is fingerprinted once (length, and a hash of its first and last samples, drawn with
every random generator's state restored), so the analysis can tell a dataset that differs across ranks
from a sampler that splits one dataset wrongly. Every hook runs under the probe's Guard."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

from ddpdoctor.probes.dataset_hashes import dataset_fingerprint, hash_rows
from ddpdoctor.probes.records import (
    DataDoc,
    EpochRecord,
    InitConflict,
    LoaderDoc,
    SubsetFacts,
)
from ddpdoctor.probes.sampler_facts import (
    base_sampler,
    framework_facts,
    sampler_facts,
    shard_facts,
    subset_maps,
)

MAX_INDICES = 2_000_000  # per epoch: beyond this the epoch is marked truncated (coverage is then not judged)
MAX_HASHED_SAMPLES = 100_000  # per epoch of an iterable dataset
EPOCHS_WITH_INDICES = 4  # later epochs keep only their batch count and a hash of their order (memory)


def _flatten(item: Any) -> list[int]:
    if isinstance(item, (list, tuple)):
        return [int(i) for i in item]
    if isinstance(item, torch.Tensor):
        return [int(i) for i in item.reshape(-1).tolist()]
    return [int(item)]


class _LoaderEntry(LoaderDoc):
    """A loader as the probe tracks it: its data.json entry, and (underscored, not written) the loader itself and
    the Subset index maps that lead to its root dataset."""

    _maps: list[Any]
    _loader: Any


@dataclass(frozen=True)
class _Originals:
    """What ``install`` replaced, put back by ``uninstall``."""

    init: Any
    iter: Any
    prop: Any
    next: Any
    set_epoch: Any


class _RecordingIndexSampler:
    """Stands in for a loader's index sampler; each ``iter`` records one epoch's indices."""

    def __init__(self, probe: SamplerProbe, loader_id: int, inner: Any) -> None:
        self._probe = probe
        self._loader_id = loader_id
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __iter__(self) -> Iterator[Any]:
        # iter() now, as the loader would (eager samplers draw here); drain at the first next(), where a
        # generator sampler draws, so every random number is drawn in the loader's own order.
        return self._drain(self._probe.current_epoch(self._loader_id), iter(self.inner))

    def _drain(self, record: EpochRecord | None, it: Iterator[Any]) -> Iterator[Any]:
        head: list[Any] = []
        indices: list[int] | None = [] if self._probe.guard.enabled else None
        truncated = False
        for item in it:  # an infinite sampler (a repeating one) stops at the cap
            head.append(item)
            if indices is not None:
                try:
                    indices.extend(_flatten(item))
                except Exception as exc:  # noqa: BLE001 - an index we cannot read: stop recording, keep serving
                    self._probe.guard.fail("reading the sampler's indices", exc)
                    indices = None
            if indices is not None and len(indices) >= MAX_INDICES:
                truncated = True
                break
        if record is not None and indices is not None:
            self._probe.guard.call("recording an epoch's indices", self._record, record, indices, len(head), truncated)
        yield from head
        yield from it

    def _record(self, record: EpochRecord, indices: list[int], batches: int, truncated: bool) -> None:
        record["batches"] = None if truncated else batches
        record["order_hash"] = hashlib.blake2b(repr(indices).encode(), digest_size=8).hexdigest()
        record["truncated"] = truncated
        epochs = self._probe.loaders[self._loader_id]["epochs"]
        # Full indices for the first few epochs only (peeks dropped theirs); later ones keep count and hash.
        keep = sum(1 for e in epochs if "indices" in e) < EPOCHS_WITH_INDICES
        if keep:
            record["indices"] = indices[:MAX_INDICES]
        maps = self._probe.loaders[self._loader_id]["_maps"]
        if maps and keep:
            # Hand-made shards are often Subsets: compare them in the underlying dataset's indices.
            root = list(record["indices"])
            for m in maps:
                root = [int(m[i]) for i in root]
            record["root_indices"] = root


class SamplerProbe:
    """Patches DataLoader while installed; ``data()`` is what it saw, ready for data.json."""

    def __init__(self, guard: Any = None) -> None:
        from ddpdoctor.probes.guard import Guard, ProbeNotes

        self.guard = guard if guard is not None else Guard("data", ProbeNotes(None))
        self.loaders: list[_LoaderEntry] = []
        self.init_conflicts: list[InitConflict] = []
        self.set_epoch_calls = 0
        self.last_record: EpochRecord | None = None
        self._saved: _Originals | None = None

    def install(self) -> None:
        probe = self
        orig_init = DataLoader.__init__
        orig_iter = DataLoader.__iter__
        orig_prop = DataLoader.__dict__["_index_sampler"]
        orig_next = _BaseDataLoaderIter.__next__
        orig_set_epoch = DistributedSampler.set_epoch
        self._saved = _Originals(orig_init, orig_iter, orig_prop, orig_next, orig_set_epoch)

        # functools.wraps: frameworks read DataLoader.__init__'s signature to re-create loaders (Lightning's
        # _get_dataloader_init_args_and_kwargs when it adds the DistributedSampler; inspect.signature follows
        # __wrapped__); a bare (loader, dataset, *args, **kwargs) made Lightning fail with "missing attributes".
        @functools.wraps(orig_init)
        def __init__(loader: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            try:
                orig_init(loader, dataset, *args, **kwargs)
            except ValueError as exc:
                if kwargs.get("shuffle") and (kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None):
                    probe.init_conflicts.append({
                        "error": str(exc), "sampler": type(kwargs.get("sampler") or kwargs.get("batch_sampler")).__name__,
                    })
                raise
            probe.guard.call("DataLoader's constructor", probe._register, loader, kwargs)

        @functools.wraps(orig_iter)
        def __iter__(loader: Any) -> Any:
            probe.guard.call("DataLoader.__iter__", probe._start_epoch, loader)
            return orig_iter(loader)

        def _index_sampler(loader: Any) -> Any:
            inner = orig_prop.fget(loader)
            loader_id = loader.__dict__.get("_ddpdoctor_loader_id")
            if loader_id is None or loader._dataset_kind != _DatasetKind.Map or not probe.guard.enabled:
                return inner
            cached = loader.__dict__.get("_ddpdoctor_index_sampler")
            if cached is None or cached.inner is not inner:
                cached = _RecordingIndexSampler(probe, loader_id, inner)
                loader.__dict__["_ddpdoctor_index_sampler"] = cached
            return cached

        @functools.wraps(orig_next)
        def __next__(it: Any) -> Any:
            data = orig_next(it)
            if probe.guard.enabled:
                probe.guard.call("a DataLoader batch", probe._on_batch, it, data)
            return data

        @functools.wraps(orig_set_epoch)
        def set_epoch(sampler: Any, epoch: int) -> None:
            probe.set_epoch_calls += 1
            return orig_set_epoch(sampler, epoch)

        DataLoader.__init__ = __init__  # type: ignore[method-assign,assignment]
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        DataLoader._index_sampler = property(_index_sampler)  # type: ignore[method-assign,assignment]
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign,assignment]
        DistributedSampler.set_epoch = set_epoch  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        saved = self._saved
        if saved is None:
            return
        DataLoader.__init__ = saved.init  # type: ignore[method-assign]
        DataLoader.__iter__ = saved.iter  # type: ignore[method-assign]
        DataLoader._index_sampler = saved.prop  # type: ignore[method-assign]
        _BaseDataLoaderIter.__next__ = saved.next  # type: ignore[method-assign]
        DistributedSampler.set_epoch = saved.set_epoch  # type: ignore[method-assign]
        self._saved = None

    # -- recording -----------------------------------------------------------------------------------
    # kwargs: the user's own DataLoader(...) keyword arguments
    def _register(self, loader: Any, kwargs: dict[str, Any]) -> None:
        loader_id = len(self.loaders)
        loader.__dict__["_ddpdoctor_loader_id"] = loader_id
        iterable = loader._dataset_kind == _DatasetKind.Iterable
        try:
            dataset_len: int | None = len(loader.dataset)
        except TypeError:
            dataset_len = None
        root, maps = subset_maps(loader.dataset)
        subset: SubsetFacts | None = None
        if maps and not iterable:
            final = list(range(len(maps[0])))
            for m in maps:
                final = [int(m[i]) for i in final]
            subset = {"root_class": type(root).__name__, "root_len": len(root),
                      "hash": hashlib.blake2b(repr(final).encode(), digest_size=8).hexdigest()}
        self.loaders.append({
            "loader": loader_id,
            "subset": subset,
            # Not with worker processes: loading a sample here, before they fork, would open what a dataset
            # opens lazily (an HDF5 file, a connection) in the parent, and the workers would share it.
            "dataset_fp": (None if iterable or dataset_len is None else
                           {"len": dataset_len, "error": "not loaded (num_workers > 0)"} if loader.num_workers > 0
                           else dataset_fingerprint(loader.dataset)),
            "_maps": maps if subset else [],
            "dataset_class": type(loader.dataset).__name__,
            "dataset_len": dataset_len,
            "iterable": iterable,
            "batch_size": loader.batch_size,
            "drop_last": bool(loader.drop_last),
            "shuffle_arg": bool(kwargs.get("shuffle")),
            "sampler_arg": kwargs.get("sampler") is not None,
            "batch_sampler_arg": kwargs.get("batch_sampler") is not None,
            "num_workers": int(loader.num_workers),
            "sampler": None if iterable else {**sampler_facts(base_sampler(loader)), **shard_facts(loader),
                                              **framework_facts()},
            "epochs": [],
            "_loader": loader,
        })

    def current_epoch(self, loader_id: int) -> EpochRecord | None:
        epochs = self.loaders[loader_id]["epochs"]
        return epochs[-1] if epochs else None

    def _start_epoch(self, loader: Any) -> None:
        loader_id = loader.__dict__.get("_ddpdoctor_loader_id")
        if loader_id is None:
            return
        entry = self.loaders[loader_id]
        previous = entry["epochs"][-1] if entry["epochs"] else None
        if previous is not None and previous["steps"] == 0 and previous["batches_yielded"] < (previous.get("batches") or 1 << 62):
            # Abandoned part-way before any training step (a peek at the batch size): not an epoch.
            previous["peek"] = True
            for key in ("indices", "root_indices", "sample_hashes"):
                previous.pop(key, None)
        record: EpochRecord = {"epoch": len(entry["epochs"]), "batches_yielded": 0, "steps": 0}
        if entry["iterable"]:
            record["sample_hashes"] = []
        else:
            sampler = base_sampler(loader)
            record["sampler_epoch"] = getattr(sampler, "epoch", None) if isinstance(getattr(sampler, "epoch", None), int) else None
            try:
                record["len"] = len(loader)
            except TypeError:
                record["len"] = None
        entry["epochs"].append(record)

    def _on_batch(self, it: Any, data: Any) -> None:
        index_sampler = it._index_sampler
        loader_id = getattr(index_sampler, "_loader_id", None)
        if loader_id is None:
            loader_id = next((e["loader"] for e in self.loaders if e["iterable"] and e["_loader"]._iterator is it), None)
            if loader_id is None and self.loaders:
                # Non-persistent iterators are not kept by the loader: match the latest iterable loader.
                iterables = [e for e in self.loaders if e["iterable"] and e["epochs"]]
                loader_id = iterables[-1]["loader"] if iterables else None
        if loader_id is None:
            return
        record = self.current_epoch(loader_id)
        if record is None:
            return
        record["batches_yielded"] += 1
        self.last_record = record
        hashes = record.get("sample_hashes")
        if hashes is not None and len(hashes) < MAX_HASHED_SAMPLES:
            hashes.extend(hash_rows(data)[: MAX_HASHED_SAMPLES - len(hashes)])

    def on_step(self, step: int) -> None:
        """An optimizer step ended: the loader that yielded the last batch is a training loader."""
        if self.last_record is not None and self.guard.enabled:
            self.last_record["steps"] += 1

    def steps_to_second_epoch(self) -> int:
        """Steps until every shuffling map-style training loader has fed a step from its second pass: 0 when
        that is so (or recording failed), else the estimate from its length and the batches each step took."""
        if not self.guard.enabled:
            return 0
        worst = 0
        for entry in self.loaders:
            sampler = entry.get("sampler") or {}
            if entry["iterable"] or not sampler.get("shuffle") or sampler.get("replacement"):
                continue
            training = [e for e in entry["epochs"] if e["steps"] > 0]
            if len(training) != 1:
                continue  # not a training loader (yet), or its second epoch is seen
            first = training[0]
            total = first.get("len") or first.get("batches")
            if entry["epochs"][-1] is not first or not total:
                worst = max(worst, 1)  # a later pass has begun: its first step is the next one
                continue
            per_step = first["batches_yielded"] / first["steps"]
            left = max(0, int(total) - first["batches_yielded"])
            worst = max(worst, math.ceil(left / per_step) + 1)
        return worst

    def data(self) -> DataDoc:
        loaders: list[LoaderDoc] = []
        for entry in self.loaders:
            out = {k: v for k, v in entry.items() if not k.startswith("_")}  # the entry less its live objects
            loaders.append(cast(LoaderDoc, out))
        return {"loaders": loaders, "init_conflicts": self.init_conflicts, "set_epoch_calls": self.set_epoch_calls}
