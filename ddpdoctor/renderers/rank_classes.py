"""Ranks grouped for the views of big jobs: ranks whose step time is alike become one class (count, ranks as ranges,
the median of each figure), and the few ranks that matter (stragglers, the slowest, the fastest) keep their own row,
so that a 1,024-rank report reads on one screen. Pure: the report's "ranks" section in, rows out; the terminal and
HTML renderers call it (job/grouping.py does the same for hangs)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal, get_args

from ddpdoctor.job.grouping import rank_ranges
from ddpdoctor.reports.perf_json import RankJson, StepTimeJson

# Up to this many ranks every rank has its row; above it, classes.
MAX_RANK_ROWS = 32
# Step times within 5% of the job's median are "typical"; beyond, classes 10% wide (5-15%, 15-25%, ...), the last
# open-ended: a few classes at any rank count.
TYPICAL_PCT = 5.0
BAND_PCT = 10.0
MAX_BAND = 5
# Numeric figures of a rank row whose class row shows their median over the class.
Figure = Literal["compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us", "data_wait_us", "memory_us",
                 "overlap_pct", "exposed_comm_pct", "backward_us"]
_FIGURES: tuple[Figure, ...] = get_args(Figure)


@dataclass
class RankRow:
    """One row of a grouped view: a single rank that matters, or a class of alike ranks."""

    label: str  # "straggler", "slowest", "fastest", or the class: "typical", "5-15% slower", ...
    ranks: list[int]
    row: RankJson  # one entry of the "ranks" section (a class: the medians over its ranks)

    @property
    def ranges(self) -> str:
        return rank_ranges(self.ranks)

    def short_ranges(self, width: int = 20) -> str:
        return ranges_text(self.ranks, width)


def ranges_text(ranks: list[int], width: int = 20) -> str:
    """Ranks as ranges, cut to ``width`` characters, with the count when more than one: "0-76,78-1023 (1023)"."""
    text = rank_ranges(ranks)
    n = len(set(ranks))
    if n <= 1:
        return text
    if len(text) > width:
        text = text[: max(1, width - 1)].rsplit(",", 1)[0] + ",…"
    return f"{text} ({n})"


def _step_us(r: RankJson) -> float | None:
    v = (r.get("step_time_us") or {}).get("median")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _key_figure(r: RankJson, stepless: bool) -> float | None:
    """What ranks are compared by: the median step time, or, without steps, the communication time."""
    if stepless:
        v = r.get("comm_us")
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
    return _step_us(r)


def band(value: float | None, median: float) -> int:
    """0 within TYPICAL_PCT of the median; +k / -k for the k-th BAND_PCT-wide band slower / faster."""
    if value is None or median <= 0:
        return 0
    rel = 100.0 * (value - median) / median
    if abs(rel) <= TYPICAL_PCT:
        return 0
    k = min(MAX_BAND, 1 + int((abs(rel) - TYPICAL_PCT) // BAND_PCT))
    return k if rel > 0 else -k


def band_label(k: int, stepless: bool) -> str:
    """"typical", "5-15% slower", "45%+ faster" (without steps: "more / less comm")."""
    if k == 0:
        return "typical"
    lo = TYPICAL_PCT + (abs(k) - 1) * BAND_PCT
    side = ("more comm" if k > 0 else "less comm") if stepless else ("slower" if k > 0 else "faster")
    span = f"{lo:g}%+" if abs(k) == MAX_BAND else f"{lo:g}-{lo + BAND_PCT:g}%"
    return f"{span} {side}"


def legend(stepless: bool) -> str:
    what = "communication time" if stepless else "median step time"
    return (f"ranks grouped by {what} against the job's median (typical: within {TYPICAL_PCT:g}%), each class "
            "showing the median of its ranks")


def _median_row(members: list[RankJson], ranks: list[int]) -> RankJson:
    """A class as one row: the median of each figure over its ranks (None where no rank has it)."""
    row: RankJson = {"rank": rank_ranges(ranks), "steps": members[0].get("steps"), "device": members[0].get("device")}
    for key in _FIGURES:
        vals = [float(v) for m in members if isinstance(v := m.get(key), (int, float)) and math.isfinite(v)]
        row[key] = statistics.median(vals) if vals else None
    st = [s for m in members if (s := _step_us(m)) is not None]
    p90 = [float(v) for m in members if isinstance(v := (m.get("step_time_us") or {}).get("p90"), (int, float))]
    times: StepTimeJson = {"median": statistics.median(st) if st else None,
                           "p90": statistics.median(p90) if p90 else None, "max": max(st) if st else None,
                           "min": min(st) if st else None}
    row["step_time_us"] = times
    return row


def group_ranks(ranks: list[RankJson], stragglers: list[int],
                max_rows: int = MAX_RANK_ROWS) -> list[RankRow] | None:
    """None when every rank fits (``max_rows`` or fewer); else the ranks that matter, one row each (stragglers, then
    the slowest and the fastest rank), then classes of alike ranks that together hold every rank, fastest first.
    Linear in ranks (one median, one pass)."""
    if len(ranks) <= max_rows:
        return None
    stepless = not any(_step_us(r) for r in ranks)
    values = {int(r["rank"]): _key_figure(r, stepless) for r in ranks}
    known = [v for v in values.values() if v is not None]
    median = statistics.median(known) if known else 0.0
    by_rank = {int(r["rank"]): r for r in ranks}
    singles: list[RankRow] = [RankRow("straggler", [rk], by_rank[rk]) for rk in sorted(stragglers) if rk in by_rank]
    if known:
        slowest = max(values, key=lambda k: (values[k] if values[k] is not None else -math.inf, -k))
        fastest = min(values, key=lambda k: (values[k] if values[k] is not None else math.inf, k))
        for label, rk in (("most communication" if stepless else "slowest", slowest),
                          ("least communication" if stepless else "fastest", fastest)):
            if rk not in stragglers and all(rk not in s.ranks for s in singles):
                singles.append(RankRow(label, [rk], by_rank[rk]))
    classes: dict[tuple[int, object], list[int]] = {}  # (band, steps)
    for rk in sorted(by_rank):
        classes.setdefault((band(values[rk], median), by_rank[rk].get("steps")), []).append(rk)
    several = len({s for _, s in classes}) > 1
    rows = [RankRow(band_label(k, stepless) + (f", {steps} steps" if several else ""), members,
                    _median_row([by_rank[m] for m in members], members))
            for (k, steps), members in sorted(classes.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]
    return singles + rows
