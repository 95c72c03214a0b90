"""Reformatted variants of a real log, as pastes and log collectors produce them: dedented, prefixed by a collector,
CRLF line ends, ANSI colours, a torchrun failure table cut in its middle, two ranks' output interleaved otherwise.
Each knows the structure it keeps (a rank's own order, the prefixes that say who wrote a line), so a variant says
the same thing as its original: `ddpdoctor logs` must give the same findings, or say what it could not read."""

from __future__ import annotations

import re
from collections.abc import Callable

# The prefixes ddpdoctor reads as "who wrote this line": kept in front, the rest of the line is mutated.
_OWNER = re.compile(r"^((?:\[\d{2,8}\] )?(?:\[(?:default|rank)\d+\]: ?|\[\d+,\d+\]<std(?:out|err)>:|\d{1,6}: )*)")
_RANK = re.compile(r"\[(?:default|rank)(\d+)\]:|\[\d+,(\d+)\]<std")
_TABLE_HEAD = re.compile(r"^\s*(?:Failures:|Root Cause \(first observed failure\):)\s*$")
_RECORD = re.compile(r"^\s*\[\d+\]:\s*$")


_HEADER = ("# source:", "# expect:", "# note:")  # the corpus file's own header (nccl-tests' "#  Rank 0" lines stay)


def body(text: str) -> str:
    """The log a corpus file holds, without the corpus's own header lines."""
    return "\n".join(_lines(text)) + "\n"


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith(_HEADER)]


def dedented(text: str) -> str:
    """Every line's indentation removed after its owner prefix (forum pastes, collectors that strip lines)."""
    out = []
    for ln in _lines(text):
        owner = _OWNER.match(ln)
        head = owner.group(1) if owner else ""
        out.append(head + ln[len(head):].lstrip())
    return "\n".join(out) + "\n"


_COLLECTORS = {
    "k8s": lambda i: f"2024-11-28T07:42:{i % 60:02d}.527Z stderr F ",  # containerd / CRI-O log files
    "cloudwatch": lambda i: f"  | 2024-11-28T07:42:{i % 60:02d}.527Z | ",  # a CloudWatch console paste
    "ray": lambda i: "(RayTrainWorker pid=552, ip=10.130.6.168) ",  # Ray's worker prefix
}


def prefixed(text: str, collector: str = "k8s") -> str:
    """Every line behind a log collector's prefix (timestamp and stream, or worker name)."""
    make = _COLLECTORS[collector]
    return "".join(make(i) + ln + "\n" for i, ln in enumerate(_lines(text)))


def crlf(text: str) -> str:
    return "\r\n".join(_lines(text)) + "\r\n"


def coloured(text: str) -> str:
    """ANSI colours as rich/loguru/colorlog terminals and CI logs keep them: the level word and error lines."""
    out = []
    for ln in _lines(text):
        ln = re.sub(r"\b(ERROR|WARN(?:ING)?|INFO|CRITICAL)\b", "\x1b[1;31m\\1\x1b[0m", ln)
        if "Error" in ln or "Traceback" in ln:
            ln = "\x1b[31m" + ln + "\x1b[0m"
        out.append(ln)
    return "\n".join(out) + "\n"


def cut_mid_table(text: str) -> str | None:
    """torchrun's failure table pasted from its middle: its banner, header and first record line are gone."""
    lines = _lines(text)
    head = next((i for i, ln in enumerate(lines) if _TABLE_HEAD.match(ln)), None)
    if head is None:
        return None
    first = next((i for i in range(head + 1, len(lines)) if _RECORD.match(lines[i])), None)
    if first is None:
        return None
    start = head
    while start > 0 and (lines[start - 1].strip().startswith(("=", "-")) or lines[start - 1].strip().endswith("FAILED")
                         or "ChildFailedError" in lines[start - 1]):
        start -= 1
    return "\n".join(lines[:start] + lines[first + 1:]) + "\n"


