"""Re-run issue 26's attacks and faults on this machine and print what happened to each, with counts.

    python benchmarks/edges_review.py            # every group (a few minutes on 2 cores)
    python benchmarks/edges_review.py faults     # one group: attacks, escapes, inputs, faults, round4,
                                                 # round4_faults, round5, round5_faults, long

* attacks (as uid 65534 through `setpriv`, when root and setpriv are here): another user's --out with links planted
  as a rank log, the lock and the report; a --out everyone may write; --out as a link; a parent folder writable by
  everyone without the sticky bit. Expected: exit 2, one line, the root-only file unchanged.
* escapes: file names carrying OSC/CSI sequences given to analyze, logs and topo. Expected: no ESC on stderr.
* inputs: damaged run-directory artefacts and traces (NaN, Infinity, a lone surrogate, truncated gzip, deep JSON).
  Expected: no traceback, exit 0/1/2, and any --json output strict JSON.
* faults (real 2-rank gloo jobs): a rank killed by SIGTERM, SIGKILL, SIGSEGV, SIGABRT (the culprit must be that rank);
  a rank that aborts at teardown after finishing (`aborted-after-finish`, job exit kept); a disk that fills during
  the job (tmpfs, when mount works: exit 0 and `disk-full`); ddpdoctor itself SIGKILLed (`status` unfinished, no
  process of the job left).
* round4 (issue 40): uid 65534 lists, reads and deletes the job store's keys, replays and moves values; the head's
  final word deleted; links planted for --html/--merge's old temporary names; a TensorBoard client bound to
  127.0.0.X with the server's port number; a run folder swapped for a link while the tab reads it.
* round4_faults (real launches, minutes): a rank waiting 75 s on a busy child under the default timeout; a healthy
  job with 40 KiB free on its disk.
* round5 (issue 40, this round; seconds): uid 65534 deletes a node's record and its end from the job store (the head
  says "unknown", never lost, never a hang; a deleted end comes back); `tune --out` of another user; capture's
  out-of-range counts; topo's EFA rule at 20k/40k/80k repetitions; TensorBoard's writer on a 400 KiB tmpfs.
* round5_faults (real launches, minutes): SIGTERM to a rank at start-up; a profile run's modes and console (USDT);
  a profile run with 400 KiB free.
* long (minutes): the fuzzers' full-size inputs (200,000 steps, a 108 KB NCCL line, 2,000,000 log lines) through
  the real CLI: a report from each, under 60 s wall and 1 GiB.

Each line: what was done, how many times, how many came out as expected, and the first unexpected outcome."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "tests" / "scenarios"
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
RESULTS: list[tuple[str, int, int, str]] = []


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def record(label: str, outcomes: list[str]) -> None:
    """``outcomes``: "" for each expected outcome, else what went wrong."""
    bad = [o for o in outcomes if o]
    RESULTS.append((label, len(outcomes), len(outcomes) - len(bad), bad[0] if bad else ""))
    print(f"{label:<62} {len(outcomes) - len(bad):>3}/{len(outcomes):<3} {bad[0][:120] if bad else 'as expected'}",
          flush=True)


def _one_line_exit2(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 2 or len(lines) != 1 or "Traceback" in proc.stderr:
        return f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    return ""


def attacks() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("attacks: skipped (needs root and setpriv)")
        return
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-review-"))
    try:
        os.chmod(top, 0o755)
        secret = top / "secret"
        secret.write_text("root only\n")
        os.chmod(secret, 0o600)
        share = top / "share"
        share.mkdir()
        os.chmod(share, 0o1777)
        outcomes: dict[str, list[str]] = {"foreign --out with planted links": [], "--out writable by everyone": [],
                                          "--out is a symbolic link": [], "parent writable, not sticky": []}
        for i in range(3):
            run = share / f"planted{i}"
            subprocess.run([*NOBODY, "sh", "-c", f"mkdir -p {run}/ranks/rank0 && ln -s {secret} "
                            f"{run}/ranks/rank0/stdout.log && ln -s {secret} {run}/.ddpdoctor.lock && "
                            f"ln -s {secret} {run}/report.json && chmod -R a+rwx {run}"], check=True)
            proc = cli("run", "--nproc-per-node", "2", "-q", "--out", str(run), str(SCENARIOS / "healthy.py"))
            problem = _one_line_exit2(proc) or ("" if secret.read_text() == "root only\n" else "secret changed")
            outcomes["foreign --out with planted links"].append(problem)
            mine = share / f"open{i}"
            mine.mkdir()
            os.chmod(mine, 0o777)
            outcomes["--out writable by everyone"].append(_one_line_exit2(
                cli("run", "--nproc-per-node", "2", "-q", "--out", str(mine), str(SCENARIOS / "healthy.py"))))
            link = share / f"link{i}"
            subprocess.run([*NOBODY, "ln", "-s", str(top), str(link)], check=True)
            outcomes["--out is a symbolic link"].append(_one_line_exit2(
                cli("run", "--nproc-per-node", "2", "-q", "--out", str(link), str(SCENARIOS / "healthy.py"))))
            loose = top / f"loose{i}"
            loose.mkdir()
            os.chmod(loose, 0o777)
            outcomes["parent writable, not sticky"].append(_one_line_exit2(
                cli("run", "--nproc-per-node", "2", "-q", "--out", str(loose / "run"), str(SCENARIOS / "healthy.py"))))
        for label, outs in outcomes.items():
            record(f"attack (uid 65534): {label}", outs)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def escapes() -> None:
    names = ["\x1b]0;owned\x07run.log", "a\x1b[2Jb.json", "\x9b31mc.log", "d\x1b]8;;http:x\x1b\\e.txt"]
    outs: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            p = Path(tmp) / name
            p.write_bytes(b"\x1b]0;inside\x07 not a trace {\n")
            for cmd in (["analyze", str(p)], ["logs", str(p)], ["topo", str(p)], ["analyze", str(p) + "-missing"]):
                proc = cli(*cmd)
                bad = "\x1b" in proc.stderr or "\x9b" in proc.stderr or "\x07" in proc.stderr
                outs.append(f"{cmd[0]}: escape reached stderr" if bad else
                            ("traceback" if "Traceback" in proc.stderr else ""))
    record("escapes in file names and contents (analyze, logs, topo)", outs)


def inputs() -> None:
    import gzip

    docs = {
        "status.json": [b'{"exit_code": NaN, "steps_completed": Infinity}', b'{"exit_code": 0, "exception": "\\ud800"}',
                        b"[" * 5000, b'{"exit_code": "zero"}', b"\xff\xfe{", b""],
        "manifest.json": [b'{"exit_code": -Infinity, "ended": {"how": "running"}}', b'{"world_size": 1e400}',
                          b'{"world_size": ' + b"9" * 5001 + b"}", b'{"mode": "run\xed\xa0\x80"}'],
    }
    outs: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        n = 0
        for name, bodies in docs.items():
            for body in bodies:
                n += 1
                run = base / f"run{n}"
                (run / "ranks" / "rank0").mkdir(parents=True)
                (run / "manifest.json").write_text('{"mode": "run", "ended": {"how": "exited", "exit_code": 0}, '
                                                   '"finished": true, "exit_code": 0}')
                target = run / name if name == "manifest.json" else run / "ranks" / "rank0" / name
                target.write_bytes(body)
                for cmd in (["status", "--json", str(run)], ["analyze", "--json", str(run)]):
                    outs.append(_strict(cli(*cmd)))
        trace_bodies = [gzip.compress(b'{"traceEvents": [')[:-8], b'{"traceEvents": [{"ph": "X", "ts": NaN}]}',
                        b'{"traceEvents": "\\ud800"}', b"{" * 100000]
        for i, body in enumerate(trace_bodies):
            p = base / (f"rank{i}.pt.trace.json" + (".gz" if i == 0 else ""))
            p.write_bytes(body)
            outs.append(_strict(cli("analyze", "--json", str(p))))
    record("damaged artefacts and traces (status, analyze --json)", outs)


def _strict(proc: subprocess.CompletedProcess[str]) -> str:
    if "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2):
        return f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    if proc.stdout.strip():
        try:
            json.loads(proc.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError as exc:
            return f"not strict JSON: {exc}"
    if proc.returncode == 2 and len(proc.stderr.strip().splitlines()) != 1:
        return f"exit 2 but not one line: {proc.stderr.strip()[-200:]}"
    return ""


def _run_json(out: Path, script: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    proc = cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), str(SCENARIOS / script), env=env)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, {"findings": [], "stderr": proc.stderr[-300:]}


def _serious(report: dict) -> list[tuple[str, list[int]]]:
    return [(f["id"], f["ranks"]) for f in report.get("findings", []) if f["severity"] in ("warning", "error")]


def faults(repeat: int = 2) -> None:
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-faults-") as tmp:
        base = Path(tmp)
        n = 0

        def nxt() -> Path:
            nonlocal n
            n += 1
            return base / f"run{n}"

        for sig, victim in (("TERM", 1), ("KILL", 1), ("SEGV", 1), ("ABRT", 1), ("TERM", 0)):
            outs = []
            for _ in range(repeat):
                code, report = _run_json(nxt(), "rank_signal.py", {"FAULT_SIGNAL": sig, "FAULT_RANK": str(victim)})
                serious = _serious(report)
                ok = code == 1 and serious and serious[0][0] == "rank-crashed" and serious[0][1] == [victim]
                outs.append("" if ok else f"exit {code}, findings {serious}")
            record(f"fault: rank {victim} killed by SIG{sig} (culprit rank {victim})", outs)
        outs = []
        for _ in range(repeat):
            code, report = _run_json(nxt(), "abort_at_exit.py")
            ok = code == 1 and _serious(report) == [("aborted-after-finish", [1])]
            outs.append("" if ok else f"exit {code}, findings {_serious(report)}")
        record("fault: rank 1 aborts at teardown after finishing", outs)
        disk = base / "disk"
        disk.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=768k", "tmpfs", str(disk)],
                          capture_output=True).returncode == 0:
            outs = []
            try:
                for i in range(repeat):
                    code, report = _run_json(disk / f"run{i}", "fill_disk.py",
                                             {"FILL_PATH": str(disk / "ckpt.bin"), "STEPS_AFTER": "6"})
                    ok = code == 0 and _serious(report) == [("disk-full", [])]
                    outs.append("" if ok else f"exit {code}, findings {_serious(report)}")
                    subprocess.run(["sh", "-c", f"rm -rf {disk}/*"])
            finally:
                subprocess.run(["umount", str(disk)], capture_output=True)
            record("fault: the disk fills during the job (768 KiB tmpfs)", outs)
        else:
            print("fault: full disk skipped (cannot mount a tmpfs)")
        outs = []
        for _ in range(repeat):
            out = nxt()
            marker = base / f"job{n}"
            marker.mkdir()
            for f in ("_common.py", "long_training.py"):
                shutil.copy(SCENARIOS / f, marker)
            proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "run", "--nproc-per-node", "2", "-q",
                                     "--out", str(out), str(marker / "long_training.py")], cwd=REPO,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 120
            while time.time() < deadline and not list(out.glob("ranks/rank*/info.json")):
                time.sleep(0.5)
            time.sleep(2)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            time.sleep(3)
            left = [ln for ln in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
                    if str(marker) in ln and "ps -eo" not in ln]
            st = cli("status", str(out))
            ok = not left and st.returncode == 1 and "unfinished" in st.stdout
            outs.append("" if ok else f"left {left[:1]}, status exit {st.returncode}: {st.stdout[:120]}")
        record("fault: ddpdoctor itself SIGKILLed (no orphan, unfinished)", outs)


# -- issue 40: the job store, planted temporary links, the TensorBoard tab's peers -----------------------------
_STORE_SPY = """
import datetime, sys, zlib
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=10))
keys = store.list_keys()
leaked = 0
for k in keys:
    v = bytes(store.get(k))
    texts = [v]
    for start in range(0, 72):
        try:
            texts.append(zlib.decompressobj().decompress(v[start:], 1 << 22))
        except zlib.error:
            pass
    leaked += any(m in t for t in texts for m in (b"SECRET-MARKER", b"verdict", b"files/", b"Traceback"))
    leaked += any(m in k for m in ("verdict", "files", "node", "final"))
