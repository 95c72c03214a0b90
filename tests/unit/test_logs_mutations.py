"""Every log of the corpus (real logs from public threads and the recorded ones) in each reformatted variant gives
the same findings as its original, or the report says what it could not read (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.logs.explain import explain_paths, explain_texts
from tests.fuzz.log_variants import VARIANTS, body

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
CORPUS = sorted((FIX / "real").glob("*.log")) + sorted(FIX.glob("*.log"))


def _signature(findings: list[Any]) -> list[tuple[str, str, tuple[int, ...]]]:
    out = []
    for f in findings:
        culprits = f.evidence.get("culprit_ranks")
        if culprits is None:
            culprits = [f.evidence["rank"]] if f.evidence.get("rank") is not None else f.ranks
        out.append((f.id, f.severity.value, tuple(sorted(culprits))))
    return sorted(out)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_corpus_log_reads_the_same_in_every_variant(variant: str, tmp_path: Path) -> None:
    assert len(CORPUS) >= 50
    applied = 0
    wrong = []
    for path in CORPUS:
        text = path.read_text()
        mutated = VARIANTS[variant](text)
        if mutated is None:
            continue  # not applicable (no failure table to cut, a single rank to interleave)
        applied += 1
        name = "rank1.log" if "rank1" in path.name else path.name  # the name may say the rank: keep it
        if variant == "rank-prefix":
            name = "rank0.log"  # every line says rank 0: the original is read as rank 0's own file
        original = _signature(explain_texts({name: body(text)}))
        p = tmp_path / name
        p.write_bytes(mutated.encode())
        report = explain_paths([str(p)])
        got = _signature(report.findings)
        # Only a cut table loses text; every other variant holds all the original says and must read the same.
        said = variant == "cut-mid-table" and any("could not read" in n for n in report.notes)
        if got != original and not said:
            wrong.append((path.name, original, got))
    assert applied, variant
    assert not wrong, wrong


NCCL = sorted((FIX.parent / "nccl" / "real").glob("*.log"))
# `topo` reads NCCL_DEBUG output as NCCL and the log collectors wrote it; the launchers' per-line host label (pdsh)
# and torch's "[rank0]:" are in `logs`' grammar only.
_NOT_TOPO = ("pdsh", "rank-prefix")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_nccl_corpus_log_gives_the_same_topo_findings_in_every_variant(variant: str, tmp_path: Path) -> None:
    """`topo` reads a reformatted NCCL or nccl-tests log (colour codes, a collector's prefixes, CRLF, dedented) as its
    original: each real NCCL log of the corpus (tests/fixtures/nccl/real) gives the same finding ids."""
    from ddpdoctor.commands.topo import build_report

    assert len(NCCL) >= 4
    if variant in _NOT_TOPO:
        pytest.skip(f"{variant}: not in topo's grammar (docs/logs-grammar.md §5)")
    wrong = []
    for path in NCCL:
        mutated = VARIANTS[variant](path.read_text())
        if mutated is None:
            continue
        (tmp_path / "orig").mkdir(exist_ok=True)
        (tmp_path / "var").mkdir(exist_ok=True)
        orig, var = tmp_path / "orig" / path.name, tmp_path / "var" / path.name
        orig.write_text(body(path.read_text()))
        var.write_bytes(mutated.encode())
        want = sorted(f.id for f in build_report([orig], []).findings)
        got = sorted(f.id for f in build_report([var], []).findings)
        if got != want:
            wrong.append((path.name, want, got))
    assert not wrong, wrong