def interleaved(text: str) -> str | None:
    """Two or more ranks' lines interleaved otherwise (round robin), each rank's own lines in their order."""
    streams: dict[str | None, list[str]] = {}
    for ln in _lines(text):
        m = _RANK.search(ln[:40])
        key = (m.group(1) or m.group(2)) if m else None
        streams.setdefault(key, []).append(ln)
    ranked = [k for k in streams if k is not None]
    if len(ranked) < 2:
        return None
    out: list[str] = list(streams.pop(None, []))
    queues = list(streams.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return "\n".join(out) + "\n"


# Lines that start a record of their own (after their owner prefix): what a chat paste or a collector that dropped
# the newlines runs together onto the line before.
_JOINABLE = re.compile(r"^(?:\[[IWEF]\d{0,4}[ \d:.]*[\w./-]+:\d+\] |[IWEF]\d{4} \d\d:|terminate called after "
                       r"throwing|\s*what\(\): |nccl(?:InvalidUsage|RemoteError|SystemError|InternalError"
                       r"|UnhandledCudaError|InvalidArgument): |Last error:|Exception raised from )")
_RUN_TOGETHER = 160  # ddpdoctor cuts lines at least this long back into records (logs/lines.py)


def one_line(text: str) -> str | None:
    """Records run together onto one line, as a chat paste or a collector without newlines gives them: a line that
    starts a record (a glog header, terminate/what(), ncclXxx:, Last error:) joins the line before it when both have
    the same owner, and the joined line is long enough to be a paste (shorter joins stay as they were)."""
    out: list[str] = []
    owners: list[str] = []
    joined = 0
    for ln in _lines(text):
        owner = _OWNER.match(ln)
        head = owner.group(1) if owner else ""
        rest = ln[len(head):]
        if (out and owners[-1] == head and out[-1].strip() and _JOINABLE.match(rest)
                and len(out[-1]) + 1 + len(rest) >= _RUN_TOGETHER and not out[-1].lstrip().startswith("File ")):
            out[-1] = out[-1] + " " + rest.lstrip()
            joined += 1
            continue
        out.append(ln)
        owners.append(head)
    return "\n".join(out) + "\n" if joined else None


def wrapped(text: str, width: int = 100) -> str | None:
    """Every line longer than a terminal's width hard-wrapped at it (the rest on the next lines, no prefix)."""
    lines = _lines(text)
    if sum(len(ln) > width for ln in lines) < 3:
        return None
    out: list[str] = []
    for ln in lines:
        while len(ln) > width:
            out.append(ln[:width])
            ln = ln[width:]
        out.append(ln)
    return "\n".join(out) + "\n"


def pdsh(text: str, host: str = "worker-1") -> str:
    """Every line behind pdsh's (DeepSpeed's multi-node runner's) "host: " label."""
    return "".join(f"{host}: {ln}\n" for ln in _lines(text))


def rank_prefixed(text: str) -> str | None:
    """A one-process log with torch's "[rank0]:" on every line (torch >= 2.2); not for logs that name ranks."""
    lines = _lines(text)
    if any(_RANK.search(ln) or re.match(r"\s*\d{1,6}: |\[\d+\]<std", ln) for ln in lines):
        return None
    return "".join(f"[rank0]:{ln}\n" for ln in lines)


VARIANTS: dict[str, Callable[[str], str | None]] = {
    "one-line": one_line,
    "wrapped": wrapped,
    "pdsh": pdsh,
    "rank-prefix": rank_prefixed,
    "dedented": dedented,
    "k8s": lambda t: prefixed(t, "k8s"),
    "cloudwatch": lambda t: prefixed(t, "cloudwatch"),
    "ray": lambda t: prefixed(t, "ray"),
    "crlf": crlf,
    "ansi": coloured,
    "cut-mid-table": cut_mid_table,
    "interleaved": interleaved,
}
