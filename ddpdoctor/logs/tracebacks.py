"""Python tracebacks, C++ `terminate called` aborts and faulthandler dumps, read from one rank's untangled lines."""

from __future__ import annotations

import re

from ddpdoctor.logs.events import CollectiveStack, Frame, RankException, Where
from ddpdoctor.logs.lines import LogLine

_START = "Traceback (most recent call last):"
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:,)? in (\S+)')
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_FATAL = re.compile(r"^Fatal Python error: (.+)$")
_CARETS = re.compile(r"^\s*[~^]+\s*$")
# An exception's name as Python prints it: the line after a dedented frame is the exception only if it looks like one.
_EXC_NAME = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout"
                       r"|Iteration)(?::|$)")
_LOGGER_LINE = re.compile(r"^[IWEF]\d{4} ")
_MAX_MESSAGE_LINES = 40
_MAX_FRAMES_LINES = 400


def _is_indented(text: str) -> bool:
    return text[:1] in (" ", "\t")


def _is_code_line(lines: list[LogLine], j: int) -> bool:
    """Whether lines[j], right after a frame line that lost its indentation, is that frame's source line rather than
    the exception: it is when a frame or caret line follows, or when it cannot be an exception line and the next
    one can."""
    text = lines[j].text.strip()
    if not text or _FRAME.match(text):
        return False
    nxt = lines[j + 1].text.strip() if j + 1 < len(lines) else ""
    if _FRAME.match(nxt) or _CARETS.match(nxt):
        return True
    if not _EXC_LINE.match(text):
        return True
    return bool(_EXC_NAME.match(nxt)) and not _EXC_NAME.match(text)


def _read_frames(lines: list[LogLine], j: int, stop: int, body: list[str], frames: list[Frame],
                 work: list[int]) -> int:
    """The frame lines of one traceback from lines[j], indented or not (pastes and log collectors strip the
    indentation); returns the index of the first line after them. Each step advances j: linear in the lines read."""
    while j < len(lines) and j < stop:
        work[0] += 1
        t = lines[j].text
        m = _FRAME.match(t)
        if m:
            frames.append(Frame(m.group(1), int(m.group(2)), m.group(3)))
            body.append(t)
            j += 1
            if j < len(lines) and not _is_indented(lines[j].text) and _is_code_line(lines, j):
                body.append(lines[j].text)
                j += 1
            continue
        if _is_indented(t) or t.strip() in ("...", "[...]") or _CARETS.match(t):
            body.append(t)
            j += 1
            continue
        break
    return j


_SPAWN_REPORTS = ("ProcessRaisedException", "ProcessExitedException")
_SPAWNED = re.compile(r"-- Process (\d+) terminated with the following error:")


def _message_continues(line: LogLine) -> bool:
    """Whether a line after an exception line still belongs to its message (multi-line RuntimeErrors from DDP)."""
    text = line.text
    if line.logger or not text.strip() or text.startswith(_START) or text.startswith(_CHAIN) or _LOGGER_LINE.match(text):
        return False
    return not text.startswith(("torch.distributed.elastic", "===", "---", "[", "#", "Fatal Python error"))


