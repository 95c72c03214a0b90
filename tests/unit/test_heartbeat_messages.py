"""The heartbeat's hand-formatted "enter" line is valid JSON equal to the state, and call sites skip torch."""

from __future__ import annotations

import json

from ddpdoctor.probes.heartbeat_lines import enter_line, user_call_site


def test_enter_line_round_trips() -> None:
    state = {"op": "all_reduce", "group": "default_pg", "seq": 3, "sizes": [[1, 4], []],
             "call_site": '/x/"odd" dir/y.py:3', "since": 1795364881.9044087, "step": 3}
    assert json.loads(enter_line(state)) == {"type": "enter", "collective": state}
    state.update(seq=None, call_site=None)
    assert json.loads(enter_line(state))["collective"] == state


def test_user_call_site_is_the_caller_outside_ddpdoctor() -> None:
    def inner() -> str | None:
        return user_call_site(skip=1)

    site = inner()
    assert site is not None and site.endswith(f"{__file__}:{inner.__code__.co_firstlineno + 1}")
