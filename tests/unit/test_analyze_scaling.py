"""analyze is linear in ranks, steps and events: the Python lines it executes (a deterministic count, not wall time)
grow about 8x when its input grows 8x. Inputs are synthetic jobs built from the bundled recorded traces
(ddpdoctor/traces/synthetic.py). A quadratic rule shows as ~64x: the one that scanned every rank's aten::item for
each _local_scalar_dense, the per-rank median of the others in the straggler analysis, or the warm-up prefix that
sorted the rest of the steps for every prefix length."""

from __future__ import annotations

import copy
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ddpdoctor
from ddpdoctor.analyses import crossrank
from ddpdoctor.analyses.pipeline import AnalyzeOptions, analyze_paths
from ddpdoctor.analyses.rank import RankResult
from ddpdoctor.analyses.results import Analysis, SyncCall
from ddpdoctor.analyses.summary import analyze_files
from ddpdoctor.findings.perf_balance import STEP_CV_WARN, warmup_prefix
from ddpdoctor.reports.analyze import assemble as report_for
from ddpdoctor.traces import synthetic
from tests.conftest import SAMPLE_RUN

PKG = str(Path(ddpdoctor.__file__).parent)
# Linear growth is 8x; allowed up to 10x (fixed costs shrink the ratio, log factors of sorting grow it a little).
# Anything quadratic is ~64x.
MAX_GROWTH = 10.0
ITEMS_PER_STEP = 8


def lines_executed(fn: Callable[[], Any]) -> tuple[int, Any]:
    """The number of lines of ddpdoctor's own code that ``fn()`` executes, and its result."""
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(PKG) else None

    old = sys.gettrace()
    sys.settrace(calls)
    try:
        result = fn()
    finally:
        sys.settrace(old)
    return count, result


@pytest.fixture(scope="module")
def sources() -> list[dict[str, Any]]:
    return [synthetic.load_doc(p) for p in sorted((SAMPLE_RUN / "traces").glob("rank*.pt.trace.json.gz"))]


def _analyze(folder: Path) -> Any:
    return report_for(analyze_paths([folder], AnalyzeOptions(workers=1)))


@pytest.fixture(scope="module")
def rank_results() -> list[RankResult]:
    return [analyze_files([p]) for p in sorted((SAMPLE_RUN / "traces").glob("rank*.pt.trace.json.gz"))]


def _job(results: list[RankResult], world: int, slow: int) -> list[RankResult]:
    """``world`` ranks' results from the recorded ones (rank renamed; rank ``slow`` 3 ms late at every collective),
    each step with ITEMS_PER_STEP ``.item()`` calls in backward (aten::item holding aten::_local_scalar_dense), as a loss logged
    inside backward hooks records it (a few scalars logged per step)."""
    out = []
    for rk in range(world):
        r = copy.deepcopy(results[rk % len(results)])
        r.metrics.rank = r.input.rank = rk
        r.metrics.world_size = world
        for x in [*r.calls, *r.buckets, *r.grad_ready]:
            x.rank = rk
        if rk == slow:
            for c in r.calls:
                c.start_us += 3000.0
        for s in r.metrics.per_step:
            t = s.cpu_backward_start_us
            for i in range(ITEMS_PER_STEP if t is not None else 0):
                r.syncs += [SyncCall(rank=rk, step=s.step, name="aten::item", t_us=t + 1.0 + 8 * i, dur_us=5.0),
                            SyncCall(rank=rk, step=s.step, name="aten::_local_scalar_dense", t_us=t + 2.0 + 8 * i,
                                     dur_us=3.0)]
        out.append(r)
    return out


def _joins_and_rules(results: list[RankResult]) -> Any:
    """What analyze does once every rank is reduced (pipeline.analyze_paths after reduce_all, then the findings)."""
    matched = crossrank.match(results)
    offsets, _ = crossrank.clock_offsets(results, matched)
    calls = [c for r in results for c in r.calls]
    a = Analysis(inputs=[r.input for r in results], window="all", ranks=[r.metrics for r in results], calls=calls,
                 buckets=[b for r in results for b in r.buckets], grad_ready=[g for r in results for g in r.grad_ready],
                 syncs=[s for r in results for s in r.syncs], bandwidth=crossrank.bandwidth_fit(calls),
                 matched=matched, stragglers=crossrank.stragglers(results, matched), clock_offsets_us=offsets)
    return report_for(a)


