"""How the ranks' DataLoaders split the data (ranks/rankR/data.json): overlap, coverage, epochs, batches, seeds. Pure.

Only loaders that fed training steps (an optimizer step followed one of their batches) are judged, so a
validation loader that every rank runs in full is not mistaken for a broken shard; they are matched across
ranks by their order among each rank's training loaders (an extra loader on one rank shifts nothing).
A loader's epochs are its passes that fed training steps (a ``next(iter(loader))`` peek is not one).
Each loader also gets a cause for what is wrong with its shards, from the datasets' fingerprints and
the samplers' settings across ranks (:func:`shard_cause`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DataRecord, DatasetFingerprint, LoaderEpoch, LoaderRecord, SamplerFacts

OVERLAP_HASH_FRACTION = 0.01  # iterable datasets: identical rows can exist in real data; below 1% is info
COVERAGE_ERROR_FRACTION = 0.01  # more than 1% of the dataset never seen by any rank in an epoch is an error


@dataclass
class EpochShards:
    loader: int
    epoch: int
    kind: str  # "indices", "root_indices" (Subsets of one dataset) or "hashes"
    dataset_len: int | None
    samples_per_rank: dict[int, int]
    batches_per_rank: dict[int, int | None]
    overlap: int  # distinct samples seen by more than one rank
    overlap_examples: list[int | str]  # sample indices, or sample hashes (iterable datasets)
    overlap_pairs: list[tuple[int, int, int]]  # (rank a, rank b, shared samples)
    padding_allowed: int  # DistributedSampler(drop_last=False) repeats this many samples to even the shards
    missing: int | None  # dataset samples no rank saw (None: not judged)
    missing_examples: list[int]
    drop_allowed: int  # DistributedSampler(drop_last=True) drops up to this many
    cause: str | None = None  # shard_cause's key for this loader
    cause_text: str | None = None
    batch_size: int | None = None


@dataclass
class LoaderFacts:
    loader: int
    sampler: dict[int, SamplerFacts | None]
    epochs_seen: dict[int, int]
    same_order_epochs: dict[int, list[int]]  # rank -> epochs whose order equals epoch 0's (shuffling samplers)
    sampler_epochs: dict[int, list[int | None]]
    cause: str | None = None
    cause_text: str | None = None
    steps_per_epoch: int | None = None  # estimated from the first epoch (its batches / batches per step)
    steps_seen: int = 0  # training steps this loader fed (lowest rank)


@dataclass
class SeedMismatch:
    """A DistributedSampler seeded differently on different ranks (the evidence of sampler-seed-mismatch)."""

    loader: int
    seeds: dict[int, int | float | str | bool | None]

    def to_json(self) -> JsonObject:
        return {"loader": self.loader, "seeds": {str(r): s for r, s in self.seeds.items()}}


@dataclass
class DatasetMismatch:
    """Datasets of other lengths on different ranks: their shards are not compared (sampler-dataset-differs)."""

    loader: int
    cause: str | None
    cause_text: str | None
    dataset_len: dict[int, int | None]

    def to_json(self) -> JsonObject:
        return {"loader": self.loader, "cause": self.cause, "cause_text": self.cause_text,
                "dataset_len": {str(r): n for r, n in self.dataset_len.items()}}


@dataclass
class InitConflictSeen:
    """DataLoader(shuffle=True) with a sampler, refused by PyTorch on one rank (sampler-shuffle-conflict)."""

    rank: int
    error: str | None
    sampler: str | None

    def to_json(self) -> JsonObject:
        return {"rank": self.rank, "error": self.error, "sampler": self.sampler}


@dataclass
class DataAnalysis:
    epochs: list[EpochShards] = field(default_factory=list)
    loaders: list[LoaderFacts] = field(default_factory=list)
    seed_mismatch: list[SeedMismatch] = field(default_factory=list)
    init_conflicts: list[InitConflictSeen] = field(default_factory=list)
    set_epoch_calls: dict[int, int] = field(default_factory=dict)
    dataset_mismatch: list[DatasetMismatch] = field(default_factory=list)  # datasets of other lengths: not compared
    notes: list[str] = field(default_factory=list)


def _training_loaders(rec: DataRecord) -> list[LoaderRecord]:
    """One rank's loaders that fed training steps, in creation order, each with only its training epochs
    (passes that fed steps), renumbered from 0."""
    out = []
    for ld in rec.loaders:
        epochs = [e for e in ld.epochs if e.steps > 0 and not e.peek]
        if epochs:
            out.append(msgspec.structs.replace(
                ld, epochs=[msgspec.structs.replace(e, epoch=i) for i, e in enumerate(epochs)]))
    return out


CAUSES = {
    "dataset-differs": "the dataset differs across ranks (e.g. an unseeded random_split)",
    "seed-differs": "DistributedSampler with different seeds",
    "sampler-rank": "DistributedSampler built with the wrong rank or number of replicas",
    "shuffle-no-distributed-sampler": "shuffle without a DistributedSampler",
    "no-distributed-sampler": "no DistributedSampler: every rank reads the whole dataset",
    "hand-made-shards": "hand-made per-rank shards that do not split the dataset",
    "iterable-not-split": "an IterableDataset that every rank reads in full (not split by rank)",
    "lightning-sampler-off": "Lightning did not add its DistributedSampler (Trainer(use_distributed_sampler=False)) "
                             "and the loader's own sampler does not split the data by rank",
    "accelerate-not-prepared": "the DataLoader was not passed to accelerator.prepare(), which is what shards it by "
                               "rank, so every rank reads the whole dataset",
    "shard-order-differs": "each rank shuffles the whole dataset in its own order (a seed per rank) and then takes its "
                           "share of the batches, so the shares overlap and leave samples out",
}


def _dataset_key(ld: LoaderRecord) -> tuple[int | str | None, ...]:
    fp = ld.dataset_fp or DatasetFingerprint()
    subset = ld.subset.hash if ld.subset else None
    if fp.varies or fp.error:
        return (ld.dataset_len, subset)
    return (ld.dataset_len, subset, fp.first, fp.last)


def shard_cause(loader_by_rank: dict[int, LoaderRecord], world_size: int) -> str | None:
    """Why these ranks' shards of one loader are wrong, as a key of CAUSES (None: nothing to blame)."""
    lds = list(loader_by_rank.values())
    if any(ld.iterable for ld in lds):
        return "iterable-not-split"
    samplers = [ld.sampler or SamplerFacts() for ld in lds]
    distributed = all(s.distributed for s in samplers)
    if len({_dataset_key(ld) for ld in lds}) > 1:
        return "dataset-differs" if distributed else "hand-made-shards"
    if distributed:
        if len({s.seed for s in samplers}) > 1:
            return "seed-differs"
        ranks = [s.rank for s in samplers]
        if len(set(ranks)) < len(ranks) or any(s.num_replicas != world_size for s in samplers):
            return "sampler-rank"
        return None
    shards = [s.sharded_by for s in samplers]
    if all(sh is not None and sh.num_processes == world_size for sh in shards):
        # The batches are split across ranks by a wrapper (accelerate's prepare()): a sharded loader, not one
        # without a DistributedSampler. Its shares are disjoint only if every rank draws the same permutation.
        if len({sh.process_index for sh in shards if sh is not None}) < len(shards):
            return "sampler-rank"
        # (the explanation of shares seen to overlap; with seeds unknown, a shuffled order is all that can differ)
        seeds = {s.seed for s in samplers}
        if any(s.shuffle for s in samplers) and (len(seeds) > 1 or seeds == {None}):
            return "shard-order-differs"
        return None
    if any(s.framework == "lightning" for s in samplers):
        return "lightning-sampler-off"  # Lightning adds a DistributedSampler unless it was told not to
    if any(s.framework == "accelerate" for s in samplers):
        return "accelerate-not-prepared"  # a prepared loader is sharded_by a BatchSamplerShard (above)
    return "shuffle-no-distributed-sampler" if any(s.shuffle for s in samplers) else "no-distributed-sampler"


