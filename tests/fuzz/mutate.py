"""Structural mutations for the fuzz suite: a JSON document with values replaced by another type, deleted, nested
deeply or resized; and any file's bytes damaged on the way to disk (truncated, gzipped, corrupt gzip, invalid UTF-8,
UTF-16). Driven by a random.Random, so hypothesis (st.randoms()) and the bulk run-directory test share them."""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
import re
from typing import Any

from hypothesis import HealthCheck, settings

# Small in CI (deterministic), large on demand: DDPDOCTOR_FUZZ_EXAMPLES=1000 pytest tests/fuzz
EXAMPLES = int(os.environ.get("DDPDOCTOR_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

ODD_SCALARS: list[Any] = [None, True, False, 0, -1, 1, 2**63, -(2**63) - 1, 2**70, -0.0, 0.5, 1e308, -1e308, 5e-324,
                          float("nan"), float("inf"), float("-inf"), "", "0x", "1", "-5", "nan", "inf", "rank1",
                          "\x1b]0;title\x07", "é" * 3, "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace")]


def random_value(rnd: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type (containers up to 3 deep)."""
    kind = rnd.randrange(8 if depth < 3 else 5)
    if kind <= 2:
        return rnd.choice(ODD_SCALARS)
    if kind == 3:
        return rnd.randint(-(2**40), 2**40)
    if kind == 4:
        return "".join(chr(rnd.randint(1, 0x2FF)) for _ in range(rnd.randint(0, 12)))
    if kind in (5, 6):
        return [random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {rnd.choice(["0", "1", "x", "-1", "rank", "steps", ""]): random_value(rnd, depth + 1)
            for _ in range(rnd.randint(0, 3))}


def paths(doc: Any, limit: int = 4000) -> list[tuple]:
    """Every path to a value inside ``doc`` (the root included), breadth first, at most ``limit``."""
    out: list[tuple] = [()]
    queue: list[tuple[tuple, Any]] = [((), doc)]
    while queue and len(out) < limit:
        p, node = queue.pop(0)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            out.append(p + (k,))
            queue.append((p + (k,), v))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


SWAP = {dict: [], list: {}, str: 0, int: "0", float: "1.5", bool: 1, type(None): False}


def mutate(seed: Any, rnd: random.Random, changes: int | None = None) -> Any:
    """``seed`` (left untouched) with one to three structural changes."""
    doc = copy.deepcopy(seed)
    for _ in range(changes or rnd.randint(1, 3)):
        all_paths = paths(doc)
        # Leaves deep inside are where a wrong type hides longest: prefer them half of the time.
        path = all_paths[rnd.randrange(len(all_paths))] if rnd.random() < 0.5 else max(
            rnd.sample(all_paths, min(3, len(all_paths))), key=len)
        old = _get(doc, path)
        op = rnd.choice(["replace", "replace", "replace", "delete", "wrap", "deep", "stringify", "grow", "empty",
                         "swap", "swap"])
        if op == "replace":
            doc = _set(doc, path, random_value(rnd))
        elif op == "delete":
            if path:
                del _get(doc, path[:-1])[path[-1]]
            else:
                doc = {}
        elif op == "wrap":
            doc = _set(doc, path, [old])
        elif op == "deep":  # a marker that dumps() writes as that many nested arrays (json.dumps would recurse)
            doc = _set(doc, path, f"{DEEP}{rnd.choice([50, 300, 5000, 200_000])}")
        elif op == "stringify":
            doc = _set(doc, path, json.dumps(old) if not isinstance(old, str) else old + "x")
        elif op == "grow" and len(json.dumps(old, default=str)) < 2000:  # sizes, not gigabytes
            doc = _set(doc, path, old * 500 if isinstance(old, str) else [old] * rnd.choice([2, 100, 5000]))
        elif op == "empty":
            doc = _set(doc, path, type(old)() if isinstance(old, (list, dict, str)) else None)
        else:
            doc = _set(doc, path, SWAP.get(type(old)))
    return doc


DEEP = "\x00deep:"
_DEEP_JSON = re.compile(rb'"\\u0000deep:(\d+)"')


def dumps(doc: Any) -> bytes:
    """JSON as Python writes it (NaN and Infinity included, as json.dumps does)."""
    text = json.dumps(doc, default=str).encode()
    budget = [2]  # deep markers expanded (a grown list of them would be gigabytes); the rest are []

    def deep(m: re.Match[bytes]) -> bytes:
        budget[0] -= 1
        n = int(m.group(1)) if budget[0] >= 0 else 1
        return b"[" * n + b"]" * n

    return _DEEP_JSON.sub(deep, text)


def damage(data: bytes, rnd: random.Random, gzip_ok: bool = True) -> bytes:
    """``data`` as is (often), or damaged on the way to disk."""
    hows = ["plain", "plain", "plain", "truncate", "flip", "utf8", "utf16", "bom", "empty", "nul"]
    how = rnd.choice(hows + (["gzip", "gzip_cut", "gzip_flip"] if gzip_ok else []))
    at = rnd.randrange(max(len(data), 1))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:] if data else b"\xff"
    if how == "utf8":
        return data[:at] + b"\xff\xfe\xc3" + data[at:]
    if how == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "empty":
        return b""
    if how == "nul":
        return data[:at] + b"\x00" * 64 + data[at:]
    if how == "gzip":
        return gzip.compress(data)
    z = bytearray(gzip.compress(data))
    if how == "gzip_cut":
        return bytes(z[: rnd.randrange(len(z))])
    if how == "gzip_flip":
        i = rnd.randrange(10, len(z)) if len(z) > 10 else 0
        z[i] ^= 0xFF
    return bytes(z)
