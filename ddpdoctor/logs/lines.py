"""Split a log text into lines that know which rank wrote them (torchrun, torch, SLURM and file-name conventions)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# Prefixes that name a rank, applied repeatedly because they stack: torchrun --tee writes "[default1]:" and torch's
# own excepthook / C++ logger add "[rank1]:" inside it ("[default1]:[rank1]: Traceback ...").
_RANK_PREFIX = re.compile(
    r"\[default(\d+)\]:"  # torchrun --tee / --redirects log_line_prefix
    r"|\[rank(\d+)\]: ?"  # torch >= 2.2 excepthook and c10 log prefix
    r"|\[rank(\d+)\] "  # the common "print(f'[rank{r}] ...')" habit in user scripts
    r"|\[\d+,(\d+)\]<std(?:out|err)>:"  # Open MPI --tag-output "[1,3]<stdout>:" (job, rank)
    r"|\[(\d+)\]<std(?:out|err)>:"  # horovodrun / gloo launcher "[3]<stderr>:"
)
# The whole run of stacked prefixes in one match (the same alternatives, tried in the same order, with nothing after
# them to backtrack for: what the loop of _RANK_PREFIX matches consumes), and the rank its last one names, cached per
# run text ("[default1]:[rank1]: " on every line of a log): three matches per line were a tenth of `logs`.
_RANK_RUN = re.compile("(?:" + _RANK_PREFIX.pattern.replace(r"(\d+)", r"\d+") + ")+")
_RUN_RANKS: dict[str, int] = {}


def _run_rank(run: str) -> int:
    rank = 0
    while m := _RANK_PREFIX.match(run):
        rank = int(m.group(m.lastindex or 1))
        run = run[m.end():]
    return rank


# A process id some collectors put in front of everything ("[80746] [rank0]:...").
_PID_PREFIX = re.compile(r"\[\d{2,8}\] (?=\[)")
# Multi-node launchers put the host or a job tag first: pdsh/DeepSpeed "worker-1: [rank9]:...", "node3: E1122 ...",
# "node3: node3:12:34 [0] NCCL WARN ...", and job tags such as "B-nemo-ft3/0 [default1]:...". Only stripped when a
# known prefix follows, so prose with a colon stays as it is.
_HOST_PREFIX = re.compile(r"^([\w.-]+): (?=\[(?:default|rank)\d+\]:|[IWEF]\d{4} |\[[IWEF]|[\w.-]+:\d+:\d+ \[\d)")
# (milabench and similar runners: "dinov2-giant-nodes.cn-d004 [stderr] [rank14]:...", the job tag, the stream, the rank.)
_TAG_PREFIX = re.compile(r"^[\w./-]+ (?:\[std(?:out|err)\] )?(?=\[(?:default|rank)\d+\]:)")
# Log collectors put their own prefix before whatever the process wrote: containerd/CRI-O files
# ("2024-11-28T07:42:11.527Z stderr F "), a CloudWatch console paste ("  | 2024-11-28T07:42:11.527Z | "), Ray's
# worker prefix ("(RayTrainWorker pid=552, ip=10.1.2.3) "). Removed first (its time kept), then the line is read as
# the process wrote it.
_COLLECTOR = re.compile(r"^\s*(?:\|\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)(?:\s*\|)?\s+"
                        r"(?:(?:stdout|stderr)\s+[FP]\s)?|^\((?:[\w.-]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s")
# srun --label: "3: text" (the SLURM task id, which is the rank when one task runs per rank).
_SRUN_LABEL = re.compile(r"^\s*(\d{1,6}): ")
# glog-style headers of torch's C++ ("[E321 02:07:08.408 ProcessGroupNCCL.cpp:607] ", "[E ProcessGroupNCCL.cpp:737] ")
# and Python ("E1122 10:23:15.599000 8860 torch/distributed/.../api.py:1002] ") loggers.
_GLOG_CPP = re.compile(r"^\[([IWEF])(?:(\d{3,4}) ([\d:.]+))?\s*[\w./-]+:\d+\] ")
_GLOG_LEADS = frozenset("[IWEF")
_COLLECTOR_LEADS = frozenset(" (0123456789")
_GLOG_PY = re.compile(r"^([IWEF])(\d{3,4}) ([\d:.]+) \d+ [\w./-]+:\d+\] ")
# Python logging / torchrun >= 2.1 / most collectors: "[2024-03-01 10:00:00,123] ..." or "2024-03-01T10:00:00.1 ...".
_ISO = re.compile(r"^\[?(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_CLOCK = re.compile(r"(\d{1,2}):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_MONTH_S = 31 * 86400  # seconds in a "month" of the sort key: order, not calendar arithmetic

# Rank (or local rank) in a file name: rank3.err, rank_3.log, torchrun's --log-dir "attempt_0/3/stderr.log".
_NAME_RANK = (
    re.compile(r"(?<![a-z])rank[_-]?(\d+)", re.IGNORECASE),
    re.compile(r"attempt_\d+[/\\](\d+)[/\\](?:std(?:err|out)\.log|error\.json)$"),
    re.compile(r"(?:task|proc|worker)[_-]?(\d+)", re.IGNORECASE),
)


@dataclass(slots=True)
class LogLine:
    """One line with its prefixes removed. ``rank`` is None when nothing says which rank wrote it."""

    source: str
    lineno: int
    rank: int | None
    text: str
    logger: str = ""  # "E", "W", ... when the line had a glog header (then ``text`` is the message only)
    ts: float | None = None  # a sort key in seconds from the line's own timestamp, else the last one above it


def strip_collector(line: str) -> str:
    """``line`` without a log collector's prefix (containerd/CRI-O, a CloudWatch paste, Ray's worker tag)."""
    if line[:1] in _COLLECTOR_LEADS and (m := _COLLECTOR.match(line)) and m.end() < len(line):
        return line[m.end():]
    return line


def _glog_ts(mmdd: str | None, clock: str | None) -> float | None:
    """'1122' + '10:23:15.599' -> seconds since the start of a year (glog prints month and day, no year)."""
    if not mmdd or not clock:
        return None
    m = _CLOCK.fullmatch(clock)
    if not m:
        return None
    month, day = int(mmdd[:-2]), int(mmdd[-2:])
    frac = float("0." + m.group(4)) if m.group(4) else 0.0
    return month * _MONTH_S + day * 86400 + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) + frac


def _iso_ts(m: re.Match[str]) -> float:
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    return (int(m.group(2)) * _MONTH_S + int(m.group(3)) * 86400 + int(m.group(4)) * 3600 + int(m.group(5)) * 60
            + int(m.group(6)) + frac)


def rank_from_name(name: str) -> int | None:
    for pattern in _NAME_RANK:
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return None


def _uses_srun_labels(raw_lines: list[str]) -> bool:
    """srun --label is all-or-nothing for a file; require many labelled lines so "12: foo" in prose is not a rank."""
    nonempty = [ln for ln in raw_lines if ln.strip()]
    labelled = sum(1 for ln in nonempty if _SRUN_LABEL.match(ln))
    return labelled >= 2 and labelled >= 0.3 * len(nonempty)


_SRUN_SAMPLE = 5000  # srun --label is decided on the first lines: a whole-file scan would hold every line twice

# pdsh / DeepSpeed's multi-node runner put the host before every line ("worker-1: Traceback ...", "worker-1:     x()"):
# all-or-nothing for a file, like srun's label; a host label starts lower-case or with a digit (never "RuntimeError:",
# "INFO:", "WARNING:").
_HOST_LABEL = re.compile(r"^([a-z0-9][\w.-]{0,62}): ")


# A host name has a digit, a dash or a dot ("worker-1", "node3", "gpu01.cluster"), or is localhost; tools that print
# "name: message" ("srun: error:", "slurmstepd:", "bash:") are not hosts.
_HOSTLIKE = re.compile(r"[\d.-]|^localhost$")
_NOT_HOSTS = frozenset(("srun", "slurmstepd", "bash", "sh", "zsh", "python", "python3", "mpirun", "sbatch", "salloc",
                        "torchrun", "deepspeed", "pdsh", "kernel", "error", "warning", "note", "info", "debug"))


def _host_labels(sample: list[str]) -> frozenset[str]:
    """The host labels that prefix most lines of a file (pdsh), else nothing."""
    nonempty = [ln for ln in sample if ln.strip()]
    counts: dict[str, int] = {}
    for ln in nonempty:
        if (m := _HOST_LABEL.match(ln)) and _HOSTLIKE.search(m.group(1)) and m.group(1) not in _NOT_HOSTS:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    labelled = sum(counts.values())
    if len(counts) > 256 or labelled < 2 or labelled < 0.6 * len(nonempty):
        return frozenset()
    return frozenset(counts)


# A terminal's hard wrap: every long line cut at one width W, the rest on the next line with no prefix of its own.
# W is read from the first lines: at least three lines exactly W long and none longer. A line W long is
# joined with the next unless that one starts a record of its own (a prefix, a glog header, a traceback line) or
# starts like the line itself (repeated records of one length are not a wrap).
_WRAP_MIN = 60
_NOT_A_PIECE = re.compile(
    r"^(?:\[|[IWEF]\d{4} |Traceback|\s+File \"|\d{4}-\d\d-\d\d|[A-Z]+:[\w.]+:|[\w.-]+:\d+:\d+ \[\d"
    # a record of its own after a fixed-width line (a progress bar's): the shell's and the launchers' reports, an
    # exception line, a chain marker, NCCL's and torch's own lines
    r"|\s*(?:Killed|Aborted|Segmentation fault|Bus error|terminate called|what\(\)|srun:|slurmstepd:|During handling"
    r"|The above exception|Last error|nccl[A-Z]|NCCL |(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Warning)\b))")


def _wrap_width(sample: list[str]) -> int | None:
    widest, count = 0, 0
    for ln in sample:
        if len(ln) > widest:
            widest, count = len(ln), 1
        elif len(ln) == widest:
            count += 1
    return widest if widest >= _WRAP_MIN and count >= 3 else None


def _unwrapped(lines: Iterator[str], width: int | None) -> Iterator[str]:
    if width is None:
        yield from lines
        return
    held: str | None = None
    for ln in lines:
        if held is not None:
            if ln and not _NOT_A_PIECE.match(ln) and ln[:12] != held[:12]:
                held += ln
                if len(ln) == width:
                    continue  # cut again
                yield held
                held = None
                continue
            yield held
            held = None
        if len(ln) == width:
            held = ln
            continue
        yield ln
    if held is not None:
        yield held


_CHUNK = 1 << 20  # characters split at once by raw_lines


def raw_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` one at a time, split at "\n", "\r\n" or "\r" (no list of millions of strings, and no
    io.StringIO: it keeps a 4-byte-per-character copy of the whole text). Split a chunk of about a megabyte at a
    time, in C: a find and a slice per line was a tenth of `logs` on a 2,000,000-line log."""
    pos, end = 0, len(text)
    while pos < end:
        cut = text.find("\n", pos + _CHUNK)
        if cut < 0:
            cut = end
        chunk = text[pos:cut]
        pos = cut + 1
        pieces = chunk.split("\n")
        if cut == end and pieces[-1] == "":
            pieces.pop()  # the text's last newline ends its last line; it starts no empty one
        if "\r" not in chunk:
            yield from pieces
            continue
        for piece in pieces:
            if "\r" in piece:
                parts = piece.split("\r")
                if parts[-1] == "":
                    parts.pop()  # "\r\n"
                yield from parts
            else:
                yield piece


