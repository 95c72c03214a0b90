"""Every rank's stack grouped: ranks with the same main-thread stack form one class (ranks as ranges), smallest first,
so the odd rank out is read before the 1,000 that agree."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ddpdoctor.job.grouping import rank_ranges, stack_key
from ddpdoctor.live.records import StackClass

__all__ = ["group_stacks", "main_thread", "rank_ranges", "stacks_text"]

_THREAD = re.compile(r"^Thread (0x[0-9a-fA-F]+|\d+)", re.M)


def main_thread(stack: str) -> str:
    """The main thread's part of a multi-thread dump, without its header (thread ids differ between ranks)."""
    blocks = [b for b in _THREAD.split(stack) if b.strip()] if _THREAD.search(stack) else [stack]
    main = next((b for b in blocks if "MainThread" in b.split("\n", 1)[0]), None)
    text = main if main is not None else stack
    lines = text.strip().splitlines()
    if lines and "MainThread" in lines[0]:
        lines = lines[1:]
    return "\n".join(line.rstrip() for line in lines)


def group_stacks(stacks: dict[int, str | None], beats: Mapping[int, Mapping[str, object]]) -> list[StackClass]:
    """Classes of ranks sharing a main-thread stack and phase: count, ranks (ranges), one representative stack.
    ``beats``: each rank's last beat as the monitors wrote it (its "phase" and "step" are read, untrusted)."""
    classes: dict[tuple[str, str], list[int]] = {}
    for r, s in stacks.items():
        key = (stack_key(main_thread(s)) if s else "(no stack could be taken)", str((beats.get(r) or {}).get("phase")))
        classes.setdefault(key, []).append(r)
    groups: list[StackClass] = [{"count": len(rs), "ranks": rank_ranges(rs), "phase": phase, "steps": sorted(
        {step for r in rs if isinstance(step := (beats.get(r) or {}).get("step"), int)})[:5],
        "stack": stack} for (stack, phase), rs in classes.items()]
    return sorted(groups, key=lambda g: (g["count"], g["ranks"]))


def stacks_text(groups: list[StackClass]) -> str:
    lines = [f"{len(groups)} class(es) of stacks, smallest first", ""]
    for g in groups:
        lines += [f"--- {g['count']} rank(s): {g['ranks']}; phase {g['phase']}; step {g['steps']} ---", g["stack"], ""]
    return "\n".join(lines)