def test_joins_and_rules_8x_ranks_cost_about_8x(rank_results: list[RankResult]) -> None:
    """Per rank, the rules do little, so a term quadratic in ranks shows at 128 ranks (it took 49x at 8x before)."""
    small, large = 16, 128
    n_small, rep_small = lines_executed(lambda: _joins_and_rules(_job(rank_results, small, 5)))
    n_large, rep_large = lines_executed(lambda: _joins_and_rules(_job(rank_results, large, 77)))
    for rep, slow in ((rep_small, 5), (rep_large, 77)):
        ids = {f.id: f for f in rep.findings}
        assert ids["straggler-rank"].ranks == [slow]
        assert ids["sync-in-backward"].evidence["calls"] == {
            "aten::item": 3 * ITEMS_PER_STEP * (small if rep is rep_small else large)}
    growth = n_large / n_small
    print(f"growth {growth:.2f}")
    assert growth <= MAX_GROWTH, f"{large / small:g}x the ranks executed {growth:.1f}x the lines"


def test_whole_pipeline_8x_ranks_cost_about_8x(tmp_path: Path, sources: list[dict[str, Any]]) -> None:
    small, large = 4, 32
    synthetic.write_job(sources, small, tmp_path / "small", slow_rank=1, late_us=3000.0)
    synthetic.write_job(sources, large, tmp_path / "large", slow_rank=9, late_us=3000.0)
    n_small, rep_small = lines_executed(lambda: _analyze(tmp_path / "small"))
    n_large, rep_large = lines_executed(lambda: _analyze(tmp_path / "large"))
    # The synthetic jobs are real inputs: every rank read, the late rank named at both sizes.
    assert len(rep_small.sections["ranks"]) == small and len(rep_large.sections["ranks"]) == large
    assert rep_small.sections["stragglers"]["ranks"] == [1]
    assert rep_large.sections["stragglers"]["ranks"] == [9]
    growth = n_large / n_small
    print(f"growth {growth:.2f}")
    assert growth <= MAX_GROWTH, f"{large / small:g}x the ranks executed {growth:.1f}x the lines"


def test_steps_8x_cost_about_8x(tmp_path: Path, sources: list[dict[str, Any]]) -> None:
    counts = {}
    for copies in (2, 16):
        folder = tmp_path / f"c{copies}"
        for r, doc in enumerate(sources):
            synthetic.write(synthetic.repeat_steps(doc, copies), folder / f"rank{r}.pt.trace.json.gz")
        counts[copies], rep = lines_executed(lambda f=folder: _analyze(f))
        steps = rep.sections["ranks"][0]["steps"]
        assert steps >= 3 * copies - 1  # 3 recorded steps per copy (the last may be teardown)
    growth = counts[16] / counts[2]
    print(f"growth {growth:.2f}")
    assert growth <= MAX_GROWTH, f"8x the steps and events executed {growth:.1f}x the lines"


def _warmup_reference(durs: list[float]) -> int:
    """The rule as first written (quadratic): sort the rest for every prefix length."""
    for k in range(len(durs) // 3, 0, -1):
        rest = sorted(durs[k:])
        if len(rest) >= 2 and min(durs[:k]) > (1.0 + STEP_CV_WARN) * statistics.quantiles(
                rest, n=4, method="inclusive")[2]:
            return k
    return 0


def test_warmup_prefix_is_the_rule_it_replaced() -> None:
    rng = random.Random(7)
    for trial in range(300):
        n = rng.randrange(0, 40)
        warm = rng.randrange(0, n // 2 + 1)
        durs = [rng.choice([20.0, 30.0, 45.0]) * (1 + rng.random()) if i < warm else
                rng.choice([10.0, 10.0, 11.0, 12.5, 30.0]) for i in range(n)]
        assert warmup_prefix(durs) == _warmup_reference(durs), (trial, durs)
    assert warmup_prefix([30.0, 25.0] + [10.0] * 20) == 2
    assert warmup_prefix([30.0, 10.0] * 10) == 0  # slow steps recur: not a prefix


class Counted(float):
    """A step duration that counts the comparisons made with it (sorting happens in C, out of a line count's
    sight: comparisons are what a sort costs)."""

    seen = 0

    def __lt__(self, other: object) -> bool:
        Counted.seen += 1
        return float(self) < float(other)  # type: ignore[arg-type]

    def __gt__(self, other: object) -> bool:
        Counted.seen += 1
        return float(self) > float(other)  # type: ignore[arg-type]


def test_warmup_prefix_linear_in_steps() -> None:
    def ops(n: int) -> tuple[int, int]:
        rng = random.Random(n)
        durs = [Counted(30.0)] * 5 + [Counted(10.0 + rng.random()) for _ in range(n - 5)]
        Counted.seen = 0
        lines, k = lines_executed(lambda: warmup_prefix(durs))
        assert k == 5
        return lines + Counted.seen, k

    small, large = 2_000, 16_000
    n_small, _ = ops(small)
    n_large, _ = ops(large)
    print(f"growth {n_large / n_small:.2f}")
    # n log n: sorting and the Fenwick tree's walks grow with log2(n), 11 -> 14 levels here (10x measured). The rule it replaced
    # sorted the rest for every prefix length: ~64x.
    assert n_large / n_small <= 8 * 1.6, f"8x the steps took {n_large / n_small:.1f}x the operations"