def _steps_per_epoch(ld: LoaderRecord) -> int | None:
    """Steps one full epoch takes, from the first epoch's length and the batches each step consumed."""
    if not ld.epochs:
        return None
    first = ld.epochs[0]
    batches, yielded, steps = first.len, first.batches_yielded or 0, first.steps
    if not batches or not yielded or not steps:
        return None
    return max(1, -(-int(batches) * int(steps) // int(yielded)))


def _shuffles(sampler: SamplerFacts | None) -> bool:
    return bool(sampler and sampler.shuffle and not sampler.replacement)


def _root_mode(loader_by_rank: dict[int, LoaderRecord]) -> bool:
    """Each rank loads a different Subset of one dataset (hand-made shards): compare the underlying indices."""
    subsets = [s for ld in loader_by_rank.values() if (s := ld.subset)]
    return (len(subsets) == len(loader_by_rank) and len({s.hash for s in subsets}) > 1
            and len({s.root_len for s in subsets}) == 1)


SampleKey = Literal["indices", "root_indices", "sample_hashes"]


def _samples(e: LoaderEpoch, key: SampleKey) -> list[int] | list[str]:
    """One epoch's record of the samples it yielded: their indices (in the root dataset), or their hashes."""
    found = e.indices if key == "indices" else e.root_indices if key == "root_indices" else e.sample_hashes
    return found or []


def epoch_shards(loader_id: int, epoch: int, per_rank: dict[int, LoaderEpoch],
                 loader_by_rank: dict[int, LoaderRecord]) -> EpochShards:
    """Overlap and coverage of one epoch; ``per_rank`` maps rank -> that rank's epoch record."""
    any_loader = next(iter(loader_by_rank.values()))
    hashed = bool(any_loader.iterable)
    root = not hashed and _root_mode(loader_by_rank)
    key: SampleKey = "sample_hashes" if hashed else ("root_indices" if root else "indices")
    dataset_len = any_loader.subset.root_len if root and any_loader.subset else any_loader.dataset_len
    limit = None
    if dataset_len and any(e.truncated for e in per_rank.values()):
        # A capped (endless) sampler's record can span several passes: compare one shard's worth per rank.
        limit = -(-int(dataset_len) // len(per_rank))
    sets: dict[int, set[int | str]] = {r: set(_samples(e, key)[:limit]) for r, e in per_rank.items()}
    counts: Counter[int | str] = Counter()
    for s in sets.values():
        counts.update(s)
    shared = sorted((x for x, c in counts.items() if c > 1), key=str)
    ranks = sorted(sets)
    pairs = [(a, b, len(sets[a] & sets[b])) for i, a in enumerate(ranks) for b in ranks[i + 1:] if sets[a] & sets[b]]
    sampler = any_loader.sampler or SamplerFacts()
    padding = drop = 0
    if sampler.distributed and dataset_len is not None:
        total = int(sampler.total_size if sampler.total_size is not None else dataset_len)
        if sampler.drop_last:
            drop = max(0, dataset_len - total)
        else:
            padding = max(0, total - dataset_len)
    missing: int | None = None
    missing_examples: list[int] = []
    judge_coverage = (not hashed and dataset_len is not None and not sampler.replacement
                      and not any(e.truncated for e in per_rank.values()))
    if judge_coverage and dataset_len is not None:  # judge_coverage implies the None check; mypy needs it here
        seen: set[int | str] = set().union(*sets.values()) if sets else set()
        missing = sum(1 for i in range(int(dataset_len)) if i not in seen)
        missing_examples = [i for i in range(int(dataset_len)) if i not in seen][:10]
    return EpochShards(
        loader=loader_id, epoch=epoch, kind=key.replace("sample_", ""), dataset_len=dataset_len,
        samples_per_rank={r: len(_samples(e, key)) for r, e in per_rank.items()},
        batches_per_rank={r: e.batches for r, e in per_rank.items()},
        overlap=len(shared), overlap_examples=shared[:10], overlap_pairs=pairs, padding_allowed=padding,
        missing=missing, missing_examples=missing_examples, drop_allowed=drop,
    )


def analyze_data(data: dict[int, DataRecord], world_size: int | None = None) -> DataAnalysis:
    """``data``: rank -> that rank's data.json; ``world_size`` defaults to the number of ranks."""
    out = DataAnalysis()
    world = world_size or len(data)
    for rank, rec in sorted(data.items()):
        out.set_epoch_calls[rank] = rec.set_epoch_calls
        for c in rec.init_conflicts:
            out.init_conflicts.append(InitConflictSeen(rank, c.error, c.sampler))
    ranks = sorted(data)
    training = {r: _training_loaders(data[r]) for r in ranks}
    # The k-th training loader of each rank are the same loader: a rank that builds an extra loader (for
    # logging, say) does not shift the match.
    for k in range(max((len(t) for t in training.values()), default=0)):
        loader_by_rank = {r: training[r][k] for r in ranks if k < len(training[r])}
        if len(loader_by_rank) < 2:
            continue
        loader_id = loader_by_rank[min(loader_by_rank)].loader
        cause = shard_cause(loader_by_rank, world)
        cause_text = CAUSES.get(cause or "")
        lowest = loader_by_rank[min(loader_by_rank)]
        facts = LoaderFacts(loader=loader_id, sampler={r: ld.sampler for r, ld in loader_by_rank.items()},
                            epochs_seen={r: len(ld.epochs) for r, ld in loader_by_rank.items()},
                            same_order_epochs={}, sampler_epochs={}, cause=cause, cause_text=cause_text,
                            steps_per_epoch=_steps_per_epoch(lowest),
                            steps_seen=sum(e.steps for e in lowest.epochs))
        lens = {ld.dataset_len for ld in loader_by_rank.values()}
        if len(lens) > 1 and not _root_mode(loader_by_rank):
            out.loaders.append(facts)
            out.dataset_mismatch.append(DatasetMismatch(loader_id, cause, cause_text,
                                                        {r: ld.dataset_len for r, ld in loader_by_rank.items()}))
            continue
        for r, ld in loader_by_rank.items():
            epochs = ld.epochs
            facts.sampler_epochs[r] = [e.sampler_epoch for e in epochs]
            if _shuffles(ld.sampler) and len(epochs) >= 2 and epochs[0].order_hash:
                same = [int(e.epoch or 0) for e in epochs[1:] if e.order_hash == epochs[0].order_hash]
                if same:
                    facts.same_order_epochs[r] = same
        out.loaders.append(facts)
        seeds = {r: ld.sampler.seed if ld.sampler else None for r, ld in loader_by_rank.items()}
        if all(s is not None for s in seeds.values()) and len(set(seeds.values())) > 1:
            out.seed_mismatch.append(SeedMismatch(loader_id, seeds))
        n_epochs = min(len(ld.epochs) for ld in loader_by_rank.values())
        for e in range(n_epochs):
            per_rank = {r: ld.epochs[e] for r, ld in loader_by_rank.items()}
            if not any(rec.steps > 0 for rec in per_rank.values()):
                continue
            if not next(iter(loader_by_rank.values())).iterable and any(rec.indices is None for rec in per_rank.values()):
                continue  # past the epochs whose indices were kept
            shards = epoch_shards(loader_id, e, per_rank, loader_by_rank)
            shards.cause, shards.cause_text = cause, cause_text
            shards.batch_size = lowest.batch_size
            out.epochs.append(shards)
        judged = [x for x in out.epochs if x.loader == loader_id]
        if cause == "dataset-differs" and judged and not any(x.overlap or x.missing for x in judged):
            # Disjoint, complete index shards of datasets whose samples differ: harmless for data generated at
            # random per rank (the DDP tutorial's MyTrainDataset), a bug for a dataset meant to be shared.
            out.notes.append(f"DataLoader #{loader_id}'s dataset differs across ranks (its first or last sample) "
                             "although every rank has the same length: the index shards are disjoint and complete, "
                             "but each rank indexes its own data (fine for data generated at random per rank; "
                             "otherwise build the dataset identically on every rank)")
    return out
