"""What the launcher said about failed ranks: torchrun's ChildFailedError table, srun's task failures, OOM kills."""

from __future__ import annotations

import re

from ddpdoctor.logs.events import ChildFailure, Frame, RankException, Where
from ddpdoctor.logs.lines import LogLine

_SECTION = re.compile(r"^\s*(Failures:|Root Cause \(first observed failure\):)\s*$")
_RECORD = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RULE = re.compile(r"^\s*(?:={6,}|-{6,})\s*$")
_SIGNAL_TEXT = re.compile(r"Signal (\d+) \((SIG\w+)\)")
_SIGNAL_PAREN = re.compile(r"\((SIG\w+)\)")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:,)? in (\S+)')
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}

_SRUN_TASK = re.compile(r"srun: error: ([\w.-]+): tasks? ([\d,\-\[\] ]+): (.+)$")
_OOM = re.compile(r"(?:slurmstepd: error: Detected \d+ oom[_-]kill event|Out of memory: Killed process|oom-kill)",
                  re.IGNORECASE)


def signal_name(exitcode: int | None, text: str) -> str | None:
    """The signal named in the text ('Signal 9 (SIGKILL)'), else the one a negative exit code stands for."""
    m = _SIGNAL_TEXT.search(text) or _SIGNAL_PAREN.search(text)
    if m:
        return m.group(m.lastindex or 1)
    if exitcode is not None and exitcode < 0:
        return _SIGNALS.get(-exitcode, f"signal {-exitcode}")
    return None


def _record(fields: dict[str, list[str]], root: bool, where: Where, reporter: str = "torchrun") -> ChildFailure:
    rank_m = re.match(r"\s*(-?\d+)", fields.get("rank", [""])[0])
    exit_text = fields.get("exitcode", [""])[0]
    exit_m = re.match(r"\s*(-?\d+)", exit_text)
    exitcode = int(exit_m.group(1)) if exit_m else None
    error = "\n".join(fields.get("traceback", [])).strip()
    return ChildFailure(
        rank=int(rank_m.group(1)) if rank_m else None, exitcode=exitcode,
        signal=signal_name(exitcode, exit_text + " " + error), error=error,
        host=fields["host"][0] if fields.get("host") else None,
        time=fields["time"][0] if fields.get("time") else None,
        is_root_cause=root, reporter=reporter, where=where,
    )


def torchrun_failures(lines: list[LogLine]) -> tuple[list[ChildFailure], list[RankException]]:
    """Records of every ChildFailedError table in ``lines``, and the tracebacks @record put in them."""
    failures: list[ChildFailure] = []
    tracebacks: list[RankException] = []
    root = False
    in_table = False
    cut = False  # a table pasted from its middle: its records say reporter "torchrun-cut"
    fields: dict[str, list[str]] | None = None
    current_key = ""
    start: Where | None = None

    def flush() -> None:
        nonlocal fields
        if fields is not None and start is not None and "rank" in fields:
            record = _record(fields, root, start, "torchrun-cut" if cut else "torchrun")
            failures.append(record)
            exc = _traceback_field(record, fields.get("traceback", []))
            if exc is not None:
                tracebacks.append(exc)
        fields = None

    for i, line in enumerate(lines):
        text = line.text
        m = _SECTION.match(text)
        if m:
            flush()
            in_table, cut = True, False
            root = m.group(1).startswith("Root")
            continue
        if not in_table:
            # A table pasted from its middle has no "Failures:" header: a "[N]:" record line followed by a field
            # line starts it (the records are read the same; none of them can be marked the root cause).
            # A paste that starts inside a record begins with its field lines: that record is read from them.
            nxt = lines[i + 1].text if i + 1 < len(lines) else ""
            orphan = bool(_FIELD.match(text)) and bool(_FIELD.match(nxt) or _RECORD.match(nxt) or _RULE.match(nxt))
            if not (orphan or (_RECORD.match(text) and _FIELD.match(nxt))):
                continue
            in_table, root, cut = True, False, True
            if orphan:
                fields, current_key, start = {}, "", Where(line.source, line.lineno)
        if _RULE.match(text):
            flush()
            if text.strip().startswith("="):
                in_table = False
            continue
        m = _RECORD.match(text)
        if m:
            flush()
            fields, current_key, start = {}, "", Where(line.source, line.lineno)
            continue
        if fields is None:
            continue
        m = _FIELD.match(text)
        if m and m.group(1) in fields and m.group(1) != "traceback":
            # A field seen twice: the "[N]:" line of the next record was lost (a cut paste); a new record starts.
            flush()
            fields, current_key, start, cut = {}, "", Where(line.source, line.lineno), True
        if m and fields is not None and (m.group(1) != current_key or current_key != "traceback"):
            current_key = m.group(1)
            fields[current_key] = [m.group(2).strip()]
        elif current_key == "traceback" and text.strip():
            fields["traceback"].append(text[2:] if text.startswith("  ") else text)
    flush()
    return failures, tracebacks


def _traceback_field(record: ChildFailure, body: list[str]) -> RankException | None:
    """The error file's traceback (entrypoints decorated with @record) as a RankException of that rank."""
    if not body or not body[0].startswith("Traceback"):
        return None
    frames = [Frame(m.group(1), int(m.group(2)), m.group(3)) for m in (_FRAME.match(b) for b in body) if m]
    last = next((b.strip() for b in reversed(body) if b.strip() and not b.startswith(" ")), "")
    exc_type, _, message = last.partition(": ")
    if not re.match(r"^[A-Za-z_][\w.]*$", exc_type):
        return None
    return RankException(record.rank, exc_type, message, "\n".join(body), frames, False, record.where)


def _task_ranks(spec: str) -> list[int]:
    ranks: list[int] = []
    for part in re.split(r"[,\s]+", spec.strip("[] ")):
        if "-" in part:
            a, _, b = part.partition("-")
            if a.isdigit() and b.isdigit() and int(b) - int(a) < 100000:
                ranks.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            ranks.append(int(part))
    return ranks


def srun_failures(lines: list[LogLine]) -> list[ChildFailure]:
    """`srun: error: node12: task 3: Exited with exit code 1` / `Killed` / `Segmentation fault`, and OOM kills."""
    out: list[ChildFailure] = []
    for line in lines:
        if "srun" not in line.text and "oom" not in line.text and "Out of memory" not in line.text:
            continue
        where = Where(line.source, line.lineno)
        m = _SRUN_TASK.search(line.text)
        if m:
            what = m.group(3).strip()
            code_m = re.search(r"exit code (\d+)", what)
            signal = None if code_m else {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV",
                                          "Aborted": "SIGABRT", "Terminated": "SIGTERM"}.get(what.split(" (")[0])
            for rank in _task_ranks(m.group(2)):
                out.append(ChildFailure(rank, int(code_m.group(1)) if code_m else None, signal, what, m.group(1),
                                        None, False, "srun", where))
        elif _OOM.search(line.text):
            out.append(ChildFailure(line.rank, None, "SIGKILL", line.text.strip(), None, None, False, "oom", where))
    return out
