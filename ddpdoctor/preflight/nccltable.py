"""nccl-tests-style all_reduce tables: the bus-bandwidth formula, our formatter, and a parser for all_reduce_perf output.

Definitions (NVIDIA nccl-tests doc/PERFORMANCE.md):
    algbw = size / time                      (GB/s, 1 GB = 1e9 bytes)
    busbw = algbw * 2 * (n - 1) / n          (all_reduce over n ranks)
busbw is comparable across world sizes: it is the bandwidth each link must carry, so it can be held against
the fabric's speed. The "plateau" is what a checker compares: the best busbw of the three largest sizes,
because the average over a whole sweep is dominated by latency-bound small messages."""

from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import mean

from ddpdoctor.rundir.schema_preflight import BandwidthRow  # the record a preflight.json carries

DTYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8, "int8": 1, "uint8": 1}


def busbw_factor(world_size: int) -> float:
    """all_reduce's bus-bandwidth factor 2(n-1)/n (1.0 for 2 ranks, 1.75 for 8, 1.875 for 16)."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    return 2.0 * (world_size - 1) / world_size


def make_row(size_bytes: int, time_us: float, world_size: int, dtype: str = "float", redop: str = "sum") -> BandwidthRow:
    """A row from a measured time: algbw = bytes / (time_us * 1e3) GB/s, busbw = algbw * 2(n-1)/n."""
    algbw = size_bytes / (time_us * 1e3) if time_us > 0 else 0.0
    return BandwidthRow(
        size_bytes=size_bytes, count=size_bytes // DTYPE_BYTES.get(dtype, 4), dtype=dtype, redop=redop,
        time_us=time_us, algbw_gbps=algbw, busbw_gbps=algbw * busbw_factor(world_size),
    )


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """min, min*factor, ... up to and including max (nccl-tests' -b/-e/-f)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError("need 1 <= min_bytes <= max_bytes and factor >= 2")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def plateau_busbw(rows: list[BandwidthRow], largest: int = 3) -> float | None:
    """The best busbw among the ``largest`` biggest sizes (None without rows)."""
    if not rows:
        return None
    big = sorted(rows, key=lambda r: r.size_bytes)[-largest:]
    return max(r.busbw_gbps for r in big)


def average_busbw(rows: list[BandwidthRow]) -> float | None:
    """nccl-tests' "Avg bus bandwidth": the plain mean of busbw over all sizes."""
    return mean(r.busbw_gbps for r in rows) if rows else None


def _num(value: float) -> str:
    # nccl-tests prints times with 1 decimal below 10 ms and as integers above; bandwidths with 2 decimals.
    return f"{value:.1f}" if value < 1e4 else f"{value:.0f}"


def format_table(rows: list[BandwidthRow], title: str = "all_reduce") -> str:
    """Rows in nccl-tests' layout (out-of-place columns only), with its footer."""
    lines = [
        f"# {title}",
        "#       size         count      type   redop     time   algbw   busbw",
        "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)",
    ]
    for r in rows:
        lines.append(
            f"{r.size_bytes:>12} {r.count:>13} {r.dtype:>9} {r.redop:>7} {_num(r.time_us):>8} "
            f"{r.algbw_gbps:>7.2f} {r.busbw_gbps:>7.2f}"
        )
    avg = average_busbw(rows)
    if avg is not None:
        lines.append(f"# Avg bus bandwidth    : {avg:g}")
    return "\n".join(lines)


_HEADER = re.compile(r"^#\s+size\s+count\s+type\s+(.*)$")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\b")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


@dataclass
class ParsedTable:
    rows: list[BandwidthRow]
    ranks: int | None  # from the "# Using devices" lines, when present
    avg_busbw_gbps: float | None  # the tool's own footer, when present


def parse_table(text: str) -> ParsedTable:
    """Parse all_reduce_perf output (old "error" and new "root/#wrong" headers) or our own table.

    Only the out-of-place columns are kept. Lines that are not table rows (NCCL INFO, prompts) are ignored."""
    columns: list[str] | None = None
    rows: list[BandwidthRow] = []
    ranks: set[int] = set()
    avg: float | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if m := _RANK_LINE.match(stripped):
            ranks.add(int(m.group(1)))
            continue
        if m := _AVG.match(stripped):
            avg = float(m.group(1))
            continue
        if m := _HEADER.match(stripped):
            # The first occurrence of each name is the out-of-place column.
            columns = ["size", "count", "type", *m.group(1).split()]
            continue
        if columns is None or stripped.startswith("#") or not stripped:
            continue
        parts = stripped.split()
        if not parts[0].isdigit() or len(parts) < len(columns) // 2 + 2:
            continue
        try:
            rows.append(_row(columns, parts))
        except (ValueError, IndexError):
            continue
    return ParsedTable(rows=rows, ranks=max(ranks) + 1 if ranks else None, avg_busbw_gbps=avg)


def _row(columns: list[str], parts: list[str]) -> BandwidthRow:
    def col(name: str) -> str:
        return parts[columns.index(name)]

    wrong: int | None = None
    for name in ("#wrong", "error"):
        if name in columns:
            raw = col(name)
            wrong = int(raw) if raw.isdigit() else None
    return BandwidthRow(
        size_bytes=int(col("size")), count=int(col("count")), dtype=col("type"),
        redop=col("redop") if "redop" in columns else "sum",
        time_us=float(col("time")), algbw_gbps=float(col("algbw")), busbw_gbps=float(col("busbw")), wrong=wrong,
    )
