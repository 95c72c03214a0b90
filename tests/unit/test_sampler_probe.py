"""The DataLoader recorder records exactly the samples a loader yields and changes none of them (in one process)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from ddpdoctor.probes.sampler import SamplerProbe


def _epochs(loader, n):
    return [[int(i) for batch in loader for i in batch[0].reshape(-1)] for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_records_what_the_loader_yields_without_changing_it(workers):
    data = TensorDataset(torch.arange(23))

    def make():
        return DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, persistent_workers=workers > 0)

    torch.manual_seed(1)
    plain = _epochs(make(), 2)
    probe = SamplerProbe()
    probe.install()
    try:
        torch.manual_seed(1)
        seen = _epochs(make(), 2)
    finally:
        probe.uninstall()
    assert seen == plain  # same order, same random draws
    (loader,) = probe.data()["loaders"]
    assert [e["indices"] for e in loader["epochs"]] == plain  # TensorDataset(arange): the value is the index
    assert [e["batches"] for e in loader["epochs"]] == [6, 6] and loader["sampler"]["class"] == "RandomSampler"
    assert [e["batches_yielded"] for e in loader["epochs"]] == [6, 6]


def test_distributed_sampler_epochs_and_set_epoch():
    data = TensorDataset(torch.arange(10))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    probe = SamplerProbe()
    probe.install()
    try:
        loader = DataLoader(data, batch_size=2, sampler=sampler)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            list(loader)
        with pytest.raises(ValueError):
            DataLoader(data, shuffle=True, sampler=sampler)
    finally:
        probe.uninstall()
    out = probe.data()
    (rec,) = out["loaders"]
    assert rec["sampler"]["seed"] == 3 and rec["sampler"]["rank"] == 1 and rec["sampler"]["total_size"] == 10
    assert [e["sampler_epoch"] for e in rec["epochs"]] == [0, 1] and out["set_epoch_calls"] == 2
    assert out["init_conflicts"][0]["sampler"] == "DistributedSampler"


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(12.0).reshape(6, 2))


def test_iterable_dataset_samples_are_hashed():
    probe = SamplerProbe()
    probe.install()
    try:
        rows = list(DataLoader(_Stream(), batch_size=3))
    finally:
        probe.uninstall()
    (rec,) = probe.data()["loaders"]
    assert rec["iterable"] and len(rows) == 2
    hashes = rec["epochs"][0]["sample_hashes"]
    assert len(hashes) == 6 and len(set(hashes)) == 6


class _Forever(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        while True:
            yield from range(self.n)


def test_an_infinite_sampler_is_recorded_up_to_the_cap(monkeypatch):
    import ddpdoctor.probes.sampler as sampler_mod

    monkeypatch.setattr(sampler_mod, "MAX_INDICES", 40)
    data = TensorDataset(torch.arange(7))
    probe = SamplerProbe()
    probe.install()
    try:
        it = iter(DataLoader(data, batch_size=3, sampler=_Forever(7)))
        first = [next(it)[0].tolist() for _ in range(20)]  # past the cap: the rest is streamed
    finally:
        probe.uninstall()
    flat = [i for b in first for i in b]
    assert flat == [i % 7 for i in range(60)]
    (epoch,) = probe.data()["loaders"][0]["epochs"]
    assert epoch["truncated"] and epoch["batches"] is None and epoch["indices"] == flat[:40]  # 14 batches drawn, 40 kept


def test_a_peek_is_not_an_epoch_and_its_indices_are_dropped():
    data = TensorDataset(torch.arange(8))
    probe = SamplerProbe()
    probe.install()
    try:
        loader = DataLoader(data, batch_size=2, shuffle=True)
        next(iter(loader))  # the tutorial's batch-size peek
        for _ in loader:
            probe.on_step(1)  # every batch feeds a training step
    finally:
        probe.uninstall()
    peek, epoch = probe.data()["loaders"][0]["epochs"]
    assert peek["peek"] is True and "indices" not in peek and peek["batches_yielded"] == 1
    assert epoch["steps"] == 4 and len(epoch["indices"]) == 8 and "peek" not in epoch
    assert probe.steps_to_second_epoch() == 1  # epoch 0 is exhausted: the next step starts epoch 1


def test_dataset_fingerprint_leaves_random_streams_alone_and_spots_varying_samples():
    import random

    from ddpdoctor.probes.dataset_hashes import dataset_fingerprint

    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.rand(2) + i, random.random()

    torch.manual_seed(3)
    random.seed(3)
    expected = (torch.rand(1).item(), random.random())
    torch.manual_seed(3)
    random.seed(3)
    fp = dataset_fingerprint(Augmented())  # loads samples (drawing random numbers) four times
    assert (torch.rand(1).item(), random.random()) == expected  # the script's streams are where they were
    assert fp["len"] == 4 and fp["varies"] is True
    same = dataset_fingerprint(TensorDataset(torch.arange(5)))
    assert same == dataset_fingerprint(TensorDataset(torch.arange(5))) and "varies" not in same
    assert same["first"] != dataset_fingerprint(TensorDataset(torch.arange(1, 6)))["first"]
