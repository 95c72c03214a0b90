"""Compare the structure of two run directories' JSON files: key paths in their order and value types (not values).

    python scripts/rank_file_shapes.py RUN_A RUN_B

For a change that must leave what the ranks write byte-compatible (issue 25's typing of probes/ and preflight/):
run the same job with the old and the new code (e.g. ``PYTHONPATH=<old checkout> python -m ddpdoctor ...``) and
compare. Exit 1 when a file differs or is missing from RUN_B. The monitor's snapshots (heartbeats.json, live/) hold
whichever beat came last, so their optional keys differ from run to run; torchrun/ is named by a random run id."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Shape = list[tuple[str, str, Any]]


def shape(value: Any, path: str = "$") -> Shape:
    """(path, type, keys in order | non-empty) for every node; lists by their first three items."""
    if isinstance(value, dict):
        out: Shape = [(path, "dict", tuple(value))]
        for key, item in value.items():
            out += shape(item, f"{path}.{key}")
        return out
    if isinstance(value, list):
        out = [(path, "list", bool(value))]
        for item in value[:3]:
            out += shape(item, f"{path}[]")
        return out
    return [(path, "null" if value is None else type(value).__name__, None)]


def main(a: Path, b: Path) -> int:
    files = sorted(p for p in a.rglob("*.json")
                   if not p.is_symlink() and not {"traces", "torchrun"} & set(p.relative_to(a).parts))
    bad = 0
    for f in files:
        rel = f.relative_to(a)
        g = b / rel
        if not g.is_file():
            print(f"missing in {b}: {rel}")
            bad += 1
            continue
        sa, sb = shape(json.loads(f.read_text())), shape(json.loads(g.read_text()))
        if sa == sb:
            print(f"same  {rel} ({len(sa)} nodes)")
            continue
        bad += 1
        first = next(((x, y) for x, y in zip(sa, sb, strict=False) if x != y), (sa[len(sb):][:1], sb[len(sa):][:1]))
        print(f"DIFF  {rel}: {first[0]} vs {first[1]}")
    print(f"{len(files)} files, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
