"""rundir/private.py as the same user: links, hard links, other modes (the other-user cases are in
tests/e2e/test_trust_rundir.py)."""

from __future__ import annotations

import os
import stat

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.rundir.private import claim_run_root, open_private, private_dir


def test_open_private_never_writes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(OSError):
        open_private(tmp_path / "log")
    assert victim.read_text() == "keep"


def test_open_private_refuses_a_hard_link_and_keeps_its_content(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.link(victim, tmp_path / "log")
    with pytest.raises(BadInput, match="hard link"):
        open_private(tmp_path / "log")
    assert victim.read_text() == "keep"


def test_open_private_makes_an_old_file_owner_only_and_empties_it(tmp_path):
    old = tmp_path / "log"
    old.write_text("earlier run")
    old.chmod(0o644)
    os.close(open_private(old))
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and old.read_text() == ""
    fd = open_private(tmp_path / "new", append=True)
    os.write(fd, b"x")
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600


def test_private_dir_refuses_a_link_and_tightens_our_own(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ranks").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadInput, match="symbolic link"):
        private_dir(tmp_path / "ranks")
    mine = tmp_path / "traces"
    mine.mkdir(mode=0o755)
    private_dir(mine)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700


def test_claim_run_root_creates_owner_only_and_refuses_loose_modes(tmp_path):
    assert claim_run_root(tmp_path / "a" / "run") is True
    assert stat.S_IMODE((tmp_path / "a" / "run").stat().st_mode) == 0o700
    assert claim_run_root(tmp_path / "a" / "run") is False
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o775)
    with pytest.raises(BadInput, match="writable by other users"):
        claim_run_root(loose)
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput, match="not a directory"):
        claim_run_root(tmp_path / "file")
