"""Re-run issue 26's attacks and faults on this machine and print what happened to each, with counts.

    python benchmarks/edges_review.py            # every group (a few minutes on 2 cores)
    python benchmarks/edges_review.py faults     # one group: attacks, escapes, inputs, faults

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
        "manifest.json": [b'{"exit_code": -Infinity, "ended": {"how": "running"}}', b'{"world_size": 1e400}'],
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

        for sig in ("TERM", "KILL", "SEGV", "ABRT"):
            outs = []
            for _ in range(repeat):
                code, report = _run_json(nxt(), "rank_signal.py", {"FAULT_SIGNAL": sig})
                serious = _serious(report)
                ok = code == 1 and serious and serious[0][0] == "rank-crashed" and serious[0][1] == [1]
                outs.append("" if ok else f"exit {code}, findings {serious}")
            record(f"fault: rank 1 killed by SIG{sig} (culprit rank 1)", outs)
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


GROUPS: dict[str, Callable[[], None]] = {"attacks": attacks, "escapes": escapes, "inputs": inputs, "faults": faults}


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
