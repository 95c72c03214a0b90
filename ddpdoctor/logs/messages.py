"""One-line torch.distributed messages: DETAIL fingerprint mismatches, monitoredBarrier, NCCL watchdog, gloo, DDP."""

from __future__ import annotations

import re

from ddpdoctor.logs.events import (
    Event,
    Fingerprint,
    FingerprintMismatch,
    GlooSizeMismatch,
    GlooTimeout,
    MonitoredBarrierFailure,
    UnusedParameters,
    WatchdogTimeout,
    WatchdogWorkState,
    Where,
)
from ddpdoctor.logs.lines import LogLine

# --- TORCH_DISTRIBUTED_DEBUG=DETAIL (ProcessGroupWrapper) -------------------------------------------------------
# Torch 1.10-2.13 wordings: "is running collective" / "is running inconsistent collective"; fields separated by ", "
# or, for shape-less ops, glued together ("SequenceNumber=1OpType=BARRIER").
_MISMATCH = re.compile(r"Detected mismatch between collectives on ranks\.")
_SIDE = re.compile(r"Rank (\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\(")
_DIFFERS = re.compile(r"Collectives differ in the following aspects:\s*(.*)$")
_SEQ = re.compile(r"SequenceNumber=(\d+)")
_OP = re.compile(r"OpType=([A-Z_]+)")
_SHAPE = re.compile(r"TensorShape=\[([^\]]*)\]")
_DTYPES = re.compile(r"TensorDtypes=([\w, ]+?)(?:, TensorDeviceTypes|\)|$)")
_DEVICE = re.compile(r"device=(\w+)")

_MONITORED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier in (\d+) ms")
_REPORTER = re.compile(r"\[(?:PG[^\]]*?)?Rank (\d+)\]")

# --- NCCL watchdog -------------------------------------------------------------------------------------------------
_WORKNCCL = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(((?:[^()]|\([^()]*\))*)\)")
_RAN_FOR = re.compile(r"ran for (\d+) milliseconds")
_KV = re.compile(r"(?<!\w)(\w+(?:\(ms\))?)=([^,]+)")
# torch 2.2-2.5: "... detected by watchdog at work: S, last enqueued NCCL work: E, last completed NCCL work: C.";
# torch >= 2.6: "failure detected by watchdog at work sequence id: S PG status: last enqueued work: E, last completed
# work: C"; dump/desync messages: "Last enqueued NCCL work: E, last completed NCCL work: C."
_ENQUEUED = re.compile(r"last enqueued (?:NCCL )?work:?\s*(\d+)", re.IGNORECASE)
_COMPLETED = re.compile(r"last completed (?:NCCL )?work:?\s*(-?\d+)", re.IGNORECASE)
_FAILED_AT = re.compile(r"(?:at work|work sequence id|at NCCL work):?\s*(\d+)")
_PG = re.compile(r"\[PG(?: ID)? (\d+)(?: PG GUID [^\s(]*\(([^)]*)\))?")

# --- gloo and DDP ------------------------------------------------------------------------------------------------
_GLOO_SIZE = re.compile(r"(?:(?<!\d)(\d+) vs (\d+)\. )?Received data size doesn't match expected size")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation to complete")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): (.*)$")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d\s]*)")
# DDP's own message, or Lightning 2.x's replacement of it (DDPStrategy.on_exception), which drops the parameter list.
_UNUSED_GENERIC = re.compile(r"Expected to have finished reduction in the prior iteration before starting a new one"
                             r"|It looks like your LightningModule has parameters that were not used in producing")
_NAME_TOKEN = re.compile(r"^[A-Za-z_][\w.]*$")


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def parse_fingerprint(body: str) -> Fingerprint:
    """Fields of one CollectiveFingerPrint(...) body; each field is optional, as in the real variants."""
    seq = _SEQ.search(body)
    op = _OP.search(body)
    shapes = [_ints(s) for s in _SHAPE.findall(body)]
    dtypes = _DTYPES.search(body)
    device = _DEVICE.search(body)
    return Fingerprint(
        seq=int(seq.group(1)) if seq else None,
        op=op.group(1) if op else None,
        shapes=shapes,
        dtypes=[d.strip() for d in dtypes.group(1).split(",") if d.strip()] if dtypes else [],
        device=device.group(1) if device else None,
    )


