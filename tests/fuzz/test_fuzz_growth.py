"""Long inputs (issue 26): `logs`, `topo` and `analyze` stay near-linear when their input doubles (many lines, long
lines, many ranks, many steps), measured on deterministic counts of the work done (tests/fuzz/growth.py), never on
wall time. Small sizes in CI; the issue's sizes with DDPDOCTOR_FUZZ_SCALE=full (tests/fuzz/README.md).

A generator that finds a parser growing faster than n log n is marked xfail with the issue that owns the parser:
the logs/topo parsers belong to issue 27, the trace rules to issue 29."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.commands.topo import build_report
from ddpdoctor.logs.explain import explain_paths
from ddpdoctor.reports.analyze import assemble
from tests.conftest import REPO
from tests.fuzz.common import result_or_bad_input
from tests.fuzz.growth import assert_near_linear, size
from tests.unit.tracebuild import cpu_step, meta, x

LOGS = REPO / "tests" / "fixtures" / "logs"
NCCL = REPO / "tests" / "fixtures" / "nccl"
FAILURE = (LOGS / "raise.log").read_text()
NCCL_LOG = (NCCL / "h100_forced_nvls_few_channels.log").read_text()
BUDGET_PER_LINE = 2_000  # ~100 counted lines of ddpdoctor per line of log today: a loop that never ends is stopped


class Files:
    """Inputs are written to disk before the count starts (writing is not the code under test)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0

    def write(self, name: str, data: str | bytes) -> Path:
        self.n += 1
        d = self.root / str(self.n)
        d.mkdir()
        p = d / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def _logs(path: Path) -> None:
    result_or_bad_input(lambda: explain_paths([str(path)]).to_json())


def _topo(path: Path) -> None:
    result_or_bad_input(lambda: build_report([path], []).to_json())


def test_logs_many_lines(files):
    def make(n: int) -> Path:
        body = "".join(f"[rank{i % 2}]: step {i} loss {1 / (i + 1):.4f} lr 0.1 grad_norm 1.{i % 97}\n"
                       for i in range(n))
        return files.write("job.log", body + FAILURE)

    assert_near_linear(make, _logs, size(2_000, 500_000), "logs, many lines", budget_per_unit=BUDGET_PER_LINE)


def test_logs_long_line(files):
    def make(n: int) -> Path:
        line = "[rank0]: tensor([" + ", ".join(f"{i * 0.001:.3f}" for i in range(n // 7)) + "])\n"
        return files.write("job.log", line + FAILURE)

    assert_near_linear(make, _logs, size(20_000, 27_000), "logs, one long line", budget_per_unit=100)


def test_logs_many_ranks(files):
    def make(ranks: int) -> Path:
        lines = []
        for step in range(20):
            for r in range(ranks):
                lines.append(f"[default{r}]:[rank{r}]: step {step} loss 0.5\n")
        lines.append(f"[default{ranks - 1}]:[rank{ranks - 1}]: RuntimeError: CUDA error: out of memory\n")
        return files.write("job.log", "".join(lines) + FAILURE)

    assert_near_linear(make, _logs, size(16, 256), "logs, many ranks", budget_per_unit=BUDGET_PER_LINE * 20)


def test_topo_many_lines(files):
    head, _, tail = NCCL_LOG.partition("NCCL INFO Channel 00/0 :")

    def make(n: int) -> Path:
        rows = "".join(f"h100-a:9001:9030 [0] NCCL INFO Channel {i % 32:02d}/0 : {i % 8}[{i % 8}] -> "
                       f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read\n" for i in range(n))
        return files.write("job.log", head + rows + "h100-a:9001:9030 [0] NCCL INFO Channel 00/0 :" + tail)

    assert_near_linear(make, _topo, size(2_000, 500_000), "topo, many lines", budget_per_unit=BUDGET_PER_LINE)


def test_topo_long_line(files):
    """Item 7's input shape (one long NCCL line). Work inside one regular expression is one call here (growth.py):
    this pins the Python side; the regex itself is issue 27's."""

    def make(n: int) -> Path:
        line = "h100-a:9001:9030 [0] NCCL INFO Channel 00/04 : " + " ".join(str(i % 8) for i in range(n // 2))
        return files.write("job.log", NCCL_LOG + line + "\n")

    assert_near_linear(make, _topo, size(20_000, 27_000), "topo, one long line", budget_per_unit=100)


def _trace(steps: int, rank: int = 0, world: int = 2) -> dict:
    """A gloo rank's trace of ``steps`` ProfilerSteps: a slow warm-up, then step times that vary by up to 40 %
    (seeded by the rank), as real jobs do; identical steps would spare the rules that compare steps."""
    rnd = random.Random(rank)
    ev = [meta(10, "thread 10 (python)"), meta(20, "thread 20 (pt_gloo_runloop)")]
    base = 0.0
    for s in range(steps):
        d = 100 + rnd.random() * 40 + (300 if s < 5 else 0)
        k = d / 100
        ev.append(x(f"ProfilerStep#{s + 1}", base, d, cat="user_annotation"))
        ev += cpu_step(base, 5 * k, (base + 5 * k, 25 * k), (base + 30 * k, 30 * k), (base + 50 * k, 5 * k),
                       base + 55 * k, (base + 56 * k, 24 * k), (base + 85 * k, 10 * k))
        base += d
    return {"schemaVersion": 1, "host_name": "h", "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                "pg_config": [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]}}


def _analyze(paths: list[Path]) -> None:
    result_or_bad_input(lambda: assemble(analyze_paths(paths)).to_json())


def test_analyze_many_steps(files):
    """Item 6's input shape (issue 29 owns the rules). Full size is 12,500 -> 50,000 steps: traced line by line,
    200,000 steps would take hours; DDPDOCTOR_FUZZ_SCALE=<factor> goes further."""
    def make(n: int) -> list[Path]:
        return [files.write(f"rank{r}.pt.trace.json", json.dumps(_trace(n, r))) for r in (0, 1)]

    assert_near_linear(make, _analyze, size(25, 12_500), "analyze, many steps", budget_per_unit=200_000)


def test_analyze_many_ranks(files):
    def make(ranks: int) -> list[Path]:
        return [files.write(f"rank{r}.pt.trace.json", json.dumps(_trace(4, r, ranks))) for r in range(ranks)]

    assert_near_linear(make, _analyze, size(4, 256), "analyze, many ranks", budget_per_unit=2_000_000)
