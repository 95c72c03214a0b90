"""`tune`'s launches leave the user's folders byte-identical (launch/user_files.py, issue 40 item 5), and a tune
--out of another user is refused before anything in it is changed."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.launch import user_files
from ddpdoctor.launch.user_files import MAX_DEPTH, FolderChanged, FolderGuard


def _tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(folder.rglob("*")) if p.is_file() and "runs" not in p.parts}


def test_what_a_launch_changes_is_put_back_and_what_it_made_removed(tmp_path: Path) -> None:
    user = tmp_path / "project"
    (user / "data").mkdir(parents=True)
    (user / "train.py").write_text("print('train')\n")
    (user / "ckpt.pt").write_bytes(b"step 100")
    os.chmod(user / "ckpt.pt", 0o640)
    (user / "data" / "old.bin").write_bytes(b"\x00" * 1000)
    before = _tree(user)
    guard = FolderGuard([(user, MAX_DEPTH)], skip=[user / "runs"], keep=tmp_path / "keep")
    guard.snapshot()
    for _ in range(3):  # every launch starts from the user's state
        since = time.time_ns() - 2_000_000_000
        assert (user / "ckpt.pt").read_bytes() == b"step 100"
        (user / "ckpt.pt").write_bytes(b"step 134")  # trained by the launch
        (user / "data" / "old.bin").unlink()
        (user / "__pycache__").mkdir()
        (user / "__pycache__" / "m.pyc").write_bytes(b"pyc")
        (user / "runs").mkdir(exist_ok=True)
        (user / "runs" / "trial.json").write_text("{}")  # the tune's own --out: never touched
        changed = guard.restore(since)
        assert {p.name for p in changed} >= {"ckpt.pt", "old.bin", "__pycache__", "m.pyc"}
        assert _tree(user) == before and not (user / "__pycache__").exists()
    assert (user / "runs" / "trial.json").exists()
    guard.drop()
    assert not (tmp_path / "keep").exists()


def test_a_file_too_large_to_keep_is_named_not_guessed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_files, "MAX_KEPT_BYTES", 10)
    (tmp_path / "ckpt.pt").write_bytes(b"x" * 100)
    guard = FolderGuard([(tmp_path, MAX_DEPTH)], skip=[], keep=tmp_path.parent / f"{tmp_path.name}-keep")
    guard.snapshot()
    (tmp_path / "ckpt.pt").write_bytes(b"y" * 100)
    with pytest.raises(FolderChanged, match="too large to keep"):
        guard.restore(0)


def test_files_made_before_the_launch_are_left_alone(tmp_path: Path) -> None:
    guard = FolderGuard([(tmp_path, 1)], skip=[], keep=tmp_path.parent / f"{tmp_path.name}-keep2")
    guard.snapshot()
    (tmp_path / "notes.txt").write_text("the user's, written before the launch")
    os.utime(tmp_path / "notes.txt", (1, 1))
    assert guard.restore(time.time_ns()) == [] and (tmp_path / "notes.txt").exists()


def test_tune_out_of_another_user_is_refused_before_it_is_chmod_ed(tmp_path: Path) -> None:
    from ddpdoctor.commands.tune_trials import prepare_root

    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder another user's")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chmod(theirs, 0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(BadInput, match="another user"):
        prepare_root(theirs, overwrite=True)
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755