print(len(keys), leaked)
for k in keys:
    store.delete_key(k)  # and deletes what it found
"""


def store_privacy(repeat: int = 5) -> None:
    """A job store hosted by root, values put by a node; uid 65534 lists, reads and deletes every key. Expected:
    nothing readable; the values the head then reads are missing, never forged."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("store: skipped (needs root and setpriv)")
        return
    sys.path.insert(0, str(REPO))
    from ddpdoctor.job.store import JobStore
    from tests.ports import reserve_port

    outs: list[str] = []
    for i in range(repeat):
        head = JobStore("127.0.0.1", reserve_port(), f"{i:032d}", is_head=True, connect_timeout_s=10)
        node = JobStore("127.0.0.1", head.port, f"{i:032d}", is_head=False, connect_timeout_s=10)
        node.put("files/1", {"3": {"stderr.log": "Traceback (most recent call last): SECRET-MARKER " * 50}})
        node.put("verdict", {"line": "job hung: culprit rank 3 SECRET-MARKER"})
        head.put("final", {"line": "job finished", "code": 0, "head": "h", "report": "r"})
        proc = subprocess.run([*NOBODY, sys.executable, "-c", _STORE_SPY, str(head.port)], capture_output=True,
                              text=True, timeout=120, cwd="/")
        try:
            nkeys, leaked = (int(x) for x in proc.stdout.split())
        except ValueError:
            outs.append(f"spy failed: {proc.stderr.strip()[-200:]}")
            continue
        ok = nkeys == 3 and leaked == 0 and head.get("verdict") is None and head.rejected == 0
        outs.append("" if ok else f"{nkeys} keys, {leaked} leaked, rejected {head.rejected}")
        head.close()
    record("attack (uid 65534): list, read, delete the job store", outs)
    outs = []
    for i in range(repeat):
        head = JobStore("127.0.0.1", reserve_port(), f"{i:032d}", is_head=True, connect_timeout_s=10)
        node = JobStore("127.0.0.1", head.port, f"{i:032d}", is_head=False, connect_timeout_s=10)
        import datetime

        import torch.distributed as dist

        raw = dist.TCPStore("127.0.0.1", head.port, is_master=False, timeout=datetime.timedelta(seconds=10))
        node.put("node/1", {"step": 1})
        old = bytes(raw.get(head.key_of("node/1")))
        node.put("node/1", {"step": 2})
        head.get("node/1")
        raw.set(head.key_of("node/1"), old)  # replayed
        replay_refused = head.get("node/1") is None and head.stale == 1
        raw.set(head.key_of("node/2"), old)  # moved to another name
        moved_refused = head.get("node/2") is None and head.rejected == 1
        outs.append("" if replay_refused and moved_refused else f"replay {replay_refused}, moved {moved_refused}")
        head.close()
    record("attack: replay an old value, move a value to another key", outs)


