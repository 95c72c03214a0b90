"""The launchers of a multi-node job share one run directory: checking that it is writable must not trip over the
other launcher's check (one shared probe file made a launcher fail with "cannot write the run directory (No such
file or directory)" when the other had removed it first; seen in a loaded multi-node test run)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from ddpdoctor.rundir.layout import RunDir


def _check_many(root: str, n: int) -> int:
    failures = 0
    for _ in range(n):
        try:
            RunDir(Path(root)).ensure_writable(keep_existing=True)
        except Exception:  # noqa: BLE001 - counted: the test says how many
            failures += 1
    return failures


def test_two_launchers_check_one_directory_at_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        failures = pool.starmap(_check_many, [(str(tmp_path), 400), (str(tmp_path), 400)])
    assert failures == [0, 0]
    assert not list(tmp_path.glob(".write-test*"))
