"""What ddpdoctor knows of its job's processes from /proc (never from a message): the tree it started, and
whether a rank is doing anything (CPU time and I/O of its threads)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

PROC = Path("/proc")


def _ppid(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (not ``root`` itself), read from /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(PROC)
    except OSError:
        return set()
    for name in entries:
        if name.isdigit():
            ppid = _ppid(int(name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def in_tree(pid: int | None, root: int | None) -> bool:
    """True when ``pid`` is ``root`` or one of its live descendants (a PID ddpdoctor may act on)."""
    if not pid or not root or pid <= 1:
        return False
    return pid == root or pid in descendants(root)


def signal_own(pid: int | None, root: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only when it belongs to the process tree ddpdoctor started under ``root``."""
    if not in_tree(pid, root):
        return False
    try:
        os.kill(pid, sig)  # type: ignore[arg-type]  # in_tree checked it is an int
        return True
    except (ProcessLookupError, PermissionError):
        return False


def activity(pid: int, skip_tids: frozenset[int] = frozenset(),
             only: frozenset[int] | None = None) -> tuple[int, int] | None:
    """(CPU ticks, I/O bytes) summed over ``pid``'s threads except ``skip_tids`` (the heartbeat thread, whose
    own beats would make every rank look busy), or over the threads ``only`` (the training thread: busy is judged
    on it, not on gloo's spinning I/O threads); None when the process (or every thread of ``only``) is gone."""
    task_dir = PROC / str(pid) / "task"
    try:
        tids = [int(t) for t in os.listdir(task_dir) if t.isdigit()]
    except OSError:
        return None
    if only is not None:
        tids = [t for t in tids if t in only]
        if not tids:
            return None
    cpu = io = 0
    for tid in tids:
        if tid in skip_tids:
            continue
        try:
            stat = (task_dir / str(tid) / "stat").read_bytes()
            fields = stat[stat.rfind(b")") + 2:].split()
            cpu += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
        try:
            for line in (task_dir / str(tid) / "io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("rchar", "wchar"):
                    io += int(value)
        except (OSError, ValueError):
            pass
    return cpu, io


# Where a thread sleeps (/proc/PID/task/TID/wchan) when it waits for a child process: waitpid (subprocess.run,
# Popen.wait, multiprocessing's join) or a poll/select/read on the child's pipes (subprocess.run(capture_output=True),
# communicate()). A collective's wait (gloo's condition variable: a futex) or a socket read is none of these.
_CHILD_WAITS = ("do_wait", "poll_schedule_timeout", "do_sys_poll", "do_select", "core_sys_select", "pipe_read",
                "pipe_wait", "ep_poll", "do_epoll_wait")


def waits_on_children(pid: int, tid: int) -> bool:
    """True when thread ``tid`` of ``pid`` sleeps where a thread waiting for a child process sleeps (_CHILD_WAITS)."""
    try:
        where = (PROC / str(pid) / "task" / str(tid) / "wchan").read_text().strip()
    except OSError:
        return False
    return where.startswith(_CHILD_WAITS)


def children_activity(pid: int) -> tuple[int, int]:
    """(CPU ticks, I/O bytes) of every live descendant of ``pid``, all their threads: a checkpoint uploader, an
    evaluation or preprocessing subprocess, compile workers doing the rank's work while its training thread waits."""
    cpu = io = 0
    for child in descendants(pid):
        got = activity(child)
        if got is not None:
            cpu, io = cpu + got[0], io + got[1]
    return cpu, io


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when the thread that started it dies (prctl PR_SET_PDEATHSIG):
    a job whose watcher is gone, whatever killed it, does not run on unsupervised. Linux only; False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """SIGKILL this process when the one that started it (torchrun, or ddpdoctor under --launcher none) dies: a rank
    or a preflight worker never outlives its watcher, whatever killed it."""
    if set_parent_death_signal(signal.SIGKILL) and os.getppid() == 1:
        os._exit(1)  # already orphaned before the line above took effect