def final_word_deleted(repeat: int = 2) -> None:
    """The head's final word deleted from the store while its store answers: the node's line and exit code."""
    sys.path.insert(0, str(REPO))
    import ddpdoctor.job.agent as agent_mod
    from ddpdoctor.job import state
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole
    from ddpdoctor.job.store import JobStore
    from tests.ports import reserve_port

    class Quiet:
        hang_timeout, startup_timeout, stalls = 4.0, 60.0, {}

        def records(self, *a: object, **k: object) -> list[object]:
            return []

        def rank_ids(self) -> list[int]:
            return []

    outs: list[str] = []
    saved = agent_mod.END_WAIT_S
    agent_mod.END_WAIT_S = -28.0
    try:
        for i in range(repeat):
            os.environ["DDPDOCTOR_JOB_TOKEN"] = f"{i:032d}"
            head = JobStore("127.0.0.1", reserve_port(), f"{i:032d}", is_head=True, connect_timeout_s=10)
            with tempfile.TemporaryDirectory() as tmp:
                node = JobAgent(JobRole(2, 1, "127.0.0.1", head.port - 1), Quiet(), Path(tmp))  # type: ignore[arg-type]
                node.store = JobStore("127.0.0.1", head.port, f"{i:032d}", is_head=False, connect_timeout_s=10)
                head.put("node/0", state.envelope(0, "h0", 1, [], end=0))
                node.store.put("node/1", state.envelope(1, "h1", 1, [], end=0))
                head.put("final", {"line": "job finished", "code": 0, "head": "h0", "report": "r"})
                head.delete(["final"])
                out = node._finish_node(0)
            ok = out.code == 0 and "was lost" not in (out.line or "")
            outs.append("" if ok else f"exit {out.code}: {out.line}")
            head.close()
    finally:
        agent_mod.END_WAIT_S = saved
        os.environ.pop("DDPDOCTOR_JOB_TOKEN", None)
    record("fault: the head's final word deleted (healthy job: exit 0, no 'head lost')", outs)