# A watchdog message a terminal or a paste wrapped onto the next line ("... operation timeout: \nWorkNCCL(SeqNum=2070,
# \nOpType=REDUCE, ...) ran for ...", "... Exception (either an error or timeout) detected\nby watchdog at work: 2070,
# last enqueued ..."): the head has the message's start without its end, the next line no prefix of its own and a
# piece of the rest. Joined back (at most _MAX_JOINS pieces), so the message reads as torch printed it.
_WRAP_HEADS = (("Watchdog caught collective operation timeout", "before timing out"),
               ("detected by watchdog at work", "last completed"), ("Exception (either an error or timeout)",
                                                                    "last completed"),
               ("failure detected by watchdog", "last completed"))
_WRAP_PIECES = ("WorkNCCL(", "SeqNum=", "OpType=", "NumelIn=", "Timeout(ms)=", "ran for ", "before timing out",
                "by watchdog", "watchdog at work", "last enqueued", "last completed", "PG status")
_MAX_JOINS = 3


def _wrapped(text: str) -> bool:
    return any(head in text and end not in text for head, end in _WRAP_HEADS)


# torch prints NCCL's cause on the line after "Last error:" ("ncclInvalidUsage: ...\nLast error:\nDuplicate GPU
# detected : rank 1 and rank 0 ..."): the two are joined, so the cause is read with the line that announces it.
_LAST_ERROR = "Last error:"

