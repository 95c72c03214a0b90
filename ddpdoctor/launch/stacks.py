"""Where a rank's Python stack comes from when the monitor needs it: py-spy on the process, else the rank's own
heartbeat thread (over the authenticated channel), else its faulthandler signal into the run directory.

Every PID here is one ddpdoctor checked belongs to the process tree it started (launch/proctree.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddpdoctor.launch.proctree import signal_own


def py_spy_dump(pid: int | None, timeout: float = 8.0) -> str | None:
    """`py-spy dump --pid PID`, or None when py-spy is missing or cannot attach (no ptrace)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not pid or not Path(exe).exists():
        return None
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def faulthandler_dump(pid: int | None, root: int | None, stacks_file: Path, wait_s: float = 1.5) -> str | None:
    """Ask the rank's faulthandler (registered by the heartbeat probe on SIGUSR2) to write all its threads' stacks
    into ``stacks_file``: a path of ddpdoctor's own run directory, never one a message named."""
    if not signal_own(pid, root, signal.SIGUSR2):
        return None
    deadline = time.time() + wait_s
    while time.time() < deadline:
        try:
            text = stacks_file.read_text(errors="replace")[: 1 << 20]
        except OSError:
            text = ""
        if text.strip():
            return text
        time.sleep(0.1)
    return None
