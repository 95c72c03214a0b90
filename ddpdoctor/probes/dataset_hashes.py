"""Hashes of dataset samples, never the samples: a map-style dataset's fingerprint (its length, first and last
samples, drawn with every random generator's state restored) and the rows an iterable dataset yields."""

from __future__ import annotations

import hashlib
import random
import sys
from typing import Any

import torch

from ddpdoctor.probes.records import DatasetFingerprint


def hash_rows(batch: Any) -> list[str]:
    """One short hash per sample: the rows of the first tensor found in the batch."""
    leaf = batch
    while isinstance(leaf, (list, tuple)) and leaf:
        leaf = leaf[0]
    if isinstance(leaf, dict) and leaf:
        leaf = next(iter(leaf.values()))
    if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
        return []
    rows = leaf.detach().cpu().contiguous()
    return [hashlib.blake2b(r.numpy().tobytes(), digest_size=8).hexdigest() for r in rows]


def _sample_bytes(item: Any, h: Any, depth: int = 0) -> None:
    """Feed one dataset sample into hash ``h``: tensors and arrays by content, plain values by repr."""
    if depth > 6:
        return
    if isinstance(item, torch.Tensor):
        t = item.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(item, (list, tuple)):
        for v in item:
            _sample_bytes(v, h, depth + 1)
    elif isinstance(item, dict):
        for k in sorted(item, key=str):
            h.update(repr(k).encode())
            _sample_bytes(item[k], h, depth + 1)
    elif isinstance(item, (int, float, str, bytes, bool)) or item is None:
        h.update(repr(item).encode())
    elif callable(getattr(item, "tobytes", None)):  # numpy arrays, PIL images
        h.update(item.tobytes())
    else:
        h.update(type(item).__name__.encode())


def _sample_hash(dataset: Any, index: int) -> str:
    h = hashlib.blake2b(digest_size=8)
    _sample_bytes(dataset[index], h)
    return h.hexdigest()


def dataset_fingerprint(dataset: Any) -> DatasetFingerprint:
    """{"len", "first", "last"} of a map-style dataset, or {"len", "error"}; "varies": True when loading the same
    sample twice gives other bytes (random augmentation), which then says nothing across ranks.

    The script's random streams are left exactly as they were: loading a sample may draw from them."""
    n = len(dataset)
    out: DatasetFingerprint = {"len": n}
    if n == 0:
        return out
    np = sys.modules.get("numpy")
    py_state = random.getstate()
    np_state = np.random.get_state() if np is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            first, last = _sample_hash(dataset, 0), _sample_hash(dataset, n - 1)
            again = (_sample_hash(dataset, 0), _sample_hash(dataset, n - 1))
        out.update({"first": first, "last": last})
        if again != (first, last):
            out["varies"] = True
    except Exception as exc:  # noqa: BLE001 - a dataset that cannot be indexed here is simply not fingerprinted
        out["error"] = type(exc).__name__
    finally:
        random.setstate(py_state)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)
    return out