# DDP's reducer names the parameter whose hook fired twice on one long line, which a terminal hard-wraps (inside
# the parameter's name as often as not): the pieces without a prefix of their own are joined back as they were cut.
_READY_HEAD = "Parameter at index"
_READY_END = "ready twice"

# Records run together on one line (a chat paste, a collector that dropped the newlines): where the next record
# starts. Each alternative is the start of a line torch, NCCL, glog or Python writes; the line is cut before it.
_RECORD_START = re.compile(
    r"\s(?=\[(?:rank|default)\d+\]:|\[[IWEF]\d{4} \d\d:\d\d:\d\d|\[[IWEF] [\w./-]+:\d+\] |[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "
    r"|terminate called after throwing|what\(\): |Traceback \(most recent call last\)|Exception raised from "
    r"|nccl(?:InvalidUsage|RemoteError|SystemError|InternalError|UnhandledCudaError|InvalidArgument): |Last error:"
    r"|[\w.-]+:\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:WARN|INFO|ERROR)"
    r"|(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): |File \"[^\"]+\", line \d+|frame #\d+: )")
# What may stand before a record on its own line: prefixes (a host, "[rank0]:", a glog header), nothing else.
_ONLY_PREFIXES = re.compile(r"^\s*(?:[\w.-]+: )?(?:\[[^\]]*\](?:<std(?:out|err)>)?:? ?)*(?:\d{1,6}: )?"
                            r"(?:[IWEF]\d{4} [\d:.]+ \d+ [\w./-]+:\d+\] ?)?\s*$")
