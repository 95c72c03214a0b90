"""An unprivileged local user attacks a running job's monitor (issue 13, "Shown by"): forged hellos and exits, a
guessed token, junk, an absurd world size, an endless line, hundreds of open connections, a PID and a root-only
file named in messages. The job's result and its hang detection are unaffected, no file is read, no foreign
process is signalled and ddpdoctor's thread count stays bounded. Needs root and `setpriv` (else skipped)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SCENARIOS

pytestmark = pytest.mark.slow

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
ATTACKER = r"""
import json, socket, sys, time
host, port, victim, secret, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
hello = {"type": "hello", "rank": 0, "world_size": 2, "pid": victim, "stacks_file": secret}
payloads = [json.dumps(dict(hello, token="0" * 64)).encode() + b"\n",                   # a guessed token
            json.dumps(dict(hello, world_size=10**12)).encode() + b"\n",                # no token, absurd size
            b'{"type": "exit", "status": {"exit_code": 0}}\n',                          # a forged exit
            b'{"type": "beat", "step": 99, "pid": %d}\n' % victim,                      # a forged beat
            b"\x1b]0;pwned\x07\x1b[2J junk\n",                                          # terminal escapes
            b"x" * 200000]                                                             # an endless line
held, sent = [], 0
deadline = time.time() + seconds
while time.time() < deadline:
    for p in payloads:
        try:
            s = socket.create_connection((host, port), timeout=1)
            s.sendall(p)
            held.append(s)
            sent += 1
        except OSError:
            pass
    held = held[-600:]  # keep hundreds of connections open
    time.sleep(0.02)
print(sent)
"""


def monitor_port(pid: int, timeout: float = 60) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if f"pid={pid}," in line:
                return int(line.split()[3].rsplit(":", 1)[1])
        time.sleep(0.1)
    raise AssertionError("ddpdoctor's monitor never listened")


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("ss"),
                    reason="needs root, setpriv and ss to act as another local user")
def test_an_unprivileged_local_user_cannot_drive_the_monitor(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("TOP-SECRET-ROOT-ONLY")
    secret.chmod(0o600)
    victim = subprocess.Popen([*NOBODY, "/usr/bin/python3", "-c", "import time; time.sleep(600)"])
    out = tmp_path / "run"
    env = dict(os.environ, PAUSE_RANK="0", PAUSE_STEP="4", PAUSE_KIND="sleep", STEPS="8", PYTHONUNBUFFERED="1")
    job = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "run", "--nproc-per-node", "2", "--hang-timeout", "3",
                            "-q", "--json", "--out", str(out), str(SCENARIOS / "pause.py")],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attacker = None
    try:
        port = monitor_port(job.pid)
        attacker = subprocess.Popen([*NOBODY, "/usr/bin/python3", "-c", ATTACKER, "127.0.0.1", str(port),
                                     str(victim.pid), str(secret), "300"], stdout=subprocess.PIPE, text=True)
        most_threads = 0
        while job.poll() is None:
            most_threads = max(most_threads, threads_of(job.pid))
            time.sleep(0.2)
        stdout, stderr = job.communicate()
    finally:
        if attacker is not None:
            attacker.kill()
        job.kill()
    report = json.loads(stdout)
    # The job's result and its hang detection are what they are without the attacker.
    assert job.returncode == 1, stderr[-3000:]
    (hang,) = [f for f in report["findings"] if f["id"] == "hang"]
    assert hang["evidence"]["culprit_ranks"] == [0] and hang["evidence"]["reported_after_s"] <= 3 + 5
    # Nothing the attacker named was read or signalled.
    for name in ("hang.txt", "hang.json", "heartbeats.json", "report.json"):
        assert "TOP-SECRET" not in (out / name).read_text()
    assert (out / "hang.txt").stat().st_mode & 0o077 == 0
    assert victim.poll() is None, "a process of another user was signalled"
    victim.kill()
    # One event loop: the attack's hundreds of connections did not become threads.
    assert most_threads <= 12, most_threads
    rejected = json.loads((out / "heartbeats.json").read_text())["monitor"]["rejected"]
    print(f"attack: {sum(rejected.values())} connections dropped {rejected}; ddpdoctor's threads at most {most_threads}")
    notes = " ".join(report.get("notes", []))
    assert "dropped" in notes and "bad-token" in notes