def _python_tracebacks(lines: list[LogLine], work: list[int]) -> list[RankException]:
    found: list[RankException] = []
    i = 0
    chained = False
    spawned: int | None = None  # the process index mp.spawn named for the traceback that follows
    while i < len(lines):
        work[0] += 1
        text = lines[i].text
        if text.startswith(_CHAIN):
            chained = True
            i += 1
            continue
        headless = bool(_FRAME.match(text))  # an excerpt that lost its "Traceback" header
        if text.strip() != _START and not headless:
            if text.strip():
                chained = False  # a chain marker only applies to the traceback right after it
            i += 1
            continue
        start = lines[i]
        body = [] if headless else [text]
        frames: list[Frame] = []
        j = _read_frames(lines, i if headless else i + 1, i + _MAX_FRAMES_LINES, body, frames, work)
        if j >= len(lines):
            i = max(j, i + 1)
            continue
        m = _EXC_LINE.match(lines[j].text.strip()) if lines[j].text.strip() else None
        if not m:
            i = max(j, i + 1)  # always move on: a headless frame line with nothing after it must not be read again
            continue
        message = [m.group(2) or ""]
        body.append(lines[j].text)
        k = j + 1
        while k < len(lines) and k - j < _MAX_MESSAGE_LINES and _message_continues(lines[k]):
            work[0] += 1
            message.append(lines[k].text)
            body.append(lines[k].text)
            k += 1
        rank = start.rank if start.rank is not None else spawned
        spawned = None
        found.append(RankException(
            rank=rank, exc_type=m.group(1), message="\n".join(message).strip(), traceback="\n".join(body),
            frames=frames, chained=chained, where=Where(start.source, start.lineno),
        ))
        if m.group(1).endswith(_SPAWN_REPORTS):
            # mp.spawn (and the launchers built on it: accelerate's notebook/debug launchers) re-raises a child's
            # failure in the parent, with the child's own traceback after "-- Process N terminated with the
            # following error:": that traceback is process N's, and the user's call site is in it.
            for t in lines[k:k + 4]:
                if sm := _SPAWNED.match(t.text.strip()):
                    spawned = int(sm.group(1))
                    break
        chained = False
        i = k
    return found


def _native_aborts(lines: list[LogLine]) -> list[RankException]:
    """`terminate called after throwing ...` + `what(): ...` (gloo enforce failures) and faulthandler dumps."""
    found: list[RankException] = []
    for i, line in enumerate(lines):
        if "terminate called" not in line.text and not line.text.startswith("Fatal Python error"):
            continue
        m = _TERMINATE.search(line.text)
        if m:
            message = ""
            if i + 1 < len(lines):
                w = _WHAT.match(lines[i + 1].text)
                message = w.group(1) if w else ""
            found.append(RankException(
                line.rank, m.group(1), message, "\n".join(x.text for x in lines[i:i + 2]), [], False,
                Where(line.source, line.lineno)))
            continue
        m = _FATAL.match(line.text)
        if m:
            body = [line.text]
            frames: list[Frame] = []
            for nxt in lines[i + 1:i + 200]:
                fm = re.match(r'^\s*File "([^"]+)", line (\d+) in (\S+)', nxt.text)
                if fm:
                    frames.append(Frame(fm.group(1), int(fm.group(2)), fm.group(3)))
                elif nxt.text.strip() and not nxt.text.startswith(("Current thread", "Thread 0x")):
                    break
                body.append(nxt.text)
            # faulthandler prints innermost first; keep Frame lists outermost-first like Python tracebacks.
            found.append(RankException(
                line.rank, "Fatal Python error", m.group(1), "\n".join(body).strip(), frames[::-1], False,
                Where(line.source, line.lineno)))
    return found


def exceptions_in(lines: list[LogLine], work: list[int] | None = None) -> list[RankException]:
    """All exceptions in one (source, rank) stream, in order. ``work``'s first item is raised by the lines the
    traceback reader visits (each at most a bounded number of times: the linearity tests count it)."""
    found = _python_tracebacks(lines, work if work is not None else [0]) + _native_aborts(lines)
    return sorted(found, key=lambda e: e.where.lineno)


_NCCL_STACK = "Stack trace of the failed collective:"
_NCCL_FRAME = re.compile(r"^#(\d+) (\S+) from (.+):(\d+)\s*$")


def collective_stacks(lines: list[LogLine]) -> list[CollectiveStack]:
    """NCCL's stack of the collective that failed; its '#N fn from file:line' lines often lose the rank prefix, so
    this reads a whole file in order rather than one rank's stream."""
    found: list[CollectiveStack] = []
    for i, line in enumerate(lines):
        if _NCCL_STACK not in line.text:
            continue
        frames: list[Frame] = []
        body: list[str] = []
        for nxt in lines[i + 1:i + 200]:
            m = _NCCL_FRAME.match(nxt.text.strip())
            if not m or (nxt.rank is not None and line.rank is not None and nxt.rank != line.rank):
                break
            frames.append(Frame(m.group(3), int(m.group(4)), m.group(2)))
            body.append(nxt.text.strip())
        if frames:
            found.append(CollectiveStack(line.rank, frames[::-1], "\n".join(body), Where(line.source, line.lineno)))
    return found