_WEAK_START = re.compile(r"(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): |File \"")
_RUN_TOGETHER = 160  # shorter lines are never split: one record per line is the rule, a run-together paste is long


def records(line: str) -> Iterator[str]:
    """``line`` cut into the records that were run together on it (one piece when it holds one record)."""
    if len(line) < _RUN_TOGETHER:
        yield line
        return
    indent = len(line) - len(line.lstrip())
    if line[:1] in _COLLECTOR_LEADS and (c := _COLLECTOR.match(line)):
        indent = c.end()  # a collector's prefix stays with the first record
    cuts = list(_RECORD_START.finditer(line, indent + 1))
    if not any(not _WEAK_START.match(line, m.end()) for m in cuts):
        # only an exception's name or a frame mid-line ("... will raise a RuntimeError: ..." in a long warning):
        # prose, not records run together; a paste has at least one record start of its own kind.
        yield line
        return
    start = 0
    for m in cuts:
        before = line[start:m.start()]
        own = before[indent:] if start == 0 else before  # (a collector's prefix is not the record's)
        if own.strip() and not _ONLY_PREFIXES.match(own):  # never cut a record from its own prefixes
            yield before
            start = m.end()
    yield line[start:]


def iter_lines(source: str, text: str, default_rank: int | None = None, work: list[int] | None = None
               ) -> Iterator[LogLine]:
    """Every line of ``text`` with the rank that wrote it (from its prefix, else ``default_rank``), one at a time,
    with a watchdog message that was wrapped onto the next lines joined back. ``work``, when given, has its first item
    raised by one per line: the deterministic count the linearity tests compare."""
    held: LogLine | None = None  # a watchdog message's head, waiting for its wrapped rest
    joins = 0
    sample = [_COLLECTOR.sub("", ln, count=1) for ln in itertools.islice(raw_lines(text), _SRUN_SAMPLE)]
    srun = _uses_srun_labels(sample)
    hosts = _host_labels(sample) if not srun else frozenset()
    width = _wrap_width(list(itertools.islice(raw_lines(text), _SRUN_SAMPLE)))
    del sample
    ts: float | None = None
    last: LogLine | None = None  # a "Last error:" line waiting for the cause on the next line
    wrap: LogLine | None = None  # DDP's "Parameter at index N with name X has been marked as ready twice", cut
    line_rank = default_rank  # the rank of the line a record was cut from: its later records carry it on
    for i, raw, continued in _numbered(text, work, width):
        line = raw.rstrip("\r\n")
        rank = line_rank if continued else default_rank
        if line[:1] in _COLLECTOR_LEADS and (m := _COLLECTOR.match(line)) and m.end() < len(line):
            if m.group(1) and (t := _ISO.match(m.group(1))):
                ts = _iso_ts(t)
            line = line[m.end():]
        collected = line  # what the process wrote, once a collector's prefix is gone
        if srun:
            m = _SRUN_LABEL.match(line)
            if m:
                rank = int(m.group(1))
                line = line[m.end():]
        elif hosts and (m := _HOST_LABEL.match(line)) and m.group(1) in hosts:
            line = line[m.end():]
            collected = line  # (the host's label is the collector's: what follows is what the process wrote)
        if line[:1] not in ("[", "") and (": " in line[:72] or " [" in line[:72]):
            m = _HOST_PREFIX.match(line) or _TAG_PREFIX.match(line)
            if m:
                line = line[m.end():]
        if line.startswith("["):  # every prefix starts with "[": skip the regexes for the bulk of a log
            if "] [" in line:  # (what every pid prefix holds: the sub is skipped on the bulk of a log)
                line = _PID_PREFIX.sub("", line, count=1)
            if m := _RANK_RUN.match(line):
                run = m.group()
                known = _RUN_RANKS.get(run)
                if known is None:
                    if len(_RUN_RANKS) >= 4096:
                        _RUN_RANKS.clear()  # (a log of endlessly many prefixes: bounded, never wrong)
                    known = _RUN_RANKS[run] = _run_rank(run)
                rank = known
                line = line[m.end():]
        line_rank = rank
        logger = ""
        lead = line[:1]
        if lead in _GLOG_LEADS:
            for glog in (_GLOG_CPP, _GLOG_PY):
                m = glog.match(line)
                if m:
                    logger = m.group(1)
                    ts = _glog_ts(m.group(2), m.group(3)) or ts
                    line = line[m.end():]
                    break
        if not logger and (lead.isdigit() or lead == "["):
            m = _ISO.match(line)
            if m:
                ts = _iso_ts(m)
        if held is not None:
            if (joins < _MAX_JOINS and line == collected and (piece := line.strip())
                    and any(p in piece[:40] for p in _WRAP_PIECES)):
                held.text = held.text.rstrip() + " " + piece
                joins += 1
                if not _wrapped(held.text):
                    yield held
                    held = None
                continue
            yield held
            held = None
        if wrap is not None:
            if joins < _MAX_JOINS and line == collected and line.strip():
                wrap.text += line  # a hard wrap keeps every character: joined as it was cut
                joins += 1
                if _READY_END in wrap.text:
                    yield wrap
                    wrap = None
                continue
            yield wrap
            wrap = None
        if last is not None:
            if line.strip() and rank == last.rank:
                last.text = last.text.rstrip() + " " + line.strip()
                yield last
                last = None
                continue
            if line.strip():
                yield last
                last = None
        out = LogLine(source, i, rank, line, logger, ts)
        if _LAST_ERROR in line and line.rstrip().endswith(_LAST_ERROR):
            last = out
            continue
        if _READY_HEAD in line and _READY_END not in line:
            wrap, joins = out, 0
            continue
        # Cheap gates first: few lines name the watchdog.
        if ("atchdog" in line or "(either an error" in line) and _wrapped(line):
            held, joins = out, 0
            continue
        yield out
    if held is not None:
        yield held
    for pending in (last, wrap):
        if pending is not None:
            yield pending


