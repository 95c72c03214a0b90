"""The job-wide comparison of the ranks' per-step fingerprints (probes/divergence.py), and the monitor plugin that
feeds it, writes RUN/divergence.json and, with --on-divergence stop, tells every rank to stop (issue 38).

Per step the judge keeps ``{key: ranks}`` (the distinct fingerprints, usually one) and one example record per key:
O(1) per record, nothing quadratic in ranks or steps; a step is judged once every rank of the job has reported it.
The majority's key is the job's; the ranks of the other keys diverged. On a tie (2 ranks, 1 against 1) the side
that equals the job's last agreed record is the job's, else the side with a finite loss, else the lower rank's."""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ddpdoctor.rundir.layout import write_json

MODE_ENV = "DDPDOCTOR_ON_DIVERGENCE"  # the ranks' probes/divergence.py reads it (warn | stop)
WINDOW = 512  # steps kept while some rank has not reported them yet (a rank that ended early never will)
MAX_RANKS_SHOWN = 64
# A record is [step, key, *FIELDS, *INFO] (probes/divergence.py builds it): ``key`` is a CRC of FIELDS, what the
# ranks must agree on; INFO only explains a difference (a last uneven batch under Join differs there by design).
FIELDS = ("colls", "ops", "opt", "loss", "graphs", "epoch", "dry")
INFO = ("batches", "left", "recompiles", "breaks")
MAX_REASON = 300  # characters of a record's ``why`` (why torch.compile compiled in that step)
# --on-divergence stop: ranks still waiting in a collective this long after the verdict wait for a rank that left
# its loop (a shorter shard) or will send nothing more: the job is ended then, not at the hang timeout.
STOP_END_S = 2.0


class RecordExtra(TypedDict, total=False):
    """A record's optional last element, only in a step that needs it (probes/divergence.py)."""

    why: str  # torch.compile compiled in this step: the guard that failed, the graph break's message
    calls: list[str]  # this step's public collectives ("op|sizes|dtype|reduce op") when they changed


def record_key(colls: int, ops: int, opt: int, loss: int, graphs: int, epoch: int = -1, dry: int = 0) -> int:
    return zlib.crc32(f"{colls},{ops},{opt},{loss},{graphs},{epoch},{dry}".encode())


class DivergenceItem(TypedDict):
    """One field that differs: the diverged ranks' value, the job's, and the sentence that says it."""

    field: str
    rank_value: int
    others_value: int
    text: str


class _VerdictBase(TypedDict):
    step: int
    ranks: list[int]
    ranks_count: int
    others_count: int
    job: dict[str, int]
    items: list[DivergenceItem]
    reason: str
    detected_at: float
    after_first_record_s: float


class DivergenceVerdict(_VerdictBase, total=False):
    """RUN/divergence.json (docs/hangs.md#divergence); ``on_divergence`` is added when it is declared."""

    on_divergence: str


@dataclass
class _Step:
    by_key: dict[int, list[int]] = field(default_factory=dict)
    example: dict[int, list[int]] = field(default_factory=dict)
    n: int = 0
    first_at: float = 0.0  # when the first record of this step arrived (time.time())


def valid(rec: Any) -> list[int] | None:
    """The record's numbers, checked; its optional last element (a dict) is read by ``record_reason`` and
    ``record_calls``."""
    n = 2 + len(FIELDS) + len(INFO)
    if not isinstance(rec, list) or len(rec) not in (n, n + 1) or (len(rec) == n + 1 and not isinstance(rec[n], dict)):
        return None
    return rec if all(type(v) is int for v in rec[:n]) else None


def _extra(rec: list[Any]) -> dict[str, object]:
    n = 2 + len(FIELDS) + len(INFO)
    return rec[n] if len(rec) > n and isinstance(rec[n], dict) else {}


def record_reason(rec: list[Any]) -> str | None:
    why = _extra(rec).get("why")
    return str(why)[:MAX_REASON] if why else None


