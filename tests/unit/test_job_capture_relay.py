"""job/capture_relay.py: a node's window parts travel to the head's window folder once, by name only under the
window's ranks/ and traces/, never through a link; a part too large for the store is left on its node and said."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from ddpdoctor.job import capture_relay
from ddpdoctor.job.capture_relay import HeadCaptures, NodeCaptures, rank_key, record_key


def _node_window(root: Path, cid: str) -> Path:
    win = root / "captures" / cid
    for r in (2, 3):
        (win / "ranks" / f"rank{r}").mkdir(parents=True)
        (win / "ranks" / f"rank{r}" / "summary.json").write_text(json.dumps({"rank": r}))
    (win / "traces").mkdir()
    (win / "traces" / "rank2.host.pt.trace.json.gz").write_bytes(b"\x1f\x8b trace of rank 2")
    (win / "traces" / "rank3.host.pt.trace.json.gz").write_bytes(b"\x1f\x8b trace of rank 3")
    (win / "capture-node1.json").write_text(json.dumps({"id": cid, "ranks": [2, 3]}))
    return win


def test_a_node_window_reaches_the_head_once_rank_by_rank(tmp_path: Path) -> None:
    cid = "cap-1"
    node, head = NodeCaptures(1, tmp_path / "n1"), HeadCaptures(tmp_path / "n0")
    published = head.forward({"id": cid, "what": "profile", "steps": 2, "at_step": 40}, [1])
    assert [r["id"] for r in node.new_requests(published)] == [cid]
    assert node.new_requests(published) == []  # taken once
    win = _node_window(tmp_path / "n1", cid)
    (win / "ranks" / "rank2" / "done.json").write_text(json.dumps({"first_step": 41, "last_step": 43}))
    out = dict(node.outgoing())
    assert set(out) == {record_key(1, cid), rank_key(1, cid, 2)}  # rank 3 is not done yet
    assert node.outgoing() == []  # nothing new
    assert head.names() == [record_key(1, cid)]
    assert head.take({record_key(1, cid): out[record_key(1, cid)]}) == []  # the record stays in the store
    assert head.names() == [record_key(1, cid), rank_key(1, cid, 2), rank_key(1, cid, 3)]
    assert head.take({rank_key(1, cid, 2): out[rank_key(1, cid, 2)]}) == [rank_key(1, cid, 2)]
    mine = tmp_path / "n0" / "captures" / cid
    assert (mine / "traces" / "rank2.host.pt.trace.json.gz").read_bytes() == b"\x1f\x8b trace of rank 2"
    assert json.loads((mine / "ranks" / "rank2" / "done.json").read_text())["first_step"] == 41
    assert json.loads((mine / "capture-node1.json").read_text())["relayed_from"]["node"] == 1
    assert oct((mine / "traces" / "rank2.host.pt.trace.json.gz").stat().st_mode & 0o777) == "0o600"
    (win / "ranks" / "rank3" / "done.json").write_text("{}")
    assert [n for n, _ in node.outgoing()] == [rank_key(1, cid, 3)]


def test_names_outside_the_window_and_links_are_refused(tmp_path: Path) -> None:
    cid = "cap-2"
    head = HeadCaptures(tmp_path / "n0")
    head.forward({"id": cid, "what": "profile"}, [1])
    head.take({record_key(1, cid): {"record": json.dumps({"ranks": [2]}), "name": "node1"}})
    evil = {"files": {"../../../etc/x": base64.b64encode(b"x").decode(),
                      "ranks/rank2/../../x.json": base64.b64encode(b"x").decode(),
                      "ranks/rank2/done.json": base64.b64encode(b"{}").decode()}}
    mine = tmp_path / "n0" / "captures" / cid
    (mine / "ranks" / "rank2").mkdir(parents=True)
    target = tmp_path / "outside.json"
    os.symlink(target, mine / "ranks" / "rank2" / "done.json")  # planted: never written through
    head.take({rank_key(1, cid, 2): evil})
    assert not target.exists() and not (tmp_path / "x.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n0"]
    # A node never sends a link either.
    node = NodeCaptures(1, tmp_path / "n1")
    node.taken.add(cid)
    win = _node_window(tmp_path / "n1", cid)
    secret = tmp_path / "secret"
    secret.write_text("root only")
    os.symlink(secret, win / "ranks" / "rank2" / "info.json")
    (win / "ranks" / "rank2" / "done.json").write_text("{}")
    sent = dict(node.outgoing())[rank_key(1, cid, 2)]
    assert "ranks/rank2/info.json" not in sent["files"] and "ranks/rank2/info.json" in sent["left_out"]


def test_a_part_too_large_stays_on_its_node_and_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_relay, "MAX_RANK_BYTES", 64)
    cid = "cap-3"
    node, head = NodeCaptures(1, tmp_path / "n1"), HeadCaptures(tmp_path / "n0")
    node.new_requests(head.forward({"id": cid, "what": "profile"}, [1]))
    win = _node_window(tmp_path / "n1", cid)
    (win / "traces" / "rank2.host.pt.trace.json.gz").write_bytes(b"x" * 1000)
    (win / "ranks" / "rank2" / "done.json").write_text("{}")
    out = dict(node.outgoing())
    part = out[rank_key(1, cid, 2)]
    assert part["left_out"] == ["traces/rank2.host.pt.trace.json.gz"] and "ranks/rank2/done.json" in part["files"]
    head.take({record_key(1, cid): out[record_key(1, cid)]})
    head.take({rank_key(1, cid, 2): part})
    from ddpdoctor.live.capture import relay_note

    note = relay_note(tmp_path / "n0" / "captures" / cid)
    assert note is not None and note.startswith("ranks [2]: some window files were too large")
