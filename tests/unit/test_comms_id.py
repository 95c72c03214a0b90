"""Kineto's cross-rank "Comms Id" (newer torch, profiler/util.cpp) keys the cross-rank match when every rank's trace
carries it, and a disagreement with the (group, sequence) match is said in a note (docs/metrics.md#collective-matching).
The traces are built from a real A100 trace of ../shared/traces (tests/fixtures/kineto_comms_id/README.md)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

from ddpdoctor.analyses import crossrank
from ddpdoctor.analyses.pipeline import analyze_paths
from tests.conftest import shared_path


def _comms_id(pg_name: str, seq: int, is_p2p: bool, rank_start: int, rank_stride: int, world_size: int) -> int:
    """A stand-in for torch's c10::get_hash over the same fields (profiler/util.cpp): an unsigned 64-bit integer."""
    key = repr((pg_name, seq, is_p2p, rank_start, rank_stride, world_size)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def _with_comms_id(src: Path, ids: bool) -> dict[str, Any]:
    """The trace with Seq (per group, start order) and, when ``ids``, Comms Id on every NCCL kernel, as torch writes
    them: bare JSON integers beside the other collective args."""
    with gzip.open(src, "rt") as fh:
        data: dict[str, Any] = json.load(fh)
    world = int(data.get("distributedInfo", {}).get("world_size", 1))
    kernels = sorted((e for e in data["traceEvents"] if e.get("cat") == "kernel"
                      and "Collective name" in e.get("args", {})), key=lambda e: e["ts"])
    seq_by_group: dict[str, int] = {}
    for ev in kernels:
        args = ev["args"]
        pg = str(args.get("Process Group Name", "0"))
        seq = seq_by_group[pg] = seq_by_group.get(pg, -1) + 1
        args["Seq"] = seq
        if ids:
            args["Comms Id"] = _comms_id(pg, seq, False, 0, 1, world)
    return data


def _pair(tmp: Path, data: dict[str, Any], swap_seq_on_rank1: bool = False) -> list[Path]:
    """Rank 0 as recorded and rank 1 = its events relabelled, 50 µs later (the job's rank 1 is not shared)."""
    tmp.mkdir()
    out = []
    for rank in (0, 1):
        d = json.loads(json.dumps(data))
        d["distributedInfo"]["rank"] = rank
        for ev in d["traceEvents"]:
            if rank and isinstance(ev.get("ts"), (int, float)):
                ev["ts"] += 50.0
        if rank and swap_seq_on_rank1:  # two collectives' sequence numbers exchanged on one rank
            ks = sorted((e for e in d["traceEvents"] if "Seq" in e.get("args", {})), key=lambda e: e["ts"])
            ks[2]["args"]["Seq"], ks[3]["args"]["Seq"] = ks[3]["args"]["Seq"], ks[2]["args"]["Seq"]
        path = tmp / f"rank{rank}.json.gz"
        with gzip.open(path, "wt") as fh:
            json.dump(d, fh)
        out.append(path)
    return out


def _pairs(a: Any) -> list[tuple[tuple[int, float], ...]]:
    return sorted(tuple(sorted(m.starts_us.items())) for m in a.matched)


def test_comms_id_matches_as_the_sequence_does_and_a_disagreement_is_said(tmp_path):
    src = shared_path("traces", "a100_ddp_resnet_rank0", "nccl_data.json.gz")
    by_seq = analyze_paths(_pair(tmp_path / "seq", _with_comms_id(src, ids=False)))
    with_ids = _with_comms_id(src, ids=True)
    by_id = analyze_paths(_pair(tmp_path / "id", with_ids))
    assert by_id.matched and all(m.key.startswith("id:") for m in by_id.matched)
    assert not any(m.key.startswith("id:") for m in by_seq.matched)
    assert _pairs(by_id) == _pairs(by_seq)  # the same collectives paired either way
    assert all(c.comms_id is not None and c.comms_id.isdigit() for c in by_id.calls)
    assert all(c.comms_id is None for c in by_seq.calls)
    assert not any("Comms Id" in n for n in by_id.notes)
    calls_json = by_id.to_sections()["collectives"]["calls"]
    assert calls_json[0]["comms_id"] == by_id.calls[0].comms_id
    assert "comms_id" not in by_seq.to_sections()["collectives"]["calls"][0]

    swapped = analyze_paths(_pair(tmp_path / "swap", with_ids, swap_seq_on_rank1=True))
    assert _pairs(swapped) == _pairs(by_id)  # matched by Comms Id, not by the exchanged sequence numbers
    [note] = [n for n in swapped.notes if "Comms Id" in n]
    assert note.startswith("2 of ")


def test_comms_id_is_used_only_when_every_call_carries_one():
    from ddpdoctor.analyses.results import CollectiveCall

    def call(rank: int, seq: int, cid: str | None) -> CollectiveCall:
        return CollectiveCall(rank, seq, 0, "all_reduce", "0", seq, 8, 0.0, 1.0, 1.0, None, None, None, None, cid)

    keyed = [(0, call(0, 0, "7"), "0:seq0"), (1, call(1, 0, None), "0:seq0")]
    assert not crossrank._uses_comms_id(keyed)
    assert crossrank._uses_comms_id(keyed[:1])
