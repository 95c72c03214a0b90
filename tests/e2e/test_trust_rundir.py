"""Another local user (uid 65534 through `setpriv`) prepares the run directory before the job starts (issue 26,
items 1 and 5; docs/trust.md "Shared storage"): a folder of theirs with a link planted as a rank log, a folder
of ours that everyone may write, a parent without the sticky bit. Each launch is refused with one line and exit 2
before anything is written, and the root-only file the link names is unchanged. A run in a folder of our own has
owner-only modes throughout. The attacks need root and `setpriv` (else skipped)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.teardown import settle_run

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
SECRET = "root only\n"


def _as_nobody(script: str) -> None:
    subprocess.run([*NOBODY, "sh", "-c", script], check=True, timeout=30)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A /tmp-like folder (1777) that uid 65534 can reach, with a root-only file beside it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another local user")
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-trust-"))
    try:
        os.chmod(top, 0o755)
        (top / "secret").write_text(SECRET)
        os.chmod(top / "secret", 0o600)
        share = top / "share"
        share.mkdir()
        os.chmod(share, 0o1777)
        try:
            _as_nobody(f"test -w {share}")
        except subprocess.CalledProcessError:
            pytest.skip("setpriv cannot act as uid 65534 here")
        yield share
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _launch(out: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("run", "--nproc-per-node", "2", "-q", "--out", str(out), str(SCENARIOS / "healthy.py"),
                   timeout=120)


def _plant(run: str) -> str:
    """Shell for uid 65534: links named like a rank log, the lock and a report, all to the root-only file."""
    secret = Path(run).parents[1] / "secret"
    return (f"mkdir -p {run}/ranks/rank0 && ln -s {secret} {run}/ranks/rank0/stdout.log && "
            f"ln -s {secret} {run}/.ddpdoctor.lock && ln -s {secret} {run}/report.json && chmod -R a+rwx {run}/ranks")


def _refused(proc: subprocess.CompletedProcess[str], share: Path, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert (share.parent / "secret").read_text() == SECRET
    assert stat.S_IMODE((share.parent / "secret").stat().st_mode) == 0o600


def test_a_run_directory_made_by_another_user_is_refused(shared):
    run = shared / "run"
    _as_nobody(_plant(str(run)))
    _refused(_launch(run), shared, "belongs to another user (uid 65534)")
    assert not (run / "manifest.json").exists()


def test_our_folder_that_others_may_write_is_refused(shared):
    run = shared / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    _as_nobody(_plant(str(run)))
    _refused(_launch(run), shared, "writable by other users (mode 0777)", "chmod go-w")


def test_a_link_in_place_of_the_run_directory_is_refused(shared):
    target = shared / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, shared / "run")
    _refused(_launch(shared / "run"), shared, "symbolic link")
    assert not any(target.iterdir())


def test_a_parent_everyone_may_write_without_sticky_bit_is_refused(shared):
    parent = shared / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    _refused(_launch(parent / "run"), shared, "writable by every user without the sticky bit")
    assert not (parent / "run").exists()


@pytest.mark.slow
def test_a_run_of_our_own_is_owner_only(tmp_path):
    """Item 5: ranks/rankR/ 0700 and the rank logs 0600 (and every other folder and file ddpdoctor writes),
    while the job's own files keep the user's umask."""
    out = tmp_path / "shared-parent" / "run"
    script = tmp_path / "job.py"
    script.write_text(SCENARIOS.joinpath("healthy.py").read_text()
                      + "\nimport os\nopen(os.path.join(os.environ['JOB_OUT'], f\"ckpt{os.environ['RANK']}\"), 'w')"
                        ".close()\n")
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--out", str(out), str(script), timeout=180,
                   env={"JOB_OUT": str(tmp_path), "PYTHONPATH": str(SCENARIOS)})
    settle_run(proc, out)  # torch's teardown abort alone is forgiven (tests/teardown.py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loose = []
    for path in [out, *out.rglob("*")]:
        if "torchrun" in path.relative_to(out).parts[:1] and path.parent != out / "torchrun":
            continue  # torchrun's own per-attempt logs, inside torchrun/ (0700)
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            loose.append(f"{path.relative_to(out)} {mode:04o}")
    assert not loose, loose
    for r in (0, 1):
        assert stat.S_IMODE((out / "ranks" / f"rank{r}").stat().st_mode) == 0o700
        assert stat.S_IMODE((out / "ranks" / f"rank{r}" / "stdout.log").stat().st_mode) == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "ckpt0").stat().st_mode) == 0o666 & ~umask  # the job's umask is the user's
