"""Findings of `check-sync` about the data: overlapping or incomplete shards, epochs, uneven batches, seeds."""

from __future__ import annotations

from ddpdoctor.analyses.data_shards import (
    CAUSES,
    COVERAGE_ERROR_FRACTION,
    OVERLAP_HASH_FRACTION,
    DataAnalysis,
    EpochShards,
)
from ddpdoctor.findings.model import Finding, Severity

_CAUSE_ADVICE = {
    "dataset-differs": "DistributedSampler gives each rank a slice of the indices and assumes every rank holds the same "
                       "dataset in the same order. Here the ranks' datasets differ (length, Subset indices or first/last "
                       "samples), typically a random_split without a seeded generator, run on every rank: seed it "
                       "(random_split(ds, lengths, generator=torch.Generator().manual_seed(42))) or split once and share "
                       "the indices.",
    "seed-differs": "Pass the same seed to DistributedSampler on every rank: each rank shuffles the whole index list "
                    "with it and takes its slice.",
    "sampler-rank": "Build DistributedSampler with num_replicas=world size and this rank's rank (the defaults, once the "
                    "process group is initialised).",
    "shuffle-no-distributed-sampler": "DataLoader(shuffle=True) draws a permutation of the whole dataset on every rank: "
                                      "use sampler=DistributedSampler(dataset, shuffle=True) instead (and "
                                      "sampler.set_epoch(epoch) every epoch).",
    "no-distributed-sampler": "Use sampler=DistributedSampler(dataset) so each rank reads a disjoint shard.",
    "hand-made-shards": "The per-rank Subsets overlap or leave samples out: split the index range into world_size "
                        "disjoint parts that cover it, or use DistributedSampler on the whole dataset.",
    "lightning-sampler-off": "Lightning adds a DistributedSampler to each training DataLoader unless told not to: drop "
                             "Trainer(use_distributed_sampler=False) (the default is True), or, if you need your own "
                             "sampler, make it shard by rank (DistributedSampler(dataset, shuffle=True); Lightning "
                             "calls its set_epoch).",
    "accelerate-not-prepared": "With accelerate, a DataLoader is split across ranks by accelerator.prepare(), not by a "
                               "DistributedSampler: pass it through prepare (model, optimizer, loader = "
                               "accelerator.prepare(model, optimizer, loader)) and keep a plain shuffle=True; "
                               "accelerate then gives each rank its share of the batches and sets the epoch itself.",
    "shard-order-differs": "The framework splits the batches across ranks (accelerate's prepare() wraps the loader's "
                           "batch sampler in BatchSamplerShard) from a permutation that each rank draws itself, so every "
                           "rank must draw the same one: seed every rank the same before accelerator.prepare(loader) "
                           "(accelerate.utils.set_seed(seed), not seed + rank; seed per-rank randomness such as "
                           "augmentation after prepare), or give the sampler its own seed "
                           "(Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=seed))).",
    "iterable-not-split": "Split the stream by rank (and by worker, torch.utils.data.get_worker_info()): e.g. keep item i "
                          "when i % world_size == rank.",
}
_DEFAULT_ADVICE = ("Each rank must see a disjoint shard: use DistributedSampler(dataset) as the DataLoader's sampler "
                   "(no shuffle=True on the DataLoader), or for an IterableDataset split the stream by rank "
                   "(and by worker, torch.utils.data.get_worker_info()). Otherwise the global batch repeats samples and "
                   "an epoch is really 1/world_size of one.")


def _cause(e: EpochShards, title: str, evidence: dict, advice: str) -> tuple[str, dict, str]:
    """Title, evidence and advice with the shards' cause named, when one is known."""
    if not e.cause:
        return title, evidence, advice
    return (f"{title}: {e.cause_text}", dict(evidence, cause=e.cause, cause_text=e.cause_text),
            _CAUSE_ADVICE.get(e.cause, advice))


def _overlap_finding(e: EpochShards) -> Finding | None:
    if e.overlap == 0:
        return None
    ranks = sorted({r for a, b, _ in e.overlap_pairs for r in (a, b)})
    evidence = {
        "loader": e.loader, "epoch": e.epoch, "shared_samples": e.overlap, "dataset_len": e.dataset_len,
        "samples_per_rank": {str(r): n for r, n in e.samples_per_rank.items()},
        "pairs": [{"ranks": [a, b], "shared": n} for a, b, n in e.overlap_pairs[:10]],
        "examples": e.overlap_examples, "padding_allowed": e.padding_allowed, "by": e.kind,
    }
    if e.kind == "indices" and e.overlap <= e.padding_allowed:
        return Finding(
            "sampler-overlap", Severity.INFO,
            f"{e.overlap} sample(s) appear on two ranks in epoch {e.epoch}: DistributedSampler's padding (drop_last=False)",
            ranks=ranks, evidence=evidence,
            advice="DistributedSampler repeats a few samples so every rank gets as many; harmless. "
                   "drop_last=True drops them instead.",
        )
    smallest = min(e.samples_per_rank.values()) or 1
    if e.kind == "hashes" and e.overlap / smallest <= OVERLAP_HASH_FRACTION:
        return Finding(
            "sampler-overlap", Severity.INFO,
            f"{e.overlap} identical sample(s) on several ranks in epoch {e.epoch} of an iterable dataset (under 1%)",
            ranks=ranks, evidence=evidence, advice="Likely duplicate rows in the data; check if it grows.",
        )
    share = e.overlap / e.dataset_len if e.dataset_len else None
    title = f"Ranks see the same samples in epoch {e.epoch}: {e.overlap} shared"
    if share is not None:
        title += f" ({share:.0%} of the dataset)"
    title, evidence, advice = _cause(e, title, evidence, _DEFAULT_ADVICE)
    return Finding("sampler-overlap", Severity.ERROR, title, ranks=ranks, evidence=evidence, advice=advice)