def temp_links(repeat: int = 3) -> None:
    """uid 65534 plants links to a root-only file for a range of pids under the temporary names --html and --merge
    used, in a folder everyone may write (not sticky: the kernel's protected_symlinks does not help there)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("temp links: skipped (needs root and setpriv)")
        return
    sample = REPO / "sample_traces" / "mlp_gloo_2rank"
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-review-"))
    outs: list[str] = []
    try:
        os.chmod(top, 0o755)
        secret = top / "secret"
        secret.write_text("root only\n")
        os.chmod(secret, 0o600)
        for i in range(repeat):
            share = top / f"share{i}"
            share.mkdir()
            os.chmod(share, 0o777)
            me = os.getpid()
            plant = " && ".join(f"for p in $(seq {me} {me + 400}); do ln -s {secret} {share}/.{n}.$p.tmp; done; "
                                f"ln -s {secret} {share}/.{n}.tmp" for n in ("report.html", "merged.json.gz"))
            subprocess.run([*NOBODY, "sh", "-c", plant], check=True)
            proc = cli("analyze", str(sample), "--html", str(share / "report.html"), "--merge",
                       str(share / "merged.json.gz"))
            problem = "" if secret.read_bytes() == b"root only\n" else "secret overwritten"
            if not problem and proc.returncode not in (0, 1):
                problem = f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
            if not problem and (share / "report.html").stat().st_mode & 0o077:
                problem = "report.html not 0600"
            outs.append(problem)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    record("attack (uid 65534): links planted for --html/--merge temp names", outs)


_SAME_PORT = """
import socket, sys
port, addr = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((addr, port))
except OSError:
    print("BIND"); sys.exit(0)