def record_calls(rec: list[Any]) -> list[str] | None:
    """The step's public collectives as the rank saw them ("op|sizes|dtype|reduce op"), when the record has them."""
    calls = _extra(rec).get("calls")
    return [str(c)[:200] for c in calls[:8]] if isinstance(calls, list) else None


def _first_call_difference(step: int, theirs: list[str] | None, others: list[str] | None) -> str:
    def show(c: str) -> str:
        op, sizes, dtype, red = (c.split("|") + ["", "", ""])[:4]
        return f"{op} sizes {sizes}" + (f" {dtype}" if dtype else "") + (f" op {red}" if red and red != "None" else "")

    if theirs is None:
        return ""
    if others is None:
        return f": its calls in step {step}: " + "; ".join(map(show, theirs)) if theirs else ""
    for i in range(max(len(theirs), len(others))):
        a = theirs[i] if i < len(theirs) else None
        b = others[i] if i < len(others) else None
        if a != b:
            return f": call {i + 1} of step {step}: {show(a) if a else 'none'}, the other ranks {show(b) if b else 'none'}"
    return ""


@dataclass
class _GradStep:
    """One step's grad-set events (probes/divergence.py): per CRC of the flags, its ranks and one example."""

    by_crc: dict[int, list[int]] = field(default_factory=dict)
    example: dict[int, list[Any]] = field(default_factory=dict)
    n: int = 0
    first_at: float = 0.0


def valid_grads(ev: Any) -> list[Any] | None:
    """A grad-set event ``["grads", step, count, total, crc(, changed)]``, checked."""
    if not isinstance(ev, list) or len(ev) not in (5, 6) or ev[0] != "grads" \
            or not all(type(v) is int for v in ev[1:5]) or (len(ev) == 6 and not isinstance(ev[5], dict)):
        return None
    return ev


def _changed_names(ev: list[Any], side: str) -> list[str]:
    names = ev[5].get(side) if len(ev) == 6 else None
    return [str(n)[:120] for n in names[:8]] if isinstance(names, list) else []