def _mismatch(line: LogLine, where: Where) -> FingerprintMismatch | None:
    text = line.text
    sides = list(_SIDE.finditer(text))
    if not sides:
        return None
    differs_m = _DIFFERS.search(text)
    end = differs_m.start() if differs_m else len(text)
    bodies = []
    for i, side in enumerate(sides):
        stop = sides[i + 1].start() if i + 1 < len(sides) else end
        bodies.append((int(side.group(1)), text[side.end():stop]))
    self_rank, self_body = bodies[0]
    peer = bodies[1] if len(bodies) > 1 else None
    differs = re.sub(r"\s+", " ", differs_m.group(1)).strip() if differs_m else ""
    return FingerprintMismatch(
        reporter=line.rank, self_rank=self_rank, self_fp=parse_fingerprint(self_body),
        peer_rank=peer[0] if peer else None, peer_fp=parse_fingerprint(peer[1]) if peer else None,
        differs=differs, where=where,
    )


def _group(text: str) -> str | None:
    m = _PG.search(text)
    if not m:
        return None
    return m.group(2) or m.group(1)


def _reporter(line: LogLine) -> int | None:
    m = _REPORTER.search(line.text)
    return int(m.group(1)) if m else line.rank


def _watchdog(line: LogLine, where: Where) -> WatchdogTimeout | None:
    m = _WORKNCCL.search(line.text)
    if not m:
        return None
    fields = {k: v.strip() for k, v in _KV.findall(m.group(1))}
    if "SeqNum" in fields and not fields["SeqNum"].isdigit():
        return None
    if "OpType" not in fields:
        return None

    def num(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.lstrip("-").isdigit() else None

    return WatchdogTimeout(
        rank=_reporter(line), seq=int(fields["SeqNum"]) if "SeqNum" in fields else None, op=fields.get("OpType", "UNKNOWN"),
        numel_in=num("NumelIn"), numel_out=num("NumelOut"), timeout_ms=num("Timeout(ms)"),
        ran_for_ms=int(ran.group(1)) if (ran := _RAN_FOR.search(line.text, m.end())) else None,
        group=_group(line.text), where=where,
    )


# One search over the words every message above contains: most lines of a log carry none of them.
_ANY = re.compile(r"Detected mismatch|monitoredBarrier|WorkNCCL\(|[Ll]ast enqueued|Received data size|Timed out waiting"
                  r"|did not receive grad|Expected to have finished reduction|LightningModule has parameters that were")


def parse_line(line: LogLine) -> list[Event]:
    """Every event one line carries (usually none)."""
    text = line.text
    if not _ANY.search(text):
        return []
    where = Where(line.source, line.lineno)
    events: list[Event] = []
    if _MISMATCH.search(text):
        mismatch = _mismatch(line, where)
        if mismatch is not None:
            events.append(mismatch)
    m = _MONITORED.search(text)
    if m:
        events.append(MonitoredBarrierFailure(_reporter(line), _ints(m.group(1)), int(m.group(2)), where))
    if "WorkNCCL(" in text:
        timeout = _watchdog(line, where)
        if timeout is not None:
            events.append(timeout)
    m = _ENQUEUED.search(text)
    if m:
        failed = _FAILED_AT.search(text)
        done = _COMPLETED.search(text)
        events.append(WatchdogWorkState(
            _reporter(line), int(failed.group(1)) if failed else None, int(m.group(1)),
            int(done.group(1)) if done else None, _group(text), where))
    m = _GLOO_SIZE.search(text)
    if m:
        events.append(GlooSizeMismatch(
            line.rank, int(m.group(1)) if m.group(1) else None, int(m.group(2)) if m.group(2) else None, where))
    m = _GLOO_TIMEOUT.search(text)
    if m:
        events.append(GlooTimeout(line.rank, int(m.group(1)), m.group(2), where))
    m = _UNUSED_NAMES.search(text)
    if m:
        names = [n.strip() for n in m.group(2).split(",")]
        events.append(UnusedParameters(int(m.group(1)), [n for n in names if _NAME_TOKEN.match(n)], [], where))
    m = _UNUSED_INDICES.search(text)
    if m:
        events.append(UnusedParameters(int(m.group(1)), [], _ints(m.group(2)), where))
    elif _UNUSED_GENERIC.search(text):
        events.append(UnusedParameters(line.rank, [], [], where))
    return events