s.connect(("127.0.0.1", port))
print("OK"); sys.stdout.flush()
s.recv(16)
"""


def tb_peer(addresses: int = 40) -> None:
    """The TensorBoard tab's peer check against a client of uid 65534 bound to 127.0.0.X with the server's own port
    number (the issue's 40 addresses). Expected: the peer is 65534 (or unknown), never the server's uid."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("tb peer: skipped (needs root and setpriv)")
        return
    sys.path.insert(0, str(REPO))
    import socket

    from ddpdoctor.tensorboard_plugin.access import peer_uid

    outs: list[str] = []
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        port = srv.getsockname()[1]
        for last in range(2, 2 + addresses):
            cli_proc = subprocess.Popen([*NOBODY, sys.executable, "-c", _SAME_PORT, str(port), f"127.0.0.{last}"],
                                        stdout=subprocess.PIPE, text=True, cwd="/")
            assert cli_proc.stdout is not None
            if cli_proc.stdout.readline().strip() != "OK":
                cli_proc.wait()
                continue
            conn, (addr, cport) = srv.accept()
            uid = peer_uid({"REMOTE_ADDR": addr, "REMOTE_PORT": str(cport), "SERVER_PORT": str(port)})
            outs.append("" if uid in (65534, None) else f"127.0.0.{last}: taken for uid {uid}")
            conn.close()
            cli_proc.wait()
    record("attack (uid 65534): TensorBoard client on 127.0.0.X:server's port", outs)


_SWAPPER = """
import os, sys, time
run, real, link_to = sys.argv[1], sys.argv[2], sys.argv[3]
end = time.time() + float(sys.argv[4])
while time.time() < end:
    try:
        os.rename(run, real)
        os.symlink(link_to, run)
        os.unlink(run)
        os.rename(real, run)
    except OSError:
        pass
"""


def tb_swap(seconds: float = 20.0) -> None:
    """uid 65534 swaps a shared run folder in a log dir everyone may write for a link to a root-only run, as fast
    as it can, while the tab checks and reads it (report.json and the timeline). Expected: 0 reads of root's data."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("tb swap: skipped (needs root and setpriv)")
        return
    sys.path.insert(0, str(REPO))
    from ddpdoctor.errors import BadInput
    from ddpdoctor.tensorboard_plugin import access, runs

    sample = REPO / "sample_traces" / "mlp_gloo_2rank"
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-review-"))
    reads = leaks = 0
    try:
        os.chmod(top, 0o755)
        logdir = top / "logs"
        logdir.mkdir()
        os.chmod(logdir, 0o777)
        secret = top / "secret"
        shutil.copytree(sample, secret, ignore=shutil.ignore_patterns("scalars"))
        (secret / "report.json").write_text('{"tool": "ddpdoctor", "secret": "ROOT-ONLY"}')
        for p in [secret, *secret.rglob("*")]:
            os.chmod(p, 0o700 if p.is_dir() else 0o600)
        run = logdir / "run"
        subprocess.run([*NOBODY, "cp", "-r", str(sample), str(run)], check=True)
        subprocess.run([*NOBODY, "chmod", "-R", "a+rX", str(run)], check=True)
        swapper = subprocess.Popen([*NOBODY, sys.executable, "-c", _SWAPPER, str(run), str(logdir / "real"),
                                    str(secret), str(seconds)], cwd="/")
        end = time.time() + seconds
        while time.time() < end:
            with access.opened_run(logdir, "run", viewer=65534) as path:
                if path is None:
                    continue
                reads += 1
                try:
                    leaks += b"ROOT-ONLY" in runs.read_report_bytes(path)
                except BadInput:
                    pass
        swapper.wait()
    finally:
        shutil.rmtree(top, ignore_errors=True)
    record(f"attack (uid 65534): run folder swapped for a link while read ({reads} reads)",
           ["root's report read"] * leaks + [""] * (reads - leaks))


def round4_faults(repeat: int = 2) -> None:
    """Real launches: a rank waiting 75 s on a busy child process under the default 60 s timeout (a long stall, not
    a hang); a healthy job with 40 KiB free on its disk (exit 0, disk-full, never 'killed by a signal?')."""
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-faults-") as tmp:
        outs = []
        for i in range(repeat):
            code, report = _run_json(Path(tmp) / f"child{i}", "pause.py",
                                     {"PAUSE_RANK": "0", "PAUSE_STEP": "4", "PAUSE_KIND": "child", "PAUSE_S": "75",
                                      "STEPS": "8", "SCENARIO_GLOO_TIMEOUT": "600"})
            found = report.get("findings", [])
            ok = code == 0 and "long-stall" in [f["id"] for f in found] and not [f for f in found
                                                                                if f["severity"] == "error"]
            outs.append("" if ok else f"exit {code}, findings {_serious(report)}")
        record("fault: a rank waits 75 s on a busy child (default timeout)", outs)
    sys.path.insert(0, str(REPO))
    from tests.smalldisk import mount_small_tmpfs, unmount

    outs = []
    for _ in range(repeat):
        disk = mount_small_tmpfs("768k")
        if disk is None:
            print("fault: 40 KiB free skipped (cannot mount a tmpfs)")
            return
        try:
            st = os.statvfs(disk)
            (disk / "fill").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (40 << 10)))
            proc = cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(disk / "run"),
                       str(REPO / "examples" / "train_mlp.py"))
            try:
                found = [(f["id"], f["severity"]) for f in json.loads(proc.stdout)["findings"]]
            except ValueError:
                found = [("no report", proc.stderr[-200:])]
            ok = proc.returncode == 0 and "Traceback" not in proc.stderr and not [f for f in found if f[1] == "error"]
            outs.append("" if ok else f"exit {proc.returncode}: {found}")
        finally:
            unmount(disk)
    record("fault: a healthy job with 40 KiB free (exit 0, no rank blamed)", outs)


# -- issue 40, round 5: interference with the job store, tune's --out, capture's counts, topo's EFA rule, the
# TensorBoard writer on a full disk; real launches: a signal at start-up, modes and console of a profile run, a run
# with 400 KiB free; the full-size long inputs -----------------------------------------------------------------
_DELETER = """
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=10))
keys = store.list_keys()
for k in keys:
    store.delete_key(k)
