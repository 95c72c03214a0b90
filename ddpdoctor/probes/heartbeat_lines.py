"""What the heartbeat says from the user's thread, cheaply: where the rank is (the user's call site, the main
thread's innermost user frame, its kernel thread id), a collective's group, sequence number and sizes, and the
"enter" and "backward" lines formatted by hand."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.probes.records import CollectiveState

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_call_site(skip: int = 2) -> str | None:
    """file:line of the first frame outside torch and ddpdoctor (the user's code that called us)."""
    try:
        frame: Any = sys._getframe(skip)
    except ValueError:
        return None
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith((_TORCH_DIR, _OUR_DIR)) and not fname.startswith("<"):
            return f"{fname}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_STDLIB = os.path.dirname(os.__file__) + os.sep


def main_thread_site() -> str | None:
    """file:line of the innermost user frame of the main thread (where a rank outside collectives is)."""
    frame: Any = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith((_TORCH_DIR, _OUR_DIR, _STDLIB)) and not fname.startswith("<"):
            return f"{fname}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def main_tid() -> int | None:
    """The training thread's kernel id: busy is judged on its own CPU and I/O (/proc/PID/task/TID), not on the
    process, whose gloo I/O threads (NCCL's watchdog, data-loader threads) keep spinning while it is stuck."""
    return threading.main_thread().native_id


# args/kwargs: the user's own call of a collective, as torch.distributed received it
def collective_sizes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[int]]:
    out: list[list[int]] = []
    for a in list(args[:2]) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(list(a.shape))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            out.append(list(a[0].shape))
    return out


def group_info(group: Any) -> tuple[str, int | None]:
    """(group name, collectives launched so far on it) for ``group`` (None: the default group)."""
    try:
        default = dist.distributed_c10d._get_default_group()
        pg = group if group is not None else default
        name = "default_pg" if pg is default else dist.distributed_c10d._world.pg_names.get(pg, "?")
        # Private ProcessGroup API, absent from torch's stubs; a backend without it lands in the except below.
        return str(name), int(pg._get_sequence_number_for_group())  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not initialised yet, or a backend without sequence numbers
        return "default_pg", None


def enter_line(state: CollectiveState) -> bytes:
    """The "enter" message, formatted by hand: json.dumps of the dict costs ~10x more on the user's thread."""
    seq = "null" if state["seq"] is None else int(state["seq"])
    return (
        f'{{"type":"enter","collective":{{"op":"{state["op"]}","group":{json.dumps(state["group"])},"seq":{seq},'
        f'"sizes":{state["sizes"]},"call_site":{json.dumps(state["call_site"])},"since":{state["since"]!r},'
        f'"step":{state["step"]}}}}}\n'
    ).encode()


def backward_line(call_site: str | None, since: float, tracker: Any) -> bytes:
    """The "backward" message (the rank entered backward(), where DDP all-reduces its buckets), formatted by hand.
    It carries the step and its start, so the monitor never lays "in backward" over an older step's beat."""
    name, seq = group_info(None)
    return (
        f'{{"type":"backward","step":{int(tracker.step)},"step_started":{float(tracker.step_started)!r},'
        f'"backward":{{"call_site":{json.dumps(call_site)},"since":{since!r},"group":{json.dumps(name)},'
        f'"seq":{"null" if seq is None else int(seq)}}}}}\n'
    ).encode()
