"""The live relay (ddpdoctor/job/relay.py): every iteration record of every node reaches the head exactly once, the
node's memory stays bounded when the head does not read."""

from __future__ import annotations

import json

from ddpdoctor.job.relay import MAX_PER_RANK, HeadRelay, NodeRelay


def step(n: int) -> list[object]:
    return [n, 0.1, {"forward": 0.04}]


def wire(payload: object) -> object:
    return json.loads(json.dumps(payload))  # through the store


def test_exactly_once_with_lost_reads_and_lost_acks() -> None:
    node, head = NodeRelay(), HeadRelay()
    got: list[tuple[int, int]] = []
    node.add(0, [step(1)], "data")
    p1 = wire(node.payload(1))
    node.add(1, [step(1), step(2)], "backward")
    p2 = wire(node.payload(2))  # the head never read publication 1: publication 2 still carries it
    got += [(r, s[0]) for r, steps, _ in head.take(1, p2) for s in steps]
    got += [(r, s[0]) for r, steps, _ in head.take(1, p1) for s in steps]  # an old publication read late: nothing new
    got += [(r, s[0]) for r, steps, _ in head.take(1, p2) for s in steps]  # the ack was lost: the same publication again
    node.acked(head.taken[1])
    assert node.payload(3) is None
    node.add(0, [step(2)], "data")
    got += [(r, s[0]) for r, steps, _ in head.take(1, wire(node.payload(4))) for s in steps]
    assert sorted(got) == [(0, 1), (0, 2), (1, 1), (1, 2)]


def test_bounded_when_the_head_does_not_read_and_junk_is_skipped() -> None:
    node = NodeRelay()
    for n in range(1000):
        node.add(3, [step(n)], "data")
    payload = node.payload(1)
    assert payload is not None and len(payload["items"]) == MAX_PER_RANK
    assert payload["items"][-1][2] == [step(999)]
    assert HeadRelay().take(1, {"items": [5, [1, "x", [], None], [True, 2, [], None], [2, 3, [step(1)], "x"]]}) == [
        (3, [step(1)], "x")]
