"""A rank-crashed raised in the user's own code through a framework's handlers names the user's line, not the
framework's (issue 39): on a recorded Lightning crash (tests/fixtures/crash/README.md)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.findings.failure import rank_crashed_finding, user_call_site

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "crash"
USER_LINE = "/tmp/plcrash/train_crash.py:15"  # the self.log(...) line of the script, as recorded
LIGHTNING = "/work/main/.venv/lib/python3.11/site-packages/lightning/pytorch/core/module.py:665"


def _tb() -> str:
    return (FIXTURES / "lightning_log_in_training_step.log").read_text()


def test_the_users_frame_under_lightnings_is_the_call_site():
    assert user_call_site(_tb()) == USER_LINE
    # a watched run knew no collective (None) or only the framework's frame: both name the user's line now
    for known in (None, LIGHTNING):
        f = rank_crashed_finding(1, "Rank 1 failed", "fix it", exception="ValueError: ...", traceback=_tb(),
                                 call_site=known)
        assert f.evidence["call_site"] == USER_LINE
    # a call site in the user's code is kept
    f = rank_crashed_finding(1, "t", "a", exception="e", traceback=_tb(), call_site="/home/u/train.py:7")
    assert f.evidence["call_site"] == "/home/u/train.py:7"


def test_a_chain_names_the_original_exceptions_user_frame():
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 40, in step\n    load(x)\n'
          '  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\nKeyError: 3\n\n'
          'The above exception was the direct cause of the following exception:\n\n'
          'Traceback (most recent call last):\n  File "/home/u/train.py", line 90, in <module>\n    trainer.fit()\n'
          '  File "/opt/venv/lib/python3.11/site-packages/accelerate/utils/launch.py", line 10, in wrap\n'
          'RuntimeError: wrapped\n')
    assert user_call_site(tb) == "/home/u/train.py:40"
    assert user_call_site("no traceback here") is None