def _numbered(text: str, work: list[int] | None, width: int | None = None) -> Iterator[tuple[int, str, bool]]:
    """(line number, record, whether it continues its line) for every record of ``text``: a line (a hard-wrapped
    one joined back when ``width`` is the terminal's), or each record of a run-together line."""
    for i, whole in enumerate(raw_lines(text) if width is None else _unwrapped(raw_lines(text), width), start=1):
        if work is not None:
            work[0] += 1
        if len(whole) < _RUN_TOGETHER:  # (records' own first test, without a generator per line)
            yield i, whole, False
            continue
        for n, raw in enumerate(records(whole)):
            yield i, raw, n > 0


def split_lines(source: str, text: str, default_rank: int | None = None) -> list[LogLine]:
    """Every line of ``text`` with the rank that wrote it (from its prefix, else ``default_rank``)."""
    return list(iter_lines(source, text, default_rank))


def windows(lines: Iterable[LogLine], size: int, margin: int) -> Iterator[tuple[list[LogLine], int, float]]:
    """Overlapping windows over a long log, so that only one window's lines are held at a time: each window is
    (lines, lo, hi) where the events that start on lines lo <= lineno < hi belong to it. Its lines reach ``margin``
    lines before lo (a traceback that started there is read from its start, not as a headless piece) and ``margin``
    after hi (one that starts before hi is read to its end); every line is read at most (size + 2 margin) / size
    times."""
    buf: list[LogLine] = []
    start = 0  # index in buf of the window's first line of its own
    for line in lines:
        buf.append(line)
        if len(buf) >= start + size + margin:
            yield buf, buf[start].lineno, float(buf[start + size].lineno)
            buf = buf[start + size - margin:]
            start = margin
    if len(buf) > start or not buf:
        yield buf, buf[start].lineno if len(buf) > start else 0, float("inf")


def streams(lines: list[LogLine]) -> dict[tuple[str, int | None], list[LogLine]]:
    """Lines grouped by (source, rank), each group in file order: one rank's output, untangled from the others."""
    grouped: dict[tuple[str, int | None], list[LogLine]] = {}
    for line in lines:
        grouped.setdefault((line.source, line.rank), []).append(line)
    return grouped
