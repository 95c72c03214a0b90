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


ODD_TEXT = ["", "\x1b[2J\x1b]0;pwned\x07", "\x00\x01", "é€𝄞", "9" * 400, "-1", "nan", "inf", "1e999", "0x1f",
            "[rank", "rank-1]:", "Traceback (most recent call last):", '  File "", line -1, in ', "NCCL INFO",
            "<", "</system>", "&#0;", "&amp;", "]]>"]


def mutate_lines(text: str, rnd: random.Random, changes: int | None = None) -> str:
    """A log with lines deleted, repeated, swapped, cut or spliced with odd text."""
    lines = text.splitlines() or [""]
    for _ in range(changes or rnd.randint(1, 6)):
        i = rnd.randrange(len(lines))
        op = rnd.choice(["delete", "repeat", "swap", "cut", "splice", "splice", "numbers", "huge"])
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "repeat":
            lines[i:i] = [lines[i]] * rnd.choice([2, 50, 2000])
        elif op == "swap":
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "cut":
            lines[i] = lines[i][: rnd.randrange(len(lines[i]) + 1)]
        elif op == "splice":
            at = rnd.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at] + rnd.choice(ODD_TEXT) + lines[i][at:]
        elif op == "numbers":  # every number on the line replaced: where parsers convert text to int/float
            lines[i] = re.sub(r"\d+(\.\d+)?", lambda m: rnd.choice(["-1", "1e999", "nan", "99999999999999999999",
                                                                     "0x10", "", "٣"]), lines[i])
        else:
            lines[i] = lines[i] * rnd.choice([100, 2000])
    return "\n".join(lines)


def mutate_xml(text: str, rnd: random.Random) -> str:
    """Topology XML with attribute values replaced (numbers, inf, nan, entities), tags cut or repeated."""
    for _ in range(rnd.randint(1, 6)):
        op = rnd.choice(["attr", "attr", "attr", "cut", "lines"])
        if op == "attr":
            values = list(re.finditer(r'="([^"]*)"', text))
            if values:
                m = rnd.choice(values)
                new = rnd.choice(["inf", "-inf", "nan", "1e999", "-1", "", "0x", "99999999999999999999", "&amp;",
                                  "&lt;", "&#x0;", "a" * 1000, "٣", "1.5", "0"])
                text = text[: m.start(1)] + new + text[m.end(1):]
        elif op == "cut":
            text = text[: rnd.randrange(len(text) + 1)]
        else:
            text = mutate_lines(text, rnd, 1)
    return text
