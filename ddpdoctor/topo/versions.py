"""NCCL version fingerprints: which release range a line's wording implies (../shared/nccl/GRAMMAR.md section 7)."""

from __future__ import annotations

import re

Version = tuple[int, int]
ANY_HIGH: Version = (2, 99)

# (pattern on the message after "NCCL INFO ", lowest, highest) - only wordings that changed at a known release.
_FINGERPRINTS: list[tuple[re.Pattern[str], Version, Version]] = [
    (re.compile(r"^NCCL version (\d+)\.(\d+)\."), (0, 0), (0, 0)),  # exact; handled in version_of_line
    (re.compile(r"^NET/Plugin : No plugin found \([^)]*\), using internal implementation"), (2, 0), (2, 16)),
    (re.compile(r"^NET/Plugin : Plugin load \("), (2, 17), (2, 18)),
    (re.compile(r"^NET/Plugin : No plugin found, using internal implementation"), (2, 17), (2, 18)),
    (re.compile(r"^NET/Plugin : dlerror="), (2, 19), (2, 20)),
    (re.compile(r"^Using non-device net plugin version 0"), (2, 19), (2, 21)),
    (re.compile(r"^NET/Plugin: Using internal network plugin"), (2, 21), (2, 21)),
    (re.compile(r"^NET/Plugin: Could not find:.*Using internal network plugin\."), (2, 22), (2, 25)),
    (re.compile(r"^NET/Plugin: Could not find:.*Using internal net plugin\."), (2, 26), ANY_HIGH),
    (re.compile(r"^Bootstrap : Using"), (2, 0), (2, 23)),
    (re.compile(r"^Bootstrap: Using"), (2, 24), ANY_HIGH),
    (re.compile(r"nRanks \d+ nNodes \d+ localRanks \d+"), (2, 20), ANY_HIGH),
    (re.compile(r"^comm \S+ rank \d+ nranks \d+ cudaDev"), (2, 0), (2, 20)),
    (re.compile(r"^ncclComm\w+ comm \S+ rank \d+ nranks"), (2, 21), ANY_HIGH),
    (re.compile(r"\(NVLS_NCHANNELS \d+\)"), (2, 27), ANY_HIGH),
    (re.compile(r"^Initialized NET plugin"), (2, 27), ANY_HIGH),
    (re.compile(r"via direct shared memory"), (2, 0), (2, 12)),
    (re.compile(r"=== System : maxWidth"), (2, 0), (2, 13)),
    (re.compile(r"=== System : maxBw"), (2, 14), ANY_HIGH),
    (re.compile(r"\d+ coll channels, \d+ collnet channels, \d+ nvls channels"), (2, 20), ANY_HIGH),
    (re.compile(r"^\d+ coll channels, \d+ nvls channels, \d+ p2p channels"), (2, 17), (2, 19)),
    (re.compile(r"^\d+ coll channels, \d+ p2p channels, \d+ p2p channels per peer"), (2, 10), (2, 16)),
    (re.compile(r"^Init timings"), (2, 22), ANY_HIGH),
    (re.compile(r"^CC (On|Off), workFifoBytes"), (2, 24), ANY_HIGH),
    (re.compile(r"use ring PXN \d+ GDR"), (2, 24), ANY_HIGH),
]
_EXACT = re.compile(r"^NCCL version (\d+)\.(\d+)\.")


def version_of_line(msg: str) -> tuple[Version, Version] | None:
    """The (lowest, highest) NCCL major.minor this message's wording allows, or None when it says nothing."""
    m = _EXACT.match(msg)
    if m:
        v = (int(m.group(1)), int(m.group(2)))
        return v, v
    for pattern, lo, hi in _FINGERPRINTS[1:]:
        if pattern.search(msg):
            return lo, hi
    return None


def parse_version(text: str) -> Version | None:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def intersect(ranges: list[tuple[Version, Version]]) -> tuple[Version, Version] | None:
    """The range every fingerprint allows, or None when they contradict each other (logs of several runs)."""
    if not ranges:
        return None
    lo = max(r[0] for r in ranges)
    hi = min(r[1] for r in ranges)
    return (lo, hi) if lo <= hi else None


def fmt(v: Version) -> str:
    return "2.30+" if v == ANY_HIGH else f"{v[0]}.{v[1]}"


def fmt_range(r: tuple[Version, Version]) -> str:
    lo, hi = r
    if lo == hi:
        return fmt(lo)
    if hi == ANY_HIGH:
        return f">={fmt(lo)}"
    if lo == (2, 0):
        return f"<={fmt(hi)}"
    return f"{fmt(lo)}-{fmt(hi)}"
