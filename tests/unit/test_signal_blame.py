"""A rank ended by a signal it did not catch (SIGTERM by hand or by a scheduler) is the culprit, not the peer whose
connection it closed (issue 26, item 10: 3 of 3 profiles blamed rank 0's "Connection closed by peer")."""

from __future__ import annotations

from ddpdoctor.findings.crash import crash_findings

PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:17323. This is typically caused by a remote worker crashing.")


def _term(rank: int, ended_at: float) -> dict:
    return {"rank": rank, "exit_code": 143, "signal": "SIGTERM", "exit_site": "train.py:20", "steps_completed": 4,
            "last_collective": {"op": "backward (DDP gradient all-reduce)", "call_site": "train.py:24"},
            "ended_at": ended_at}


def _errors(findings):  # type: ignore[no-untyped-def]
    return [(f.id, f.ranks) for f in findings if f.severity.value == "error"]


def test_the_rank_sigterm_ended_is_blamed_not_its_peer():
    statuses = {0: {"rank": 0, "exit_code": 1, "exception": PEER, "ended_at": 101.0}, 1: _term(1, 100.0)}
    findings = crash_findings(statuses)
    assert _errors(findings) == [("rank-crashed", [1])]
    title = findings[0].title
    assert "Rank 1 failed first" in title and "killed by SIGTERM (exit code 143) at train.py:20" in title
    assert findings[0].evidence["victims"] == [0]


def test_the_first_signalled_rank_is_blamed_when_torchrun_stopped_the_others():
    statuses = {0: _term(0, 105.0), 1: _term(1, 100.0), 2: {"rank": 2, "exception": PEER, "ended_at": 101.0},
                3: _term(3, 104.0)}
    assert _errors(crash_findings(statuses)) == [("rank-crashed", [1])]


def test_a_rank_with_its_own_exception_stays_the_root_cause():
    statuses = {0: _term(0, 105.0), 1: {"rank": 1, "exception": "ValueError: corrupt sample", "ended_at": 100.0}}
    assert _errors(crash_findings(statuses)) == [("rank-crashed", [1])]


def test_a_rank_killed_without_a_status_still_comes_first():
    statuses = {0: {"rank": 0, "exception": PEER, "ended_at": 101.0}, 1: None, 2: _term(2, 102.0)}
    findings = crash_findings(statuses)
    assert _errors(findings) == [("rank-crashed", [1])] and "no status" in findings[0].title


TORCHRUN_LOG = ("W1125 13:54:31.053000 1344 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
                "1411 closing signal SIGTERM\nE1125 13:55:01.270000 1344 torch/distributed/elastic/multiprocessing/"
                "api.py:1002] failed (exitcode: 143) local_rank: 1 (pid: 1412) of binary: python\n")


def test_a_rank_sigterm_ended_at_start_up_is_blamed_not_the_peer_torchrun_stopped():
    """Rank 1 SIGTERMed before any collective; rank 0, stuck in init, was stopped by torchrun and left no status."""
    from ddpdoctor.findings.crash import torchrun_stopped_pids

    assert torchrun_stopped_pids(TORCHRUN_LOG) == {1411}
    statuses = {0: None, 1: dict(_term(1, 100.0), steps_completed=0, last_collective=None)}
    findings = crash_findings(statuses, torn_down={0})
    assert _errors(findings) == [("rank-crashed", [1])] and "killed by SIGTERM" in findings[0].title
    assert findings[0].evidence["victims"] == [0]
    # Without torchrun's word, a silent rank may have died first (SIGKILL): no blame here (rank-no-status says it).
    assert crash_findings(statuses) == []


def test_sigterm_to_rank_0_blames_rank_0_not_its_victim():
    # Issue 40 item 6: rank 0 was read as "no rank" (a falsy walrus), so its victim was blamed (2 of 2).
    statuses = {0: _term(0, 100.0), 1: {"rank": 1, "exit_code": 1, "exception": PEER, "ended_at": 101.0}}
    findings = crash_findings(statuses)
    assert _errors(findings) == [("rank-crashed", [0])]
    assert "Rank 0 failed first" in findings[0].title and findings[0].evidence["victims"] == [1]


def test_a_rank_torchrun_stopped_after_the_root_failed_is_its_victim():
    """Rank 0 fails with its own exception; rank 1, waiting in DDP's all-reduce, is stopped by torchrun before it sees
    the connection close (a race: a fresh-clone run saw it once in tests/e2e/test_hang_scenarios.py). It is listed
    as a victim either way."""
    peer_first = {0: {"rank": 0, "exception": "ValueError: corrupt sample", "ended_at": 100.0},
                  1: {"rank": 1, "exception": PEER, "ended_at": 101.0}}
    stopped_first = {0: peer_first[0], 1: _term(1, 101.0)}
    for statuses in (peer_first, stopped_first):
        (f,) = [f for f in crash_findings(statuses) if f.id == "rank-crashed"]
        assert f.ranks == [0] and f.evidence["victims"] == [1] and "Rank 0 failed first" in f.title, f
