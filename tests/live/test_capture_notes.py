"""What the run report says about an automatic profile window (`run --capture-on-slowdown`), read from the files
the monitor and the ranks leave in RUN/captures/auto-*: no job, every case built by hand."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.live.capture import auto_capture_notes


def _run(tmp_path: Path, steps_completed: int, at_step: int = 131) -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": True}))
    for r in (0, 1):
        rank = tmp_path / "ranks" / f"rank{r}"
        rank.mkdir(parents=True)
        (rank / "status.json").write_text(json.dumps({"rank": r, "exit_code": 0, "steps_completed": steps_completed}))
    win = tmp_path / "captures" / "auto-1795440839"
    win.mkdir(parents=True)
    (win / "capture-node0.json").write_text(json.dumps(
        {"id": win.name, "what": "profile", "steps": 5, "ranks": [0, 1], "reason": "slow-rank", "at_step": at_step}))
    return win


def _done(win: Path, rank: int, body: dict) -> None:
    (win / "ranks" / f"rank{rank}").mkdir(parents=True, exist_ok=True)
    (win / "ranks" / f"rank{rank}" / "done.json").write_text(json.dumps(body))


def test_a_window_the_job_ended_before_says_so_with_both_iterations(tmp_path: Path) -> None:
    _run(tmp_path, steps_completed=130)
    [note] = auto_capture_notes(tmp_path)
    assert "asked when slow-rank fired" in note
    assert "was to start after iteration 131, but the job ended at iteration 130: nothing was recorded" in note


def test_a_recorded_window_says_which_iterations_and_how_to_analyse_it(tmp_path: Path) -> None:
    win = _run(tmp_path, steps_completed=200)
    for r in (0, 1):
        _done(win, r, {"first_step": 132, "last_step": 138})
    assert auto_capture_notes(tmp_path) == [
        f"ddpdoctor profiled iterations 132-138 on every rank automatically when slow-rank fired: "
        f"`ddpdoctor analyze {win}`"]


def test_a_failed_or_unfinished_window_is_named_not_passed_over(tmp_path: Path) -> None:
    win = _run(tmp_path, steps_completed=200)
    _done(win, 0, {"first_step": 132, "last_step": 138})
    [note] = auto_capture_notes(tmp_path)
    assert note.endswith("is incomplete: ranks [1] did not finish it")  # the job went on past it, rank 1 did not
    _done(win, 1, {"error": "RuntimeError('disk full')"})
    [note] = auto_capture_notes(tmp_path)
    assert "failed on rank 1 (RuntimeError('disk full')); the job itself was not affected" in note


def test_no_automatic_window_no_note(tmp_path: Path) -> None:
    assert auto_capture_notes(tmp_path) == []
    (tmp_path / "captures" / "cap-20261123-1").mkdir(parents=True)  # a manual capture reports itself
    assert auto_capture_notes(tmp_path) == []