class DivergenceJudge:
    def __init__(self, world_size: int | None) -> None:
        self.world_size = world_size
        self.steps: dict[int, _Step] = {}
        self.agreed: list[int] | None = None  # the last step's record every rank agreed on
        self.verdict: DivergenceVerdict | None = None
        self.judged = 0
        self.agreed_step = 0  # the last step every rank agreed on
        # The loader that ran dry on some ranks while others go on (probes/data_position.py's dry event): per step,
        # the ranks whose training loader ran dry after it (the first MAX_RANKS_SHOWN; their count; when the first
        # did), and one rank known to go on past it (with its batches left, -1: it recorded the next step).
        self.dry_at: dict[int, list[int]] = {}
        self.dry_count: dict[int, int] = {}
        self.dry_ms: dict[int, int] = {}
        self.going_on: dict[int, tuple[int, int]] = {}
        # The grad-set events: per step not yet judged; the CRC of the last step every rank agreed on.
        self.grad_steps: dict[int, _GradStep] = {}
        self.grads_agreed: int | None = None
        # The late events (gradient norms; CUDA losses): per (kind, step) not yet judged, each rank's finiteness.
        self.norm_steps: dict[tuple[str, int], dict[int, int]] = {}

    def add_norm(self, rank: int, step: int, finite: int, kind: str = "gnorm") -> DivergenceVerdict | None:
        """``rank``'s late event of ``step`` (probes/divergence.py: ``gnorm``, its gradient norm; ``loss``, its
        CUDA loss read once copied to the host); judged once every rank sent it: the ranks whose value was
        non-finite while another's was finite are named. Every rank non-finite at once is no divergence between
        ranks (a gradient norm over gradients DDP averaged is the same everywhere)."""
        if self.verdict is not None:
            return None
        st = self.norm_steps.get((kind, step))
        if st is None:
            st = self.norm_steps[kind, step] = {}
            while len(self.norm_steps) > 2 * WINDOW:
                del self.norm_steps[min(self.norm_steps, key=lambda k: k[1])]
        st[rank] = st.get(rank, 1) & (1 if finite else 0)
        if self.world_size is None or len(st) < self.world_size:
            return None
        del self.norm_steps[kind, step]
        bad = sorted(r for r, v in st.items() if not v)
        if not bad or len(bad) == len(st):
            return None
        who = _who(bad)
        text = (f"{who}: its gradient norm (the value clip_grad_norm_ or get_total_norm returned) went non-finite "
                f"(NaN/inf) at step {step} while the other ranks' was finite: a gradient that is not averaged across "
                "ranks (a parameter outside DDP, a norm taken before an all-reduce) went NaN/inf there first"
                if kind == "gnorm" else
                f"{who}: the loss went non-finite (NaN/inf) at step {step}, the other ranks' was finite (a CUDA loss, "
                "read once its copy reached the host)")
        item: DivergenceItem = {"field": kind, "rank_value": 0, "others_value": 1, "text": text}
        now = time.time()
        self.verdict = {"step": step, "ranks": bad[:MAX_RANKS_SHOWN], "ranks_count": len(bad),
                        "others_count": len(st) - len(bad), "job": {kind: 1}, "items": [item], "reason": text,
                        "detected_at": now, "after_first_record_s": 0.0}
        return self.verdict

    def add_grads(self, ranks: list[int], ev: list[Any]) -> DivergenceVerdict | None:
        """``ranks`` sent the grad-set event ``ev`` (valid_grads); judged once every rank sent that step's. Ranks
        that manage different numbers of parameters (pipeline stages) are not compared."""
        if self.verdict is not None or not ranks:
            return None
        step, crc = ev[1], ev[4]
        st = self.grad_steps.get(step)
        if st is None:
            st = self.grad_steps[step] = _GradStep(first_at=time.time())
            _bound(self.grad_steps)
        st.by_crc.setdefault(crc, []).extend(ranks)
        st.example.setdefault(crc, ev)
        st.n += len(ranks)
        if self.world_size is None or st.n < self.world_size:
            return None
        del self.grad_steps[step]
        if len(st.by_crc) == 1:
            self.grads_agreed = crc
            return None
        if len({ex[3] for ex in st.example.values()}) > 1:
            return None  # different models (pipeline stages): their sets are not comparable
        self.verdict = self._grads_verdict(step, st)
        return self.verdict

    def _grads_verdict(self, step: int, st: _GradStep) -> DivergenceVerdict:
        agreed = self.grads_agreed
        crcs = sorted(st.by_crc, key=lambda c: (-len(st.by_crc[c]), 0 if c == agreed else 1, min(st.by_crc[c])))
        job = st.example[crcs[0]]
        items: list[DivergenceItem] = []
        diverged: list[int] = []
        for crc in crcs[1:]:
            ranks = sorted(st.by_crc[crc])
            diverged.extend(ranks)
            ex = st.example[crc]
            off, on = _changed_names(ex, "off"), _changed_names(ex, "on")
            what = "; ".join(([f"it stopped building {', '.join(off)}"] if off else [])
                             + ([f"it started building {', '.join(on)}"] if on else []))
            same = " (as many, but other parameters)" if ex[2] == job[2] else ""
            items.append({"field": "grads", "rank_value": ex[2], "others_value": job[2], "text": (
                f"{_who(ranks)}: builds gradients for {ex[2]} of the {ex[3]} parameters DDP/FSDP2 manage at step "
                f"{step}, the other ranks for {job[2]}{same}" + (f" ({what})" if what else "")
                + ": a layer frozen or unfrozen on some ranks only; their gradient collectives no longer match, so "
                "the others wait inside this step's backward")})
        diverged.sort()
        reason = items[0]["text"]
        if len(diverged) == len(st.by_crc[crcs[0]]):
            reason += (" (as many ranks on each side: the side named is the one that changed from the last agreed "
                       "step)" if crcs[0] == agreed else " (as many ranks on each side, both changed from the last "
                       "agreed step: the side of the higher rank is named; either may be the one at fault)")
        now = time.time()
        return {"step": step, "ranks": diverged[:MAX_RANKS_SHOWN], "ranks_count": len(diverged),
                "others_count": len(st.by_crc[crcs[0]]), "job": {"grads": job[2], "params": job[3]},
                "items": items[:8], "reason": reason, "detected_at": now,
                "after_first_record_s": round(now - st.first_at, 3)}

    def add_dry(self, rank: int, step: int, ms: int) -> DivergenceVerdict | None:
        """``rank``'s training loader ran dry after ``step`` completed steps (at ``ms``, epoch milliseconds) and it
        drew no batch since (probes/data_position.py's dry event); a verdict if another rank is known to go on."""
        if self.verdict is not None:
            return None
        ranks = self.dry_at.setdefault(step, [])
        if not ranks:
            self.dry_ms[step] = ms
            _bound(self.dry_at, self.dry_ms, self.dry_count)
        if rank not in ranks and len(ranks) < MAX_RANKS_SHOWN:
            ranks.append(rank)
        self.dry_count[step] = self.dry_count.get(step, 0) + 1
        on = self.going_on.get(step)
        if on is not None and on[0] != rank:
            self.verdict = self._dry_verdict(step, on)
        return self.verdict

    def _went_on(self, ranks: list[int], rec: list[int]) -> DivergenceVerdict | None:
        """A record with a training loader (epoch >= 0) that shows its ranks go on past a step with batches: ``left``
        > 0 after this step, or no StopIteration since the previous step's record."""
        step, epoch, dry, left = rec[0], rec[7], rec[8], rec[10]
        if epoch < 0:
            return None
        for past, left_then in ((step, left), (step - 1, -1)):
            if (past == step and left <= 0) or (past < step and (dry != 0 or past < 1)):
                continue
            if past not in self.going_on:
                self.going_on[past] = (ranks[0], left_then)
                _bound(self.going_on)
            dry_ranks = self.dry_at.get(past)
            if dry_ranks and any(r not in ranks for r in dry_ranks):
                self.verdict = self._dry_verdict(past, (ranks[0], left_then))
                return self.verdict
        return None

    def _dry_verdict(self, step: int, on: tuple[int, int]) -> DivergenceVerdict:
        dry = sorted(self.dry_at.get(step, []))
        count = self.dry_count.get(step, len(dry))
        other, left = on
        now = time.time()
        went = (f"rank {other} goes on to step {step + 1} ({left} batch(es) left in its loader)" if left > 0 else
                f"rank {other} goes on to step {step + 1} (it recorded that step without its loader ending)")
        text = (f"{_who(dry)}: its training DataLoader ran dry (StopIteration) after step {step} and it has drawn "
                f"none since (it left its training loop), while {went}: a shorter shard or loader; split the data evenly "
                "(DistributedSampler with drop_last) or wrap the loop in Join")
        others = max(1, (self.world_size or count + 1) - count)
        item: DivergenceItem = {"field": "dry", "rank_value": 1, "others_value": 0, "text": text}
        return {"step": step + 1, "ranks": dry[:MAX_RANKS_SHOWN], "ranks_count": count, "others_count": others,
                "job": {"dry": 0, "left": left}, "items": [item], "reason": text, "detected_at": now,
                "after_first_record_s": round(max(0.0, now - self.dry_ms.get(step, int(now * 1000)) / 1000), 3)}

    def add(self, ranks: list[int], rec: list[int]) -> DivergenceVerdict | None:
        """``ranks`` reported ``rec`` (one rank, or a node's ranks that agree); the new verdict, if this made one."""
        if self.verdict is not None or not ranks:
            return None
        if self._went_on(ranks, rec) is not None:
            return self.verdict
        step, key = rec[0], rec[1]
        st = self.steps.get(step)
        if st is None:
            if len(self.steps) >= WINDOW:
                del self.steps[min(self.steps)]
            st = self.steps[step] = _Step(first_at=time.time())
        st.by_key.setdefault(key, []).extend(ranks)
        st.example.setdefault(key, rec)
        st.n += len(ranks)
        if self.world_size is None or st.n < self.world_size:
            return None
        del self.steps[step]
        self.judged += 1
        if len(st.by_key) == 1:
            self.agreed = rec
            self.agreed_step = max(self.agreed_step, step)
            return None
        self.verdict = self._verdict(step, st)
        return self.verdict

    def _verdict(self, step: int, st: _Step) -> DivergenceVerdict:
        agreed_key = self.agreed[1] if self.agreed is not None else None

        def rank_of(key: int) -> tuple[int, int, int, int]:
            ex = st.example[key]
            return (-len(st.by_key[key]), 0 if key == agreed_key else 1, 0 if ex[5] != 0 else 1,
                    min(st.by_key[key]))

        keys = sorted(st.by_key, key=rank_of)
        job_key = keys[0]
        job = dict(zip(FIELDS + INFO, st.example[job_key][2:2 + len(FIELDS) + len(INFO)], strict=True))
        items: list[DivergenceItem] = []
        diverged: list[int] = []
        for key in keys[1:]:
            ranks = sorted(st.by_key[key])
            diverged.extend(ranks)
            theirs = dict(zip(FIELDS + INFO, st.example[key][2:2 + len(FIELDS) + len(INFO)], strict=True))
            items.extend(_items(step, ranks, theirs, job, record_reason(st.example[key]),
                                record_reason(st.example[job_key]),
                                _first_call_difference(step, record_calls(st.example[key]),
                                                       record_calls(st.example[job_key]))))
        diverged.sort()
        reason = items[0]["text"] if items else f"ranks {diverged[:8]} differ at step {step}"
        if len(diverged) == len(st.by_key[job_key]):
            job_ex = st.example[job_key]
            reason += (" (as many ranks on each side: the side named is the one that changed from the last agreed step)"
                       if job_key == agreed_key else
                       " (as many ranks on each side: the side named is the one whose loss went non-finite)"
                       if job_ex[5] != 0 and any(st.example[k][5] == 0 for k in keys[1:]) else
                       " (as many ranks on each side, both changed from the last agreed step: the side of the higher "
                       "rank is named; either may be the one at fault)")
        return {"step": step, "ranks": diverged[:MAX_RANKS_SHOWN], "ranks_count": len(diverged),
                "others_count": len(st.by_key[job_key]), "job": job, "items": items[:8], "reason": reason,
                "detected_at": time.time(), "after_first_record_s": round(time.time() - st.first_at, 3)}


