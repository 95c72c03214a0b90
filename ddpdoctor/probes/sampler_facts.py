"""What a DataLoader's sampler is, as data.json describes it: the index sampler under the batch sampler and its
wrappers, the Subset maps down to the root dataset, a DistributedSampler's settings, sharding and framework facts."""

from __future__ import annotations

import sys
from typing import Any, Literal

from torch.utils.data import DistributedSampler, RandomSampler, Subset

from ddpdoctor.probes.records import SamplerFacts


def subset_maps(dataset: Any) -> tuple[Any, list[Any]]:
    """The dataset under nested Subsets, and the index lists that lead to it (outermost first)."""
    maps: list[Any] = []
    while isinstance(dataset, Subset):
        maps.append(dataset.indices)
        dataset = dataset.dataset
    return dataset, maps


def base_sampler(loader: Any) -> Any:
    """The index sampler under the batch sampler, through wrappers that keep theirs as .batch_sampler (accelerate's
    BatchSamplerShard, after accelerator.prepare(loader))."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for _ in range(4):
        inner = getattr(batch_sampler, "sampler", None)
        if inner is not None:
            return inner
        batch_sampler = getattr(batch_sampler, "batch_sampler", None)
        if batch_sampler is None:
            break
    return getattr(loader, "sampler", None)


def framework_facts() -> SamplerFacts:
    """Lightning, when loaded: it adds the DistributedSampler itself (use_distributed_sampler); accelerate, when
    loaded: its prepare() shards the loader. Advice about a loader's sampler is given in their terms."""
    if "lightning" in sys.modules or "pytorch_lightning" in sys.modules:
        return {"framework": "lightning"}
    if "accelerate" in sys.modules and "transformers.trainer" not in sys.modules:
        # accelerate shards a loader only through accelerator.prepare(loader) (the HF Trainer prepares its own)
        return {"framework": "accelerate"}
    return {}


def shard_facts(loader: Any) -> SamplerFacts:
    """A batch sampler that hands each rank its share of the batches (accelerate's BatchSamplerShard: each rank
    draws the batches of the whole dataset, then keeps every num_processes-th)."""
    bs = getattr(loader, "batch_sampler", None)
    n, index = getattr(bs, "num_processes", None), getattr(bs, "process_index", None)
    if isinstance(n, int) and isinstance(index, int):
        return {"sharded_by": {"class": type(bs).__name__, "num_processes": n, "process_index": index}}
    return {}


def sampler_facts(sampler: Any) -> SamplerFacts:
    facts: SamplerFacts = {"class": type(sampler).__name__}
    if isinstance(sampler, DistributedSampler):
        facts.update({
            "distributed": True, "num_replicas": sampler.num_replicas, "rank": sampler.rank,
            "shuffle": bool(sampler.shuffle), "seed": int(sampler.seed), "drop_last": bool(sampler.drop_last),
            "total_size": int(sampler.total_size),
        })
    else:
        facts["distributed"] = False
        attrs: tuple[Literal["shuffle", "seed", "replacement", "drop_last"], ...] = (
            "shuffle", "seed", "replacement", "drop_last")
        for attr in attrs:
            value = getattr(sampler, attr, None)
            if isinstance(value, (bool, int, float, str)):
                facts[attr] = value
        if isinstance(sampler, RandomSampler) or type(sampler).__name__ == "SubsetRandomSampler":
            facts.setdefault("shuffle", True)
        seed = getattr(sampler, "initial_seed", None)  # accelerate's SeedableRandomSampler: the seed it shuffles with
        if isinstance(seed, int) and "seed" not in facts:
            facts["seed"] = seed
    epoch = getattr(sampler, "epoch", None)
    if isinstance(epoch, int):
        facts["epoch"] = epoch
    return facts