print(len(keys))
"""


class _HeadPort:
    """The NodePort bits the head's decision and end need: what it says and whether it acted."""

    hang_timeout, startup_timeout, on_hang, world_size, changes = 4.0, 60.0, "kill", 2, 0
    stalls: dict[object, object] = {}

    def __init__(self) -> None:
        self.said: list[str] = []
        self.acted: list[str] = []

    def records(self, *a: object, **k: object) -> list[object]:
        return []

    def rank_ids(self) -> list[int]:
        return []

    def say(self, line: str) -> None:
        self.said.append(line)

    def act(self, hang: object, line: str, extra_text: str = "") -> None:
        self.acted.append(line)


def _delete_as_nobody(port: int) -> int:
    proc = subprocess.run([*NOBODY, sys.executable, "-c", _DELETER, str(port)], capture_output=True, text=True,
                          timeout=120, cwd="/")
    return int(proc.stdout.strip() or -1)


def store_interference(repeat: int = 3) -> None:
    """uid 65534 deletes every key of a job store (a node's record, its end): the head says the node is unknown and
    acts on nothing (never lost, never a hang), a node's deleted end comes back, a never-seen end is 'unknown'."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("store interference: skipped (needs root and setpriv)")
        return
    sys.path.insert(0, str(REPO))
    import threading

    import ddpdoctor.job.agent as agent_mod
    from ddpdoctor.job import state
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole
    from ddpdoctor.job.store import JobStore
    from tests.ports import reserve_port

    unknown_outs: list[str] = []
    end_outs: list[str] = []
    head_end_outs: list[str] = []
    saved = agent_mod.END_WAIT_S
    try:
        for i in range(repeat):
            os.environ["DDPDOCTOR_JOB_TOKEN"] = f"{i:032d}"
            with tempfile.TemporaryDirectory() as tmp:
                port = _HeadPort()
                head = JobAgent(JobRole(2, 0, "127.0.0.1", reserve_port() - 1), port, Path(tmp))  # type: ignore[arg-type]
                assert head.store is not None
                node = JobStore("127.0.0.1", head.store.port, f"{i:032d}", is_head=False, connect_timeout_s=10)
                head.store.put("node/0", state.envelope(0, "h0", 1, []))
                node.put("node/1", state.envelope(1, "h1", 1, []))
                head.read_nodes()
                deleted = _delete_as_nobody(head.store.port)
                head.nodes[1].received -= 100.0  # silent since, well past the hang timeout
                head.store.put("node/0", state.envelope(0, "h0", 2, []))
                head._read_at = 0.0
                head._decide(time.time() - 2)
                ok = deleted >= 2 and not head.nodes[1].lost and not port.acted and any("unknown" in x for x in port.said)
                unknown_outs.append("" if ok else f"deleted {deleted}, lost {head.nodes[1].lost}, acted {port.acted}, "
                                                  f"said {port.said}")
                # The node's end, deleted once after it was put: the node puts it back while it waits.
                agent_mod.END_WAIT_S = -27.0
                member = JobAgent(JobRole(2, 1, "127.0.0.1", head.store.port - 1), _HeadPort(), Path(tmp))  # type: ignore[arg-type]
                member.store = node
                member.end = 0
                member.publish()
                _delete_as_nobody(head.store.port)
                t = threading.Thread(target=member._finish_node, args=(0,))
                t.start()
                got = None
                deadline = time.time() + 2.8
                while got is None and time.time() < deadline:
                    time.sleep(0.2)
                    got = head.store.get("node/1")
                t.join()
                end_outs.append("" if isinstance(got, dict) and got.get("end") == 0 else f"the head read {got}")
                # An end that never arrives (deleted as soon as it is put): the head's line says unknown, not dead.
                agent_mod.END_WAIT_S = 1.0
                head.store.put("node/0", state.envelope(0, "h0", 3, [], end=0))
                node.put("node/1", state.envelope(1, "h1", 9, []))  # running, its end not said yet
                head.read_nodes()
                _delete_as_nobody(head.store.port)
                head.nodes[1].received -= 100.0
                head._wait_acks = lambda *a, **k: None  # type: ignore[method-assign]
                out = head._finish_head(Path(tmp), 0)
                ok = out.code == 1 and "end is unknown" in (out.line or "") and "died" not in (out.line or "")
                head_end_outs.append("" if ok else f"exit {out.code}: {out.line}")
                head.store.close()
    finally:
        agent_mod.END_WAIT_S = saved
        os.environ.pop("DDPDOCTOR_JOB_TOKEN", None)
    record("attack (uid 65534): delete a node's record (unknown, not lost)", unknown_outs)
    record("attack (uid 65534): delete a node's end once (it comes back)", end_outs)
    record("attack (uid 65534): a node's end never arrives (head: unknown)", head_end_outs)


def tune_foreign_out() -> None:
    """`tune --out DIR` where DIR is another user's: refused in one line, its mode untouched (it was chmodded)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("tune --out: skipped (needs root and setpriv)")
        return
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-review-"))
    outs: list[str] = []
    try:
        os.chmod(top, 0o1777)
        for i, mode in enumerate(("755", "700", "777")):
            target = top / f"theirs{i}"
            subprocess.run([*NOBODY, "sh", "-c", f"mkdir {target} && chmod {mode} {target}"], check=True)
            before = target.stat().st_mode
            proc = cli("tune", "--nproc-per-node", "2", "--out", str(target), str(REPO / "examples" / "train_mlp.py"),
                       timeout=300)
            after = target.stat().st_mode
            bad = _one_line_exit2(proc) or ("" if before == after else f"mode {before:o} -> {after:o}")
            outs.append(bad)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    record("attack: tune --out of another user (exit 2, mode untouched)", outs)


