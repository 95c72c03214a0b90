"""Profiler traces: `analyze` (loader, trace model, analyses, findings) and `--merge` on mutated traces."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.renderers.merge import merge_traces
from ddpdoctor.reports.analyze import assemble as report_for
from tests.fuzz.common import result_or_bad_input
from tests.fuzz.mutate import FUZZ, damage, dumps, mutate
from tests.unit.tracebuild import cpu_trace, gpu_trace

SEEDS = [cpu_trace(0), gpu_trace(1)]


def _analyze(path):  # type: ignore[no-untyped-def]
    report = report_for(analyze_paths([path]))
    json.dumps(report.to_json(), default=str)
    return report


@FUZZ
@given(st.sampled_from(SEEDS), st.randoms(use_true_random=False), st.booleans())
def test_analyze_mutated_trace(tmp_path_factory, seed, rnd, gz):
    path = tmp_path_factory.mktemp("t") / ("rank0.pt.trace.json" + (".gz" if gz else ""))
    path.write_bytes(damage(dumps(mutate(seed, rnd)), rnd))
    result_or_bad_input(_analyze, path)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_merge_mutated_traces(tmp_path_factory, rnd):
    d = tmp_path_factory.mktemp("m")
    paths = []
    for r, seed in enumerate(SEEDS):
        p = d / f"rank{r}.pt.trace.json"
        p.write_bytes(damage(dumps(mutate(seed, rnd)), rnd, gzip_ok=False) if r == 0 else dumps(seed))
        paths.append(p)
    result_or_bad_input(merge_traces, paths, d / "merged.json.gz")
