"""The live alerts of a run (RUN/live/alerts.jsonl) as findings of its final report: warnings with their cost."""

from __future__ import annotations

from collections.abc import Mapping

from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.live.health import node_dir, node_names
from ddpdoctor.live.rules import recurring_after_all
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.safe_io import loads_json, read_text

MAX_ALERT_BYTES = 4 << 20


def read_alerts(run: RunDir) -> list[Mapping[str, object]]:
    """Every node's alert records (live/records.py Alert), oldest first (malformed lines skipped; a missing or
    unreadable file is none). Read back from the run directory, so untrusted: narrowed where read, their evidence
    copied into the findings as it is."""
    text = ""
    for node in node_names(run.root):
        try:
            text += read_text(node_dir(run.root, node) / "alerts.jsonl", MAX_ALERT_BYTES) + "\n"
        except (BadInput, OSError):
            continue
    out: list[Mapping[str, object]] = []
    for line in text.splitlines():
        try:
            rec = loads_json(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("id") in ("slow-rank", "slowdown", "stall"):
            out.append(rec)
    return sorted(out, key=lambda a: t if isinstance(t := a.get("time"), (int, float)) else 0.0)


def ledger_notes(run: RunDir) -> list[str]:
    """The collective ledger's notes from every node's last snapshot (a caused wait too small to tell from a crowded
    host's scheduling: docs/metrics.md#caused-wait), and the ranks here whose ledger could not time their
    collectives on the device (docs/metrics.md#ledger-sources)."""
    out: list[str] = []
    for node in node_names(run.root):
        try:
            snap = loads_json(read_text(node_dir(run.root, node) / "health.json", MAX_ALERT_BYTES))
        except (BadInput, OSError, ValueError):
            continue
        notes = snap.get("ledger_notes") if isinstance(snap, dict) else None
        out += [str(n) for n in notes or [] if isinstance(n, str) and n not in out][:5]
    return out + _blind_notes(run)


def _blind_notes(run: RunDir) -> list[str]:
    from ddpdoctor.job.grouping import rank_ranges
    from ddpdoctor.rundir.loaders import rank_statuses

    try:
        statuses = rank_statuses(run)
    except (BadInput, OSError):
        return []  # the report names a damaged status.json itself
    why: dict[str, list[int]] = {}
    for rank, st in statuses.items():
        ledger = st.get("ledger") if isinstance(st, dict) else None
        blind = ledger.get("blind") if isinstance(ledger, dict) else None
        if isinstance(blind, str) and blind:
            why.setdefault(blind[:300], []).append(rank)
    return [f"collective ledger: rank(s) {rank_ranges(ranks)} could not time their collectives on the device; "
            f"{reason}. Who made whom wait was not judged from them (docs/metrics.md#ledger-sources)"
            for reason, ranks in sorted(why.items(), key=lambda kv: kv[1][0])[:5]]


def live_findings(run: RunDir) -> list[Finding]:
    """One slow-rank finding per rank (its latest evidence), the last slowdown, one stall finding for all stalls
    (those that recurred at a fixed period by the end of the run are dropped: evaluation or checkpoint work)."""
    alerts = read_alerts(run)
    out: list[Finding] = []
    slow = {ranks[0]: a for a in alerts if a["id"] == "slow-rank" and (ranks := _ranks(a))}  # each rank's latest
    step_ms = None
    for r, a in sorted(slow.items()):
        ev = _evidence(a)
        step_ms = ev.get("step_ms")
        out.append(Finding(
            "slow-rank", Severity.WARNING, str(a.get("title", f"rank {r} is persistently slower")), [r],
            dict(ev, cost_ms_per_step=ev.get("lost_ms_per_step"), cost_pct_of_step=ev.get("pct_of_step"),
                 raised_at_step=a.get("step")),
            (f"rank {r} spends longer than the others in {ev.get('phase')} while they wait for it: look at what "
             "differs on its host (CPU contention, `ddpdoctor topo`, thermal throttling) or in its data shard; "
             if ev.get("phase") else
             f"the others wait for rank {r} while none of its host phases is longer: on NCCL its GPU work is slower "
             "(clocks, thermal throttling, a neighbour on the GPU, its data's copy to the device); ")
            + "`ddpdoctor capture RUN --profile 5` profiles it without a restart."))
    downs = [a for a in alerts if a["id"] == "slowdown"]
    if downs:
        a = downs[-1]
        ev = _evidence(a)
        out.append(Finding(
            "slowdown", Severity.WARNING, str(a.get("title", "the job's step time regressed")), [],
            dict(ev, cost_pct_of_step=ev.get("pct_slower"), raised_at_step=a.get("step")),
            f"the step time rose from step {ev.get('since_step')}: compare a profile window now "
            "(`ddpdoctor capture RUN --profile 5`) with the run's first steps; look for memory growth, a slower "
            "data source, a degraded link or a neighbour on the host."))
    stalls = [a for a in alerts if a["id"] == "stall"]
    periodic = recurring_after_all([_evidence(a) or {"step": a.get("step")} for a in stalls])
    stalls = [a for a in stalls if _evidence(a).get("step") not in periodic]
    if stalls:
        evs = [_evidence(a) for a in stalls]
        total_ms = sum(_num(e.get("excess_s")) * 1e3 for e in evs)
        steps_seen = int(max(_num(e.get("step")) for e in evs)) or 1
        longest = max((x for e in evs if isinstance(x := e.get("seconds"), (int, float))), default=None)
        out.append(Finding(
            "stall", Severity.WARNING,
            f"{len(stalls)} step(s) took far longer than usual without hanging (longest {longest} s)",
            sorted({r for a in stalls for r in _ranks(a)}),
            {"stalls": evs[:20], "total_excess_ms": round(total_ms, 1),
             "cost_ms_per_step": round(total_ms / steps_seen, 3), "step_ms": step_ms},
            "a long step that does not recur is a one-off wait: I/O (data, filesystem), a host hiccup or a slow "
            "collective; `ddpdoctor capture RUN --stacks` shows where every rank is while it happens."))
    return out


def _evidence(alert: Mapping[str, object]) -> Mapping[str, object]:
    """An alert's evidence as read back: its object, or none."""
    ev = alert.get("evidence")
    return ev if isinstance(ev, dict) else {}


def _ranks(alert: Mapping[str, object]) -> list[int]:
    """An alert's ranks as read back (what is not an integer left out)."""
    ranks = alert.get("ranks")
    return [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else []


def _num(v: object) -> float:
    """A number as read back, else 0 (what ``or 0`` gave for a missing one)."""
    return float(v) if isinstance(v, (int, float)) else 0.0