def capture_counts() -> None:
    """capture's out-of-range counts: one line, exit 2 (click's usage error was three)."""
    outs = []
    with tempfile.TemporaryDirectory() as tmp:
        for args in (["--profile", "0"], ["--profile", "101"], ["--check-sync", "0"], ["--check-sync", "-3"],
                     ["--timeout", "nan"]):
            outs.append(_one_line_exit2(cli("capture", *args, tmp)))
    record("bad input: capture's out-of-range counts (one line, exit 2)", outs)


def topo_efa_growth() -> None:
    """topo on one line of repeated 'efa ' at 20k / 40k / 80k repetitions: CPU s per doubling (linear is x2)."""
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (20_000, 40_000, 80_000):
            p = Path(tmp) / f"efa{n}.log"
            p.write_text("h:1:2 [0] NCCL INFO NET/OFI " + "efa " * n + "\n")
            t = os.times()
            cli("topo", "--json", str(p))
            u = os.times()
            figures.append(u.children_user + u.children_system - t.children_user - t.children_system)
    ratios = [b / max(a, 0.05) for a, b in zip(figures[:-1], figures[1:], strict=True)]
    print(f"  topo EFA line CPU s at 20k/40k/80k: {' / '.join(f'{f:.2f}' for f in figures)}")
    record("bad input: topo's EFA rule on a long line (x2.6 per doubling at most)",
           ["" if r <= 2.6 or figures[-1] < 2.0 else f"x{r:.1f} for x2 ({figures})" for r in ratios])


_TB_FULL = """
import copy, sys, time
from pathlib import Path
from ddpdoctor.reports.sections import PerfSection
from ddpdoctor.renderers.tensorboard import write_scalars
from tests.views_fixtures import sections
s = sections()
for r in s["ranks"]:
    r["per_step"] = [dict(copy.deepcopy(r["per_step"][0]), step=i) for i in range(20_000)]
try:
    write_scalars(PerfSection.from_json(s), Path(sys.argv[1]) / "scalars")
except OSError as exc:
    print("caller got", exc.strerror)
time.sleep(0.5)
"""


def tb_writer_full(repeat: int = 2) -> None:
    """The report's TensorBoard scalars on a 400 KiB tmpfs: the caller gets ENOSPC, the console no traceback."""
    sys.path.insert(0, str(REPO))
    from tests.smalldisk import mount_small_tmpfs, unmount

    outs = []
    for _ in range(repeat):
        disk = mount_small_tmpfs("400k")
        if disk is None:
            print("TensorBoard writer at 400 KiB: skipped (cannot mount a tmpfs)")
            return
        try:
            proc = subprocess.run([sys.executable, "-c", _TB_FULL, str(disk)], capture_output=True, text=True,
                                  timeout=300, cwd=REPO)
        finally:
            unmount(disk)
        ok = "caller got" in proc.stdout and "Traceback" not in proc.stderr
        outs.append("" if ok else f"stdout {proc.stdout[-100:]!r}, stderr {proc.stderr[-200:]!r}")
    record("fault: TensorBoard's writer with 400 KiB free (no traceback)", outs)


