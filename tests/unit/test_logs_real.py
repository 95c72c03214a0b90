"""Real failure logs from public issue threads (tests/fixtures/logs/real, tests/fixtures/nccl/real): each file names
its source and what it must yield in its header ("# expect: ID [culprits=a,b] [victims=c]" or "nothing"); the healthy
ones raise nothing at all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.commands.topo import build_report
from ddpdoctor.logs.explain import explain_paths

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted((FIX / "logs" / "real").glob("*.log"))
NCCL = sorted((FIX / "nccl" / "real").glob("*.log"))
_EXPECT = re.compile(r"^# expect: (\S+)(?: culprits=([\d,]+))?(?: victims=([\d,]+))?", re.MULTILINE)


def _expect(path: Path) -> tuple[str, list[int] | None, list[int] | None]:
    text = path.read_text()
    assert "# source: https://github.com/" in text, path
    m = _EXPECT.search(text)
    assert m, path
    ints = lambda s: [int(x) for x in s.split(",")] if s else None  # noqa: E731
    return m.group(1), ints(m.group(2)), ints(m.group(3))


def test_corpus_size() -> None:
    assert len(LOGS) + len(NCCL) >= 30
    assert sum(_expect(p)[0] == "nothing" for p in LOGS) >= 5


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_real_log_is_explained_right(path: Path) -> None:
    want, culprits, victims = _expect(path)
    report = explain_paths([str(path)])
    ids = [f.id for f in report.findings]
    if want == "nothing":
        assert report.findings == [], [(f.id, f.title) for f in report.findings]
        return
    assert want in ids, (ids, [f.title for f in report.findings])
    assert report.findings[0].id == want, f"the cause must come first: {ids}"
    assert "unrecognised-failure" not in ids
    finding = report.findings[0]
    got = finding.evidence.get("culprit_ranks")
    if got is None:
        got = [finding.evidence["rank"]] if finding.evidence.get("rank") is not None else finding.ranks
    if culprits is not None:
        assert sorted(got) == culprits, (finding.title, finding.evidence)
    if victims is not None:
        assert finding.evidence.get("victim_ranks") == victims, finding.evidence
    assert not any(n.endswith("nothing to explain (no error from torch.distributed, torchrun or SLURM in it)")
                   for n in report.notes)


@pytest.mark.parametrize("path", NCCL, ids=[p.name for p in NCCL])
def test_real_nccl_log_for_topo(path: Path) -> None:
    want, _, _ = _expect(path)
    ids = [f.id for f in build_report([path], []).findings]
    assert want in ids or (want == "p2p-consumer-gpu" and "p2p-pcie-risk" in ids), ids