def _bound(*maps: dict[int, Any]) -> None:
    """Keeps each per-step map to WINDOW steps (the oldest go)."""
    for m in maps:
        while len(m) > WINDOW:
            del m[min(m)]


def _who(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "")
    return ("rank " if len(ranks) == 1 else "ranks ") + shown


def _items(step: int, ranks: list[int], theirs: dict[str, int], job: dict[str, int],
           why: str | None = None, others_why: str | None = None, calls: str = "") -> list[DivergenceItem]:
    """The fields that differ, most telling first: a non-finite loss, the training loader's end or epoch, optimizer
    steps, collective counts, the collectives' kinds, compiled graphs."""
    who = _who(ranks)
    out: list[DivergenceItem] = []

    def add(name: str, text: str) -> None:
        out.append({"field": name, "rank_value": theirs[name], "others_value": job[name], "text": text})

    if theirs["loss"] != job["loss"] and 0 in (theirs["loss"], job["loss"]):
        add("loss", f"{who}: the loss went non-finite (NaN/inf) at step {step}, the other ranks' was finite"
            if theirs["loss"] == 0 else f"{who}: loss finite at step {step} while the other ranks' went non-finite")
    if theirs["dry"] != job["dry"] or theirs["epoch"] != job["epoch"]:
        add("dry" if theirs["dry"] != job["dry"] else "epoch", _data_text(step, who, theirs, job))
    if theirs["opt"] != job["opt"]:
        add("opt", f"{who}: {theirs['opt']} optimizer step(s) in step {step}, the other ranks {job['opt']}")
    if theirs["colls"] != job["colls"]:
        more = theirs["colls"] > job["colls"]
        add("colls", f"{who}: {theirs['colls']} collectives on the default group in step {step}, the other ranks "
            f"{job['colls']}" + (" (it skipped an optimizer step, so its step spans more than one iteration, or "
                                 "issued extra collectives)" if more else " (it issued fewer collectives)"))
    if theirs["ops"] != job["ops"]:
        add("ops", f"{who}: its torch.distributed calls in step {step} differ from the other ranks' "
            f"(op, sizes, dtype or reduce op){calls}")
    if theirs["graphs"] != job["graphs"]:
        add("graphs", f"{who}: {theirs['graphs']} graphs compiled by step {step}, the other ranks {job['graphs']} "
            + (f"(its torch.compile: {why})" if why else f"(the other ranks' torch.compile: {others_why})" if others_why
               else "(torch.compile recompiled on one side)"))
    return out


