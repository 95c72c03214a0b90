"""The FSDP2 unit table (docs/json.md "fsdp_units"): per unit, time and exposed time per step of each collective
kind, from the rows analyses/fsdp_units.py attributes. Its own module so that results.py reads it without importing
the trace side (which imports results.py)."""

from __future__ import annotations

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.summary_records import UnitCollective


def unit_table(rows: list[UnitCollective], steps: int) -> list[JsonObject]:
    """Per unit, in forward order of its first all-gather: time and exposed time per step of each collective kind,
    mean over ranks and steps (``steps``: recorded steps per rank)."""
    if not rows or steps <= 0:
        return []
    ranks = len({r.rank for r in rows}) or 1
    order: dict[str, float] = {}
    table: dict[str, dict[str, float]] = {}
    flags: dict[str, dict[str, bool]] = {}
    for r in rows:
        order.setdefault(r.unit, r.start_us)
        key = "all_gather_forward" if r.op == "all_gather" and r.phase == "forward" else (
            "all_gather_backward" if r.op == "all_gather" else r.op)
        t = table.setdefault(r.unit, {})
        t[key + "_ms"] = t.get(key + "_ms", 0.0) + r.dur_us
        t[key + "_exposed_ms"] = t.get(key + "_exposed_ms", 0.0) + r.exposed_us
        f = flags.setdefault(r.unit, {"forward_prefetched": False, "first": False, "synchronous": False})
        if r.op == "all_gather" and r.phase == "forward":
            f["forward_prefetched"] = f["forward_prefetched"] or r.prefetched
            f["first"] = f["first"] or r.first
        f["synchronous"] = f["synchronous"] or r.synchronous
    scale = 1e3 * steps * ranks
    waits, culprits = late_peer(rows)
    out: list[JsonObject] = []
    for unit in sorted(table, key=lambda u: order[u]):
        row: JsonObject = {"unit": unit or "(root)"}
        row.update({k: round(v / scale, 3) for k, v in sorted(table[unit].items())})
        row.update(flags[unit])
        row["late_peer_exposed_ms"] = round(waits.get(unit, 0.0) / scale, 3)
        by = culprits.get(unit, {})
        row["late_rank"] = max(by, key=lambda rk: (by[rk], -rk)) if by else None
        out.append(row)
    return out


def late_peer(rows: list[UnitCollective]) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """The ledger's wait-for-peer part, per unit (docs/metrics.md, "FSDP2 units"): the k-th collective of one kind
    (op, phase) of a unit in a step is one collective on every rank; a rank that started it before the last rank
    did waited for that rank, from its own start to the last start, cut at its own end, and the part of that wait
    that was exposed (no compute) is the unit's late-peer time: min(wait, exposed). Returns per unit the summed
    exposed wait (us) and per unit the wait each late rank caused (us). Start times are on the reference clock
    (crossrank.shift)."""
    groups: dict[tuple[object, ...], dict[int, UnitCollective]] = {}
    seen: dict[tuple[object, ...], int] = {}
    for r in rows:
        base = (r.step, r.unit, r.op, r.phase, r.rank)
        k = seen.get(base, 0)
        seen[base] = k + 1
        groups.setdefault((r.step, r.unit, r.op, r.phase, k), {})[r.rank] = r
    waits: dict[str, float] = {}
    culprits: dict[str, dict[int, float]] = {}
    for by_rank in groups.values():
        if len(by_rank) < 2:
            continue
        last = max(by_rank, key=lambda rk: (by_rank[rk].start_us, rk))
        t_last = by_rank[last].start_us
        for rk, r in by_rank.items():
            wait = min(max(0.0, t_last - r.start_us), r.dur_us)
            exposed = min(wait, r.exposed_us)
            if rk == last or exposed <= 0.0:
                continue
            waits[r.unit] = waits.get(r.unit, 0.0) + exposed
            per = culprits.setdefault(r.unit, {})
            per[last] = per.get(last, 0.0) + exposed
    return waits, culprits