def _coverage_finding(e: EpochShards) -> Finding | None:
    if not e.missing:
        return None
    evidence = {"loader": e.loader, "epoch": e.epoch, "missing": e.missing, "dataset_len": e.dataset_len,
                "examples": e.missing_examples, "drop_allowed": e.drop_allowed}
    if e.missing <= e.drop_allowed:
        return Finding("sampler-coverage", Severity.INFO,
                       f"{e.missing} sample(s) left out of epoch {e.epoch} by DistributedSampler(drop_last=True)",
                       evidence=evidence, advice="Expected: the tail that does not divide evenly across ranks.")
    fraction = e.missing / e.dataset_len if e.dataset_len else 1.0
    severity = Severity.ERROR if fraction > COVERAGE_ERROR_FRACTION else Severity.WARNING
    title, evidence, advice = _cause(
        e, f"{e.missing} of {e.dataset_len} samples ({fraction:.0%}) were seen by no rank in epoch {e.epoch}", evidence,
        "The shards do not cover the dataset. Use DistributedSampler, which splits every index across ranks; "
        "if the gap is deliberate (a held-out split), build the DataLoader on a Subset instead.")
    return Finding("sampler-coverage", severity, title, ranks=sorted(e.samples_per_rank), evidence=evidence,
                   advice=advice)


def _uneven_finding(e: EpochShards) -> Finding | None:
    counts = {r: n for r, n in e.batches_per_rank.items() if n is not None}
    if len(set(counts.values())) <= 1:
        return None
    title = (f"Ranks get different numbers of batches in epoch {e.epoch}: "
             + ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())))
    evidence: dict = {"loader": e.loader, "epoch": e.epoch, "batches": {str(r): n for r, n in counts.items()},
                      "samples_per_rank": {str(r): n for r, n in e.samples_per_rank.items()}}
    samples = list(e.samples_per_rank.values())
    if max(counts.values()) - min(counts.values()) == 1 and e.batch_size and max(samples) - min(samples) < e.batch_size:
        # The shards are nearly even: only the last, partial batch exists on some ranks and not on others.
        title += ": uneven last batch"
        evidence.update(cause="uneven-last-batch", cause_text="uneven last batch", batch_size=e.batch_size)
    elif e.cause:
        title += f": {e.cause_text}"
        evidence.update(cause=e.cause, cause_text=e.cause_text)
    return Finding(
        "sampler-uneven-batches", Severity.ERROR, title, ranks=sorted(counts), evidence=evidence,
        advice="The rank with more batches will wait forever in DDP's all-reduce once the others finish the epoch "
               "(a hang, or a timeout). Give every rank the same number of batches (DistributedSampler, "
               "drop_last=True on the DataLoader for a partial last batch) or wrap the loop in "
               "torch.distributed.algorithms.Join([model]).",
    )


def data_findings(data: DataAnalysis, world_size: int) -> list[Finding]:
    findings: list[Finding] = []
    for c in data.init_conflicts:
        findings.append(Finding(
            "sampler-shuffle-conflict", Severity.ERROR,
            f"DataLoader(shuffle=True) together with a {c.sampler}: PyTorch refuses it ({c.error})",
            ranks=[c.rank], evidence=c.to_json(),
            advice="With a sampler, shuffling is the sampler's job: drop shuffle=True and use "
                   "DistributedSampler(dataset, shuffle=True), calling sampler.set_epoch(epoch) every epoch.",
        ))
    seen: set[str] = set()
    for e in data.epochs:
        for f in (_overlap_finding(e), _coverage_finding(e), _uneven_finding(e)):
            # One finding per id and loader: the first epoch that shows it (later epochs repeat it).
            if f is not None and (key := f"{f.id}:{e.loader}") not in seen:
                seen.add(key)
                findings.append(f)
    for facts in data.loaders:
        if facts.same_order_epochs:
            ranks = sorted(facts.same_order_epochs)
            sampler = next((s for s in facts.sampler.values() if s is not None), None)
            findings.append(Finding(
                "sampler-no-set-epoch", Severity.WARNING,
                f"DataLoader #{facts.loader} yields the same order every epoch "
                f"({sampler.class_name if sampler else None} with shuffle=True)",
                ranks=ranks,
                evidence={"loader": facts.loader, "epochs_same_as_first": facts.same_order_epochs[ranks[0]],
                          "sampler_epoch_per_epoch": facts.sampler_epochs.get(ranks[0]),
                          "set_epoch_calls": data.set_epoch_calls.get(ranks[0], 0)},
                advice="DistributedSampler shuffles with seed + epoch: call sampler.set_epoch(epoch) at the start of "
                       "every epoch, or every epoch repeats the first one's order.",
            ))
    for m in data.dataset_mismatch:
        text = m.cause_text or CAUSES["dataset-differs"]
        findings.append(Finding(
            "sampler-dataset-differs", Severity.ERROR,
            f"DataLoader #{m.loader} reads datasets of different lengths on different ranks: {text}",
            ranks=sorted(m.dataset_len), evidence=m.to_json(),
            advice=_CAUSE_ADVICE.get(m.cause or "", _CAUSE_ADVICE["dataset-differs"]),
        ))
    for sm in data.seed_mismatch:
        findings.append(Finding(
            "sampler-seed-mismatch", Severity.ERROR,
            f"DataLoader #{sm.loader}'s sampler is seeded differently on different ranks",
            ranks=sorted(sm.seeds), evidence=sm.to_json(),
            advice="DistributedSampler must get the same seed on every rank: each rank shuffles the whole index list "
                   "and takes its slice, so different seeds give overlapping shards and skipped samples.",
        ))
    return findings
