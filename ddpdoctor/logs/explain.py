"""`ddpdoctor logs`: read texts and Flight Recorder dumps, collect events, apply the rules. The public entry points
are `explain_texts` (name -> text, used by the hang monitor too) and `explain_paths` (files, dirs or "-")."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.logs import crashes, flight_recorder, rules, triage
from ddpdoctor.logs.events import ChildFailure, Event, RankException, event_json
from ddpdoctor.logs.failures import parse_failure
from ddpdoctor.logs.flight_recorder import FrGroupState
from ddpdoctor.logs.launchers import srun_failures, torchrun_failures
from ddpdoctor.logs.lines import LogLine, iter_lines, rank_from_name, streams, windows
from ddpdoctor.logs.messages import parse_line
from ddpdoctor.logs.tracebacks import collective_stacks, exceptions_in
from ddpdoctor.report import Report
from ddpdoctor.safe_io import GZIP_MAGIC, clean_text, gunzip_bytes, max_input_bytes, read_bytes

MAX_BYTES = 512 * 1024 * 1024
_TORCHISH = re.compile(r"torch|NCCL|gloo|c10d|ProcessGroup|srun|slurm|Traceback \(most recent call last\)",
                       re.IGNORECASE)
# Words one of the failure grammar's rules needs (a cheap filter: most lines of a log hold none of them).
# Matched against the lowercased line: a case-insensitive alternation is ~12x slower in `re`.
_MAYBE_FAILURE = re.compile(
    r"error|exception|memory|ddp|param|watchdog|heartbeat|monitor|nccl|cuda|remote|abort|address|clients"
    r"|rendezvous|broken pipe|recvvalue|sendbytes|tcpstore|socket|stop_waiting|refused|gloo|reset|closing signal"
    r"|signal|killed|segmentation|bus error|exit|core dumped|terminate|fatal|oom|traceback|interrupt|timed out|libfabric|undeliverable|err:"
    r"|barrier|ready|fsdp|flatten|shard|placement|dtensor|mesh|waitforinput")
# One search that every line parse_line or parse_failure could read passes (the words of both gates, lowercased:
# messages._ANY's that _MAYBE_FAILURE lacks added): a line it does not match is neither searched again nor parsed.
_EITHER = re.compile(_MAYBE_FAILURE.pattern + r"|last enqueued|detected mismatch|received data size"
                     r"|did not receive grad|expected to have finished reduction")
# A log that shows training (DDP's own INFO records, a framework's progress lines): a log, even with no word of
# torch.distributed in it; when it holds no failure, the answer is "no failure found", not bad input.
_TRAINING = re.compile(r"Reducer buckets have been rebuilt|\b(?:[Ee]poch|[Ll]oss|global_step|train_loss)\b"
                       r"|(?<![\d.])\d{1,6}(?:\.\d{1,4})?(?:it/s|s/it)\]")
_TRAINING_LINES = 20000  # looked for in the first lines only: a log that trains says so early
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.\w+)?$")


@dataclass
class InputSummary:
    name: str
    kind: str  # "text", "flight-recorder" or "unusable"
    lines: int = 0
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    problem: str | None = None
    nccl_debug: bool = False  # holds NCCL_DEBUG=INFO lines (what `ddpdoctor topo` reads)
    training: bool = False  # shows training progress (not in the JSON: the note says it)


@dataclass
class Explanation:
    findings: list[Finding]
    inputs: list[InputSummary]
    notes: list[str]
    events: list[Event]


_NOT_IN_KEY = frozenset(("where", "traceback", "frames", "chained", "reporter"))
_KEY_FIELDS: dict[type, tuple[str, ...]] = {}


def _key(e: Event) -> tuple[Any, ...]:
    """What makes two events the same report: every field but where it was printed (one repr per field, no deep
    copies: asdict of a million events took most of `logs`' time on a long log)."""
    names = _KEY_FIELDS.get(type(e))
    if names is None:
        names = _KEY_FIELDS[type(e)] = tuple(f.name for f in fields(e) if f.name not in _NOT_IN_KEY)
    return (type(e).__name__, *(repr(getattr(e, n)) for n in names))


def _dedupe(events: list[Event]) -> list[Event]:
    """The same error is often printed twice (the script's own log and torch's excepthook; --tee duplicates)."""
    seen: set[tuple[Any, ...]] = set()
    out: list[Event] = []
    for e in events:
        key = _key(e)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


# Lines held at once, and how far a window reaches past its own lines on each side (a traceback of 400 frame lines
# and 40 message lines interleaved with a few other ranks' output fits in the margin).
WINDOW_LINES = 1 << 16
WINDOW_MARGIN = 4096


def _window_events(lines: list[LogLine], work: list[int] | None) -> list[Event]:
    """Every event in one window of a log's lines, with each traceback's first-line time recorded."""
    events: list[Event] = []
    for line in lines:
        low = line.text.lower()
        if not _EITHER.search(low):
            if line.logger in ("E", "F") and (failure := parse_failure(line)) is not None:
                events.append(failure)
            continue
        events.extend(parse_line(line))
        if line.logger in ("E", "F") or _MAYBE_FAILURE.search(low):
            failure = parse_failure(line)
            if failure is not None:
                events.append(failure)
    for stream in streams(lines).values():
        events.extend(exceptions_in(stream, work))
    events += collective_stacks(lines)
    failures, table_tracebacks = torchrun_failures(lines)
    events += [*failures, *table_tracebacks, *srun_failures(lines)]
    return events


def _text_events(name: str, text: str, ts_of: dict[tuple[str, int], float],
                 work: list[int] | None = None) -> tuple[list[Event], set[int], InputSummary]:
    """Events of one text, read in windows of WINDOW_LINES lines: memory stays bounded on a log of millions of
    lines, and the events (deduplicated as they come) grow with what the log says, not with its length. ``work``'s
    first item counts the lines read and the traceback reader's steps (deterministic, for the linearity tests)."""
    events: list[Event] = []
    seen: set[tuple[Any, ...]] = set()
    ranks: set[int] = set()
    count = 0
    torchish = nccl_debug = training = False
    for lines, lo, hi in windows(iter_lines(name, text, rank_from_name(name), work), WINDOW_LINES, WINDOW_MARGIN):
        first = lines[0].lineno if lines else 0
        for line in lines:
            if lo <= line.lineno < hi:
                count = line.lineno
                if line.rank is not None:
                    ranks.add(line.rank)
                if line.lineno <= 5000 and not torchish and _TORCHISH.search(line.text):
                    torchish = True
                if line.lineno <= 20000 and not nccl_debug and " NCCL INFO " in line.text:
                    nccl_debug = True
                if line.lineno <= _TRAINING_LINES and not training and _TRAINING.search(line.text):
                    training = True
        for e in _window_events(lines, work):
            if not lo <= e.where.lineno < hi:
                continue  # the window before or after reads it whole
            key = _key(e)
            if key in seen:
                continue
            seen.add(key)
            events.append(e)
            # tracebacks carry no time of their own: the time of their first line, for ordering
            if isinstance(e, RankException) and 0 <= e.where.lineno - first < len(lines):
                ts = lines[e.where.lineno - first].ts
                if ts:
                    ts_of[(e.where.source, e.where.lineno)] = ts
    ranks |= {e.rank for e in events if isinstance(e, ChildFailure) and e.rank is not None}
    recognised = bool(events) or bool(ranks) or torchish or training
    summary = InputSummary(name, "text", count, sorted(ranks), len(events), nccl_debug=nccl_debug, training=training)
    if not text or text.isspace():  # (not text.strip(): a copy of a 100 MB text)
        summary.kind, summary.problem = "unusable", "empty"
    elif not recognised:
        summary.kind, summary.problem = "unusable", "nothing recognisable (no torch.distributed, torchrun or " \
                                                    "SLURM output)"
    return events, ranks, summary


def _torchelastic_error_file(text: str) -> str | None:
    """The traceback in an error.json that torchrun's @record wrote (attempt_0/RANK/error.json), else None."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    message = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    if isinstance(stack, str) and stack.strip():
        return stack
    return message.get("message") if isinstance(message.get("message"), str) else None


def _fr_rank(name: str, index: int, notes: list[str]) -> int:
    rank = rank_from_name(name)
    if rank is None:
        m = _TRAILING_NUMBER.search(name)
        rank = int(m.group(1)) if m else None
    if rank is None:
        notes.append(f"{name}: no rank in the file name; taken as rank {index}")
        return index
    return rank


def _analyse(events: list[Event], known: set[int], fr: dict[int, dict[str, FrGroupState]], notes: list[str],
             ts_of: dict[tuple[str, int], float] | None = None) -> list[Finding]:
    ts_of = ts_of or {}
    events = _dedupe(events)
    ev = rules.Evidence(events, set(known), fr)
    ev.known_ranks |= {r for e in events if (r := getattr(e, "rank", None)) is not None}
    ev.known_ranks |= set(fr)
    # Earliest first across files (merged on their timestamps where they have them), then in file order.
    exceptions = sorted(ev.of(RankException), key=lambda e: (
        (e.where.source, e.where.lineno) not in ts_of, ts_of.get((e.where.source, e.where.lineno), 0.0),
        e.where.source, e.where.lineno))
    excs = rules._rank_exceptions(ev)
    failures: list[ChildFailure] = ev.of(ChildFailure)
    findings = rules.mismatch_findings(ev, excs, failures) + rules.unused_findings(ev, excs)
    hang_sources = any(ev.of(t) for t in (rules.WatchdogTimeout, rules.GlooTimeout, rules.MonitoredBarrierFailure))
    crashed = crashes.crashed_ranks(exceptions, failures, bool(findings) or hang_sources or bool(fr))
    crashed_text = {r: v[0].splitlines()[0] for r, v in crashed.items() if r is not None}
    hang = rules.hang_findings(ev, excs, crashed_text, notes)
    findings += hang
    signals = {f.rank: f.signal for f in failures if f.rank is not None and f.signal}
    findings += crashes.crash_findings(crashed, signals, failures)
    culprits = {r for r in crashed if r is not None}
    for h in hang:
        if h.id == "hang":
            culprits |= set(h.evidence["culprit_ranks"])
    findings += crashes.root_cause_findings([f for f in failures if f.reporter == "torchrun"], culprits, excs)
    if not any(f.severity is Severity.ERROR for f in findings):
        findings += crashes.job_failed_finding(failures)
    return triage.triage(findings, events, ev.known_ranks, excs, rules.classify)


def explain_texts(texts: dict[str, str]) -> list[Finding]:
    """Findings from log texts (name -> text; a name like 'rank3.err' says which rank wrote it)."""
    return _explain({name: text for name, text in texts.items()}, {}).findings


def _explain(texts: dict[str, str], dumps: dict[str, Mapping[str, object]],
             inputs: list[InputSummary] | None = None, notes: list[str] | None = None) -> Explanation:
    inputs = list(inputs or [])
    notes = list(notes or [])
    events: list[Event] = []
    known: set[int] = set()
    ts_of: dict[tuple[str, int], float] = {}
    for raw_name, raw_text in texts.items():
        # Escape sequences and control characters from an untrusted log never reach the terminal (or the JSON).
        # A bare CR (progress bars) ends a line, as splitlines() would have it.
        name = clean_text(raw_name)
        text = clean_text(raw_text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in raw_text else raw_text)
        if text[:65536].lstrip().startswith("{"):  # (a whole lstrip() copies a 100 MB log)
            stripped = text.lstrip()
            try:
                dumps[name] = flight_recorder.loads_json(stripped, name)
                continue
            except BadInput:
                text = _torchelastic_error_file(stripped) or text
        ev, ranks, summary = _text_events(name, text, ts_of)
        events += ev
        known |= ranks
        inputs.append(summary)
    fr: dict[int, dict[str, FrGroupState]] = {}
    for i, (name, dump) in enumerate(dumps.items()):
        rank = _fr_rank(name, i, notes)
        fr[rank] = flight_recorder.group_states(dump)
        inputs.append(InputSummary(clean_text(name), "flight-recorder", 0, [rank], sum(len(s.collectives) for s in fr[rank].values())))
    events = _dedupe(events)
    cut = sorted({e.where.source for e in events if isinstance(e, ChildFailure) and e.reporter == "torchrun-cut"})
    notes += [f"{name}: torchrun's failure table starts in its middle (no 'Failures:' header): the records above the "
              "cut: ddpdoctor could not read them; give the whole table for every failed rank" for name in cut]
    findings = _analyse(events, known, fr, notes, ts_of)
    return Explanation(findings, inputs, notes, events)


def _read_input(path: str) -> bytes:
    if path == "-":
        limit = max_input_bytes(MAX_BYTES)
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise BadInput(f"more than {limit >> 20} MiB on stdin (raise it with DDPDOCTOR_MAX_INPUT_MB)", path)
        return gunzip_bytes(data, limit, path) if data[:2] == GZIP_MAGIC else data
    # Regular files only (a FIFO would block, /dev/zero never ends); gzip is streamed with a cap (a bomb stops there).
    return read_bytes(Path(path), max_input_bytes(MAX_BYTES))


def _expand(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for path in paths:
        p = Path(path)
        if path != "-" and p.is_dir():
            files = sorted(str(f) for f in p.rglob("*") if f.is_file())
            if not files:
                raise BadInput("empty directory", path)
            out.extend(files)
        else:
            out.append(path)
    return out


def _decode(name: str, data: bytes, texts: dict[str, str], dumps: dict[str, Mapping[str, object]]) -> str | None:
    """Sort one input into texts or dumps; return a problem when it is neither."""
    if data.startswith(flight_recorder.PICKLE_MAGIC):
        dumps[name] = flight_recorder.loads_pickle(data, name)
        return None
    if b"\x00" in data[:65536]:
        return "a binary file, not a text log or Flight Recorder dump"
    texts[name] = data.decode("utf-8", errors="replace")
    return None


def explain_paths(paths: Iterable[str]) -> Report:
    """The `ddpdoctor logs` report for files, directories (every file under them) or "-" (stdin)."""
    names = _expand(paths)
    if not names:
        raise BadInput("no log files given")
    texts: dict[str, str] = {}
    dumps: dict[str, Mapping[str, object]] = {}
    bad: list[InputSummary] = []
    for name in names:
        try:
            problem = _decode(name, _read_input(name), texts, dumps)
        except BadInput as exc:
            if len(names) == 1:
                raise
            problem = exc.problem
        if problem:
            bad.append(InputSummary(clean_text(name), "unusable", problem=clean_text(problem)))
    result = _explain(texts, dumps, bad)
    usable = [s for s in result.inputs if s.kind != "unusable"]
    if not usable:
        if len(result.inputs) == 1:
            raise BadInput(result.inputs[0].problem or "nothing usable", result.inputs[0].name)
        raise BadInput(f"none of the {len(result.inputs)} inputs is usable ("
                       + "; ".join(f"{s.name}: {s.problem}" for s in result.inputs[:5])
                       + ("; ..." if len(result.inputs) > 5 else "") + ")")
    notes = [f"{s.name}: {s.problem}" for s in result.inputs if s.kind == "unusable"]
    notes += [f"{s.name}: " + ("no failure found: it shows training and no error from torch.distributed, torchrun or "
                               "SLURM" if s.training else
                               "nothing to explain (no error from torch.distributed, torchrun or SLURM in it)")
              + ("; it holds NCCL_DEBUG=INFO output: `ddpdoctor topo` reads that" if s.nccl_debug else "")
              for s in result.inputs if s.kind == "text" and s.events == 0]
    notes += result.notes
    counts: dict[str, int] = {}
    for e in result.events:
        counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
    sections = {
        "inputs": [{k: v for k, v in asdict(s).items() if k != "training"} for s in result.inputs],
        "ranks_seen": sorted({r for s in result.inputs for r in s.ranks}),
        "events": counts,
        "timeline": triage.timeline(result.events),
    }
    return Report("logs", sections=sections, findings=result.findings, notes=notes)


def events_json(texts: dict[str, str]) -> list[JsonObject]:
    """Every parsed event as JSON (for debugging a parser against a new log)."""
    return [event_json(e) for e in _explain(dict(texts), {}).events]
