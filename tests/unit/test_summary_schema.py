"""summary.json's SCHEMA 2 (issue 37): a schema-1 summary of a rank that built FSDP counted FSDP's own ranges as
compute (100% overlap, 0 ms exposed), so `analyze` reads its trace again; a DDP rank's schema-1 summary, whose
figures did not change, is kept (old DDP run directories analyse as before)."""

from __future__ import annotations

import json

from ddpdoctor.analyses.pipeline import _fsdp_summary
from ddpdoctor.analyses.summary import SCHEMA
from ddpdoctor.rundir.summary_records import CollectiveCall


def _call(op: str) -> CollectiveCall:
    return CollectiveCall(rank=0, index=0, step=0, op=op, group="default_pg", seq=1, bytes=4, start_us=0.0,
                          dur_us=1.0, end_us=1.0, start_rel_backward_us=None, algbw_gbps=None, busbw_gbps=None)


def test_an_fsdp_ranks_old_summary_is_read_again_and_a_ddp_ranks_is_kept(tmp_path):
    assert SCHEMA == 2
    path = tmp_path / "summary.json"
    ddp = [_call("all_reduce")]
    assert not _fsdp_summary(ddp, path)  # no record of what the rank built: its collectives say DDP
    assert _fsdp_summary([_call("all_reduce"), _call("all_gather")], path)
    (tmp_path / "info.json").write_text(json.dumps({"schema_version": 1, "parallelism": {"kinds": ["fsdp2"]}}))
    assert _fsdp_summary(ddp, path)  # the record says FSDP2, whatever its collectives
    (tmp_path / "info.json").write_text(json.dumps({"schema_version": 1, "parallelism": {"kinds": ["tp"]}}))
    assert not _fsdp_summary(ddp, path)
