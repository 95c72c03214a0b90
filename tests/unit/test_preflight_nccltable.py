"""nccl-tests table: busbw formula by hand, our format parses back, and real all_reduce_perf output parses."""

from __future__ import annotations

import pytest

from ddpdoctor.preflight.nccltable import (
    average_busbw,
    busbw_factor,
    format_table,
    make_row,
    parse_table,
    plateau_busbw,
    sweep_sizes,
)
from tests.conftest import shared_path

# Written by hand from the nccl-tests grammar (older header with an "error" column, no root).
OLD_HEADER = """\
# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid   1320 on nodeA device  0 [0x00] Tesla V100-SXM2-16GB
#   Rank  1 Pid   1321 on nodeB device  0 [0x00] Tesla V100-SXM2-16GB
#
#                                                       out-of-place                       in-place
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum    20.00    0.05    0.05  0e+00    21.00    0.05    0.05  0e+00
        2048           512     float     sum    20.48    0.10    0.10  0e+00    20.00    0.10    0.10  0e+00
        4096          1024     float     sum    40.96    0.10    0.10  0e+00    40.00    0.10    0.10  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.0833333
"""


def test_busbw_factor_by_hand():
    assert busbw_factor(1) == 0.0
    assert busbw_factor(2) == 1.0
    assert busbw_factor(8) == 1.75
    assert busbw_factor(16) == 1.875
    with pytest.raises(ValueError):
        busbw_factor(0)


def test_make_row_by_hand():
    # 1 MiB in 1000 us: 1048576 / 1e6 = 1.048576 GB/s algbw; 8 ranks -> x1.75 = 1.835008 GB/s busbw
    row = make_row(1 << 20, 1000.0, 8)
    assert row.count == 262144 and row.dtype == "float" and row.redop == "sum"
    assert row.algbw_gbps == pytest.approx(1.048576)
    assert row.busbw_gbps == pytest.approx(1.835008)


def test_sweep_sizes_and_plateau():
    assert sweep_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert len(sweep_sizes(1024, 256 << 20)) == 19  # 1 KB .. 256 MB
    rows = [make_row(s, t, 2) for s, t in [(1000, 10.0), (2000, 1.0), (4000, 4.0), (8000, 4.0), (16000, 16.0)]]
    # busbw (n=2, factor 1): 0.1, 2.0, 1.0, 2.0, 1.0 -> the best of the 3 largest is 2.0, the mean is 1.22
    assert plateau_busbw(rows) == pytest.approx(2.0)
    assert average_busbw(rows) == pytest.approx(6.1 / 5)
    assert plateau_busbw([]) is None


def test_format_parses_back():
    rows = [make_row(s, t, 4) for s, t in [(1024, 25.5), (1 << 20, 812.25), (64 << 20, 123456.0)]]
    parsed = parse_table(format_table(rows))
    assert [r.size_bytes for r in parsed.rows] == [1024, 1 << 20, 64 << 20]
    for got, want in zip(parsed.rows, rows, strict=True):
        assert got.count == want.count
        assert got.time_us == pytest.approx(want.time_us, rel=1e-3)
        assert got.busbw_gbps == pytest.approx(want.busbw_gbps, abs=0.006)
    assert parsed.avg_busbw_gbps == pytest.approx(average_busbw(rows), rel=1e-5)


def test_parse_old_header():
    parsed = parse_table(OLD_HEADER)
    assert parsed.ranks == 2
    assert [r.size_bytes for r in parsed.rows] == [1024, 2048, 4096]
    assert [r.time_us for r in parsed.rows] == [20.0, 20.48, 40.96]  # out-of-place column, not in-place
    assert parsed.avg_busbw_gbps == pytest.approx(0.0833333)


def _check_relations(parsed, n):
    factor = busbw_factor(n)
    for r in parsed.rows:
        assert r.count * 4 == r.size_bytes
        if r.algbw_gbps >= 1:  # printed with 2 decimals: only check where rounding is small
            assert r.busbw_gbps == pytest.approx(r.algbw_gbps * factor, rel=0.01)
            assert r.algbw_gbps == pytest.approx(r.size_bytes / (r.time_us * 1e3), rel=0.01)


def test_shared_h200_16_ranks():
    parsed = parse_table(shared_path("nccl", "nccl_tests", "01_nccltests256_h200_2node_baremetal_vs_vm.txt").read_text())
    assert parsed.ranks == 16
    assert parsed.rows[0].size_bytes == 1073741824 and parsed.rows[0].busbw_gbps == 458.65
    assert all(r.wrong == 0 for r in parsed.rows)
    _check_relations(parsed, 16)


def test_shared_a3mega_full_sweep():
    parsed = parse_table(shared_path("nccl", "nccl_tests", "02_gcp_a3mega_h100_2node_tcpxo_full_sweep.txt").read_text())
    assert parsed.ranks == 16
    assert parsed.rows[0].size_bytes == 8 and parsed.rows[-1].size_bytes == 8589934592
    assert parsed.avg_busbw_gbps == pytest.approx(70.742, abs=1e-3)
    # the plateau (large messages) is far above the sweep average that small messages drag down
    assert plateau_busbw(parsed.rows) == pytest.approx(338.8, abs=0.1)
    _check_relations(parsed, 16)


def test_shared_two_gpus_busbw_equals_algbw():
    parsed = parse_table(shared_path("nccl", "nccl_tests", "03_nccl1161_2x_h100_pcie_nvlink_bridge.txt").read_text())
    assert [r.size_bytes for r in parsed.rows] == [1073741824, 2147483648]
    assert all(r.busbw_gbps == r.algbw_gbps for r in parsed.rows)  # n = 2: factor 1
