"""Escape sequences (OSC, CSI, C0, C1) in a file name, a pickle's global name or a path never reach the terminal
through the one-line errors (issue 26, item 3)."""

from __future__ import annotations

import pickle

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.terminal_text import clean_text
from tests.conftest import run_cli

OSC = "\x1b]0;PWNED\x07"
CSI = "\x1b[2J"
C1 = "\x9b2J"  # CSI as one C1 character
BAD = ("\x1b", "\x07", "\x9b", "\x90", "\r")


def _assert_clean(text: str) -> None:
    for ch in BAD:
        assert ch not in text, repr(text)


def test_bad_input_is_one_clean_line():
    exc = BadInput(f"refusing to load os.{OSC}system{CSI}\nsecond line", f"a{C1}b\rc.json")
    _assert_clean(str(exc))
    assert "\n" not in str(exc) and "PWNED" not in str(exc)
    assert str(exc).startswith("a\\x9b2Jb\\x0dc.json: refusing to load os.system\\nsecond line")


def test_clean_text_keeps_plain_text_and_drops_sequences():
    assert clean_text("step 3 of 10\tok\n") == "step 3 of 10\tok\n"
    assert clean_text(f"x{OSC}y{CSI}z") == "xyz"
    assert clean_text(f"a{C1}b") == "a\\x9b2Jb"


@pytest.mark.parametrize("command", ["analyze", "logs", "topo", "status"])
def test_a_file_name_with_escapes_stays_off_the_terminal(tmp_path, command):
    name = tmp_path / f"run{OSC}{CSI}{C1}.json"
    name.write_bytes(b"\x00junk")
    proc = run_cli(command, str(name))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    _assert_clean(proc.stdout + proc.stderr)


def test_a_pickle_global_name_with_escapes_stays_off_the_terminal(tmp_path):
    dump = tmp_path / "fr.pkl"
    dump.write_bytes(b"\x80\x04c" + f"os{OSC}\nsystem{CSI}\n".encode() + b"." + pickle.dumps(None)[:0])
    proc = run_cli("logs", str(dump))
    assert proc.returncode == 2, proc.stderr
    assert "refusing to load os" in proc.stderr
    _assert_clean(proc.stdout + proc.stderr)
