"""Reduce before you show: ranks that share a collective state and a Python stack become one class (count, ranks
as ranges like ``0-511,513-1023``, one representative stack), outliers first, for the console, JSON and hang.txt."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpdoctor.findings.hang import RankPosition
from ddpdoctor.rundir.records import RankClassDoc


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8`` (sorted, duplicates dropped); ``-`` for none."""
    rs = sorted(set(ranks))
    if not rs:
        return "-"
    parts = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def parse_ranges(text: str) -> list[int]:
    """The inverse of rank_ranges."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part or part == "-":
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


# What differs between two ranks' dumps of the same stack: process and thread ids, addresses, the rank's own pid.
_NOISE = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"\b(Process|Thread|pid|PID) \d+"), r"\1 ?"),
    (re.compile(r"\(idle\)|\(active\)|\(active\+gil\)|\(gil\)"), ""),
    (re.compile(r"[ \t]+$", re.M), ""),
)


def stack_key(stack: str | None) -> str:
    """A stack with what differs between ranks removed, so equal stacks compare equal."""
    if not stack:
        return ""
    for pat, rep in _NOISE:
        stack = pat.sub(rep, stack)
    return stack.strip()


@dataclass
class RankClass:
    """Ranks in the same state with the same stack."""

    state: str  # one line: "in allreduce #12 on default_pg at train.py:40, phase backward, step 6"
    ranks: list[int]
    stack: str | None  # the representative's stack as it was dumped
    representative: int
    nodes: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.ranks)

    @property
    def ranges(self) -> str:
        return rank_ranges(self.ranks)

    def to_json(self) -> RankClassDoc:
        return {"count": self.count, "ranks": self.ranges, "state": self.state, "representative": self.representative,
                "nodes": rank_ranges(self.nodes), "stack": self.stack}


def describe(p: RankPosition) -> str:
    """One rank's state in words, without its rank number (so equal states group)."""
    if p.state == "in-collective":
        where = f"in {p.op} #{p.seq} on {p.group}"
    elif p.state == "exited":
        where = f"exited (code {p.exit_code})"
    elif p.state == "no-heartbeat":
        return "no heartbeat (never reported, or its node was lost)"
    else:
        where = "outside any collective"
    bits = [f"{where} at {p.call_site}" if p.call_site else where]
    if p.phase:
        bits.append(f"phase {p.phase}")
    if p.step is not None:
        bits.append(f"step {p.step}")
    return ", ".join(bits)


def group(positions: dict[int, RankPosition], stacks: dict[int, str | None] | None = None,
          node_of: dict[int, int] | None = None) -> list[RankClass]:
    """Equivalence classes of ranks by (state, stack), smallest first (the outliers), then by first rank."""
    stacks = stacks or {}
    classes: dict[tuple[str, str], RankClass] = {}
    for r in sorted(positions):
        state = describe(positions[r])
        key = (state, stack_key(stacks.get(r)))
        c = classes.get(key)
        if c is None:
            classes[key] = c = RankClass(state, [], stacks.get(r), r)
        c.ranks.append(r)
        if node_of and r in node_of:
            c.nodes.append(node_of[r])
    return sorted(classes.values(), key=lambda c: (c.count, c.ranks[0]))


def render(classes: list[RankClass], stack_lines: int = 12, with_stacks: bool = True) -> str:
    """The classes as text: one header line per class, then its representative stack (its last lines)."""
    total = sum(c.count for c in classes)
    lines = [f"{len(classes)} class(es) of {total} rank(s), outliers first:"]
    for c in classes:
        nodes = f" on node(s) {rank_ranges(c.nodes)}" if c.nodes else ""
        lines.append(f"  [{c.count} rank(s): {c.ranges}{nodes}] {c.state}")
        if with_stacks and c.stack:
            lines += [f"      {ln}" for ln in main_thread(c.stack, stack_lines)]
            lines.append(f"      (stack of rank {c.representative})")
    return "\n".join(lines) + "\n"


_PYSPY_MAIN = re.compile(r'^Thread \S+ [^\n]*"MainThread"\s*$', re.M)


def main_thread(stack: str, n: int = 12) -> list[str]:
    """The lines of ``stack`` worth showing: py-spy's MainThread block, innermost ``n`` frames first; any other dump
    (innermost last) its last ``n`` lines."""
    m = _PYSPY_MAIN.search(stack)
    if m:
        block = stack[m.start():].splitlines()
        end = next((i for i, ln in enumerate(block[1:], 1) if ln.strip() and not ln.startswith(" ")), len(block))
        body = [ln for ln in block[:end] if ln.strip()]
        shown = body[:n + 1]
        return shown + ([f"    ... ({len(body) - len(shown)} outer frame(s))"] if len(body) > len(shown) else [])
    body = [ln for ln in stack.rstrip().splitlines() if ln.strip()]
    shown = body[-n:]
    return ([f"... ({len(body) - len(shown)} earlier line(s))"] if len(body) > len(shown) else []) + shown
