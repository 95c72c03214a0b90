"""The ddpdoctor TensorBoard tab on a real TensorBoard server (issue 26, item 2; docs/trust.md): a private run is
shown only to the user who started TensorBoard, a run made readable by everyone (`chmod -R a+rX`) to anyone, and
nothing is served through a link out of the log dir (a report.json linked to a root-only file, a run folder
linked from elsewhere). The other local user is uid 65534 through `setpriv` (skipped where that is not possible)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SAMPLE_RUN
from tests.e2e.test_tensorboard import TensorBoard

# One worker runs the whole module (--dist loadgroup), so its module-scoped run is made once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="tensorboard_trust")]
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
SECRET = '{"secret": "root only"}'


def _private(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.chmod(p, 0o700 if p.is_dir() else 0o600)


def _shared(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TensorBoard, Path]]:
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-tbtrust-"))
    logdir = top / "logs"
    logdir.mkdir()
    for name in ("mine", "shared", "theirs", "theirs_shared", "escape"):
        shutil.copytree(SAMPLE_RUN, logdir / name, ignore=shutil.ignore_patterns("scalars"))
    _private(logdir / "mine")
    _shared(logdir / "shared")
    _private(logdir / "theirs")
    _shared(logdir / "theirs_shared")
    can_chown = os.geteuid() == 0
    if can_chown:
        for name in ("theirs", "theirs_shared"):
            for p in [logdir / name, *(logdir / name).rglob("*")]:
                os.chown(p, 65534, 65534)
    (top / "secret.json").write_text(SECRET)
    os.chmod(top / "secret.json", 0o600)
    (logdir / "escape" / "report.json").unlink()
    os.symlink(top / "secret.json", logdir / "escape" / "report.json")  # a link named like a report
    _shared(logdir / "escape")
    shutil.copytree(SAMPLE_RUN, top / "outside", ignore=shutil.ignore_patterns("scalars"))
    os.symlink(top / "outside", logdir / "linked")  # a run folder linked into the log dir
    os.chmod(top, 0o755)
    tb = TensorBoard(logdir)
    try:
        tb.wait_for("data/plugin/ddpdoctor/runs", lambda a: isinstance(a, dict) and a.get("runs"))
        yield tb, top
    finally:
        tb.stop()
        shutil.rmtree(top, ignore_errors=True)


def _get(tb: TensorBoard, path: str, as_nobody: bool = False) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{tb.port}/data/plugin/ddpdoctor/{path}"
    if as_nobody:
        code = ("import sys, urllib.request, urllib.error\n"
                "try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=60); sys.stdout.buffer.write(b'200\\n' + r.read())\n"
                "except urllib.error.HTTPError as e:\n    sys.stdout.buffer.write(b'%d\\n' % e.code + e.read())\n")
        out = subprocess.run([*NOBODY, sys.executable, "-c", code, url], capture_output=True, timeout=90, check=True,
                             cwd="/").stdout
        status, _, body = out.partition(b"\n")
        return int(status), body
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _names(tb: TensorBoard, as_nobody: bool = False) -> set[str]:
    status, body = _get(tb, "runs", as_nobody)
    assert status == 200, body
    return {r["run"] for r in json.loads(body)["runs"]}


def _need_nobody() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another local user")


def test_the_user_who_started_tensorboard_sees_private_and_shared_runs_never_links(served):
    tb, _top = served
    expected = {"mine", "shared", "theirs_shared"} if os.geteuid() == 0 else {"mine", "shared", "theirs", "theirs_shared"}
    assert _names(tb) == expected
    for run in ("escape", "linked"):
        for route in ("report.json", "report", "timeline"):
            status, body = _get(tb, f"{route}?run={run}")
            assert status == 404 and b"root only" not in body, (run, route, status, body[:200])
    status, body = _get(tb, "report.json?run=mine")
    assert status == 200 and json.loads(body)["tool"] == "ddpdoctor"


def test_another_local_user_sees_only_runs_shared_on_purpose(served):
    _need_nobody()
    tb, _top = served
    assert _names(tb, as_nobody=True) == {"shared", "theirs_shared"}
    for run in ("mine", "theirs", "escape", "linked"):
        for route in ("report.json", "report", "timeline"):
            status, body = _get(tb, f"{route}?run={run}", as_nobody=True)
            assert status == 404 and b"root only" not in body, (run, route, status)
    status, body = _get(tb, "report.json?run=shared", as_nobody=True)
    assert status == 200 and json.loads(body)["tool"] == "ddpdoctor"
    status, body = _get(tb, "timeline?run=shared", as_nobody=True)
    assert status == 200 and json.loads(body)["ranks"]


_SAME_PORT_CLIENT = """
import socket, sys
port, addr = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((addr, port))  # the server's own port number, on another loopback address
except OSError as exc:
    print("BIND", exc); sys.exit(0)
s.settimeout(60)
s.connect(("127.0.0.1", port))
s.sendall(b"GET /data/plugin/ddpdoctor/runs HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
out = b""
while chunk := s.recv(65536):
    out += chunk
sys.stdout.buffer.write(out)
"""


def test_a_client_with_the_servers_port_number_is_not_taken_for_the_server(served):
    # Issue 40 item 3: bound to 127.0.0.X with the server's own port number, a client was served root's private run
    # (31 of 40 addresses): the peer check matched ports only, so it found the server's own socket.
    _need_nobody()
    tb, _top = served
    tried = 0
    for last in range(2, 8):
        out = subprocess.run([*NOBODY, sys.executable, "-c", _SAME_PORT_CLIENT, str(tb.port), f"127.0.0.{last}"],
                             capture_output=True, timeout=90, check=True, cwd="/").stdout
        if out.startswith(b"BIND"):
            continue
        tried += 1
        body = out.partition(b"\r\n\r\n")[2]
        names = {r["run"] for r in json.loads(body)["runs"]}
        assert names == {"shared", "theirs_shared"}, (last, names)
    assert tried, "no loopback address could be bound with the server's port"


def test_a_run_swapped_for_a_link_after_the_check_reads_nothing_else(served):
    # Issue 40 item 3: a run or trace folder swapped for a link between the check and the read leaked root-only
    # data. The tab opens a run once and reads through that handle: swapping it afterwards changes nothing read.
    from ddpdoctor.tensorboard_plugin import access, runs

    _tb, top = served
    logdir = top / "logs"
    work = top / "swap"
    shutil.copytree(logdir / "shared", work / "run")
    secret = work / "secret"
    shutil.copytree(logdir / "shared", secret)
    (secret / "report.json").write_text(SECRET)
    os.chmod(secret / "report.json", 0o600)
    with access.opened_run(work, "run", viewer=None) as path:
        assert path is not None
        (work / "run").rename(work / "moved")
        (work / "run").symlink_to(secret)  # swapped after the check
        assert b"root only" not in runs.read_report_bytes(path)
        tl = runs.timeline(path)
        assert tl["ranks"]
    with access.opened_run(work, "run", viewer=None) as path:
        assert path is None  # a link is never opened as a run