def round5() -> None:
    store_interference()
    tune_foreign_out()
    capture_counts()
    topo_efa_growth()
    tb_writer_full()


_STARTUP_TERM = """import os, signal
if os.environ.get("RANK") == "1":
    os.kill(os.getpid(), signal.SIGTERM)  # before init_process_group: rank 0 waits for it at the rendezvous
exec(open(os.path.join(os.path.dirname(__file__), "healthy.py")).read())
"""


def round5_faults(repeat: int = 2) -> None:
    """Real launches: SIGTERM to rank 1 at start-up (only rank 1 blamed); a profile run's files are 0600 and its
    console carries no Kineto 'USDT' line; a profile run with 400 KiB free (no traceback, the job's exit code)."""
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-faults-") as tmp:
        base = Path(tmp)
        for name in ("healthy.py", "_common.py"):
            shutil.copy(SCENARIOS / name, base / name)
        (base / "startup_term.py").write_text(_STARTUP_TERM)
        outs = []
        for i in range(repeat):
            proc = cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(base / f"st{i}"),
                       str(base / "startup_term.py"), env={"SCENARIO_GLOO_TIMEOUT": "30"})
            try:
                errors = [(f["id"], f["ranks"]) for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"]
            except ValueError:
                errors = [("no report", [])]
            outs.append("" if proc.returncode == 1 and errors == [("rank-crashed", [1])]
                        else f"exit {proc.returncode}: {errors}")
        record("fault: SIGTERM to rank 1 at start-up (only rank 1 blamed)", outs)
        outs, usdt = [], []
        for i in range(repeat):
            out = base / f"prof{i}"
            proc = cli("profile", "--nproc-per-node", "2", "--out", str(out), str(REPO / "examples" / "train_mlp.py"))
            loose = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.is_symlink()
                     and p.stat().st_mode & 0o077 and "torchrun" not in p.parts]
            outs.append("" if proc.returncode in (0, 1) and not loose else f"exit {proc.returncode}, modes: {loose[:3]}")
            usdt.append("" if "USDT" not in proc.stdout + proc.stderr else "a USDT line on the console")
        record("run directory: a profile run's files are 0600 (report.html, traces, scalars)", outs)
        record("console: no Kineto USDT line under profile", usdt)
    sys.path.insert(0, str(REPO))
    from tests.smalldisk import mount_small_tmpfs, unmount

    outs = []
    for _ in range(repeat):
        disk = mount_small_tmpfs("1m")
        if disk is None:
            print("fault: 400 KiB free skipped (cannot mount a tmpfs)")
            return
        try:
            st = os.statvfs(disk)
            (disk / "fill").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - (400 << 10)))
            try:
                proc = cli("profile", "--nproc-per-node", "2", "--out", str(disk / "run"),
                           str(REPO / "examples" / "train_mlp.py"), timeout=900)
            except subprocess.TimeoutExpired:
                outs.append("no answer in 900 s")
                continue
            ok = proc.returncode in (0, 1) and "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr
            outs.append("" if ok else f"exit {proc.returncode}: {proc.stderr[-300:]}")
        finally:
            unmount(disk)
    record("fault: a profile run with 400 KiB free (no traceback)", outs)


def long_inputs() -> None:
    """The fuzzers' full-size inputs through the real CLI (tests/fuzz/long_inputs.py): each under 60 s and 1 GiB."""
    sys.path.insert(0, str(REPO))
    from tests.fuzz.long_inputs import FULL, measure

    for fig in measure(dict(FULL), timeout=1800):
        print("  " + fig.line(), flush=True)
        record(f"long input: {fig.label} (a report, < 60 s, < 1 GiB)",
               ["" if fig.exit_code in (0, 1) and fig.status and fig.wall_s < 60 and fig.peak_rss_mb < 1024
                else f"exit {fig.exit_code}, {fig.wall_s:.0f} s wall ({fig.cpu_s:.0f} s CPU), "
                     f"{fig.peak_rss_mb:.0f} MB"])


def round4() -> None:
    store_privacy()
    final_word_deleted()
    temp_links()
    tb_peer()
    tb_swap()


GROUPS: dict[str, Callable[[], None]] = {"attacks": attacks, "escapes": escapes, "inputs": inputs, "faults": faults,
                                         "round4": round4, "round4_faults": round4_faults, "round5": round5,
                                         "round5_faults": round5_faults, "long": long_inputs}


def main() -> None:
    chosen = [a for a in sys.argv[1:] if a in GROUPS] or list(GROUPS)
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    t = time.time()
    for g in chosen:
        GROUPS[g]()
    total = sum(r[1] for r in RESULTS)
    good = sum(r[2] for r in RESULTS)
    print(f"{good}/{total} as expected in {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
