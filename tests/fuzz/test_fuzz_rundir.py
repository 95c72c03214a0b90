"""Every run-directory artefact, mutated structurally, through the code that reads it: a result or BadInput."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.common import result_or_bad_input
from tests.fuzz.mutate import FUZZ, damage, dumps, mutate
from tests.fuzz.rundirs import CASES, build, consume


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_mutated_artefact(tmp_path, kind, name):
    run = build(kind, tmp_path / "run")
    target = run / name
    original = target.read_bytes()
    seed = json.loads(original)
    assert consume(kind, run) is not None  # the undamaged run directory is read

    @FUZZ
    @given(st.randoms(use_true_random=False), st.integers(0, 9))
    def check(rnd, encode):
        data = dumps(mutate(seed, rnd))
        target.write_bytes(damage(data, rnd) if encode == 0 else data)
        try:
            result_or_bad_input(consume, kind, run)
        finally:
            target.write_bytes(original)

    check()