def _data_text(step: int, who: str, theirs: dict[str, int], job: dict[str, int]) -> str:
    def where(rec: dict[str, int]) -> str:
        left = f", {rec['left']} left" if rec["left"] >= 0 else ""
        return f"epoch {rec['epoch']}, batch {rec['batches']}{left}"

    if theirs["dry"] and not job["dry"]:
        head = f"{who}: its training DataLoader ran dry (StopIteration) before step {step} while the other ranks' did not"
    elif job["dry"] and not theirs["dry"]:
        head = f"{who}: its training DataLoader did not end before step {step} while the other ranks' ran dry"
    else:
        head = f"{who}: reads epoch {theirs['epoch']} of its training DataLoader at step {step}, the other ranks epoch " \
            f"{job['epoch']}"
    return f"{head} ({where(theirs)}; the others {where(job)}): a shorter shard or loader, or another epoch count"


class DivergenceWatch:
    """HangMonitor plugin: feeds the ranks' "fp" lines to the judge; on a verdict writes RUN/divergence.json, says
    one line and, with ``on_divergence == "stop"``, asks every rank to stop before its next optimizer step."""

    def __init__(self, on_divergence: str = "warn") -> None:
        self.on_divergence = on_divergence
        self.judge = DivergenceJudge(None)
        self.run_root: Path | None = None
        self.relay: Any = None  # a job of several nodes: job/divergence_relay.DivergenceRelay (join_job)
        self._lock = threading.Lock()  # the head's judge is fed by its ranks' lines and by the other nodes' relay
        self._stop_at: float | None = None  # stop mode: when the verdict told the ranks to stop
        self._ended = False

    def join_job(self, relay: Any) -> None:
        """job/agent.attach_agent: the job spans nodes. A node relays its ranks' records to the head (the agent
        does) and hands its ranks the head's word; the head judges every rank's and puts its word for the nodes."""
        self.relay = relay
        relay.stop_mode = self.on_divergence == "stop"

    def rank_env(self) -> dict[str, str]:
        """The ranks' probes/divergence.py reads the mode: in stop mode it holds each optimizer step for the word."""
        return {MODE_ENV: self.on_divergence}

    def on_start(self, monitor: Any) -> None:
        self.run_root = monitor.run_root
        if monitor.decider is not None and self.relay is None and self.on_divergence == "stop":
            # Several nodes but no job layer to relay the records: no monitor sees a whole step, so a held
            # optimizer step would wait HOLD_S every step. Said, and warned about instead.
            self.on_divergence = "warn"
            monitor.say("--on-divergence stop needs the job layer on a job of several nodes: warning instead "
                        "(docs/hangs.md#divergence)")
        if self.run_root is not None and monitor.writes_run_files:
            (Path(self.run_root) / "divergence.json").unlink(missing_ok=True)

    def on_tick(self, monitor: Any, now: float) -> None:
        """Stop mode, STOP_END_S after the verdict: when every rank still running waits in a collective (a peer left
        its loop, or waits in another one), none will reach the optimizer step where it would stop, so the job is
        ended now (the monitor's hang path: stacks, Flight Recorder dumps, RUN/hang.json pointing to the
        divergence) rather than at the hang timeout. A rank still doing other work (saving in a ``finally``) is left
        to end on its own."""
        if self._stop_at is None or self._ended or now - self._stop_at < STOP_END_S:
            return
        snap = monitor.snapshot()
        alive = [r for r, s in snap.items() if s["exit"] is None]
        waiting = [r for r in alive if _waits(snap[r]["beat"])]
        if not alive or len(waiting) < len(alive):
            return
        self._ended = True
        monitor.say(f"--on-divergence stop: rank(s) {waiting[:8]} still wait in a collective {now - self._stop_at:.1f} s "
                    "after the verdict (their peers will not join it): ending the job")
        monitor.end_now(waiting)

    def on_message(self, monitor: Any, rank: int, msg: Any) -> None:
        if msg.get("type") != "fp" or self.judge.verdict is not None:
            return
        if self.relay is not None and not self.relay.is_head:
            return  # the agent relays this node's records to the head, which judges
        with self._lock:
            self._judge(monitor, rank, msg)

    def _judge(self, monitor: Any, rank: int, msg: Any) -> None:
        if self.judge.verdict is not None:
            return
        if self.judge.world_size is None:
            self.judge.world_size = monitor.world_size or getattr(monitor, "_expected_world", None)
        recs = msg.get("fp")
        before = self.judge.agreed_step
        for raw in recs if isinstance(recs, list) else []:
            if isinstance(raw, list) and len(raw) == 3 and raw[0] == "dry":  # probes/data_position.dry_event
                if type(raw[1]) is int and type(raw[2]) is int:
                    verdict = self.judge.add_dry(rank, raw[1], raw[2])
                    if verdict is not None:
                        self._declare(monitor, verdict)
                        return
                continue
            if isinstance(raw, list) and len(raw) == 3 and raw[0] in ("gnorm", "loss"):  # probes' late events
                if type(raw[1]) is int and type(raw[2]) is int:
                    verdict = self.judge.add_norm(rank, raw[1], raw[2], raw[0])
                    if verdict is not None:
                        self._declare(monitor, verdict)
                        return
                continue
            grads = valid_grads(raw)
            if grads is not None:  # probes/divergence.py's grad-set event, at the step's first backward
                verdict = self.judge.add_grads([rank], grads)
                if verdict is not None:
                    self._declare(monitor, verdict)
                    return
                continue
            rec = valid(raw)
            if rec is None:
                continue
            verdict = self.judge.add([rank], rec)
            if verdict is not None:
                self._declare(monitor, verdict)
                return
        if self.on_divergence == "stop" and self.judge.agreed_step > before:
            for r in monitor.rank_ids():  # the held optimizer steps may run (probes/divergence.py)
                monitor.send(r, {"type": "fp-ok", "step": self.judge.agreed_step})
            if self.relay is not None:
                self.relay.word(ok=self.judge.agreed_step)  # and the other nodes' ranks

    def _declare(self, monitor: Any, verdict: DivergenceVerdict) -> None:
        verdict["on_divergence"] = self.on_divergence
        if self.on_divergence == "stop":
            for r in monitor.rank_ids():
                monitor.send(r, {"type": "divergence-stop", "reason": verdict["reason"]})
            if self.relay is not None:
                self.relay.word(stop=verdict["reason"])
            self._stop_at = time.time()
        if self.run_root is not None and monitor.writes_run_files:
            try:
                write_json(Path(self.run_root) / "divergence.json", verdict)
            except OSError:
                pass
        for plugin in getattr(monitor, "plugins", []):  # the live watch: status, Prometheus, live TensorBoard
            hook = getattr(plugin, "on_divergence", None)
            if hook is not None:
                try:
                    hook(monitor, verdict)
                except Exception:  # noqa: BLE001 - a surface that fails never stops the verdict
                    pass
        action = "; stopping the job before its next optimizer step" if self.on_divergence == "stop" else ""
        monitor.say(f"ranks diverged at step {verdict['step']}: {verdict['reason']}{action}")


def _waits(beat: Any) -> bool:
    """The rank's last beat shows it inside a collective or inside backward (DDP's gradient all-reduces)."""
    return isinstance(beat, dict) and (beat.get("collective") is not None or beat.get("backward") is not None)
