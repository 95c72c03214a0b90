"""What `ddpdoctor status` shows: a run directory's live state (RUN/live/health.json and the manifest), as plain
data and as text. Reads only; everything it reads is bounded and treated as untrusted."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.launch.runlock import is_locked
from ddpdoctor.live.health import node_dir, node_names
from ddpdoctor.live.records import MergedHealth, StatusDoc
from ddpdoctor.safe_io import clean_text, json_depth_ok, loads_json, read_bytes

MAX_STATE_BYTES = 32 << 20
STALE_S = 30.0  # no snapshot for this long while the manifest says running: the watcher may be gone


def _json(path: Path, limit: int) -> Mapping[str, object] | None:
    """A JSON object from the run directory, untrusted (read by key and narrowed); None when the file is absent."""
    try:
        raw = read_bytes(path, limit)
    except BadInput:
        if not path.exists():
            return None
        raise
    if json_depth_ok(raw) is not None:
        raise BadInput("JSON nested too deeply", path)
    try:
        data = loads_json(raw)  # NaN/Infinity as null, a lone surrogate as U+FFFD
    except ValueError as exc:
        raise BadInput(f"not valid JSON ({exc})", path) from exc
    if not isinstance(data, dict):
        raise BadInput("not a ddpdoctor state file", path)
    return data


def load_status(run_root: Path, now: float | None = None) -> StatusDoc:
    """{"state": "running"|"finished"|"unfinished"|"stale"|"starting", "run_dir", "command", "exit_code",
    "health": snapshot}. "unfinished": the manifest says running but no live ddpdoctor holds the run's lock."""
    now = time.time() if now is None else now
    if not run_root.is_dir():
        raise BadInput("not a directory", run_root)
    manifest = _json(run_root / "manifest.json", 1 << 20)
    if manifest is None:
        raise BadInput("not a ddpdoctor run directory (no manifest.json)", run_root)
    snaps = [h for node in node_names(run_root) if (h := _json(node_dir(run_root, node) / "health.json",
                                                                MAX_STATE_BYTES)) is not None]
    health = merge_nodes(snaps) if snaps else None
    finished = bool(manifest.get("finished")) or bool((health or {}).get("finished"))
    if finished:
        state = "finished"
    elif not is_locked(run_root):
        state = "unfinished"  # no live ddpdoctor holds the run: it was killed (SIGKILL) or crashed mid-run
    elif health is None:
        state = "starting"
    elif now - (_num(health.get("updated")) or 0.0) > STALE_S:  # a field of any type from a file: never a traceback
        state = "stale"
    else:
        state = "running"
    command = manifest.get("mode") or manifest.get("command")
    code = manifest.get("exit_code")
    return {"state": state, "run_dir": str(run_root), "command": command if isinstance(command, str) else None,
            "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else None,
            "live": health is not None, "health": health,
            "age_s": round(now - updated, 1) if health and (updated := _num(health.get("updated"))) else None}


def _num(v: object) -> float | None:
    """A finite number from an untrusted file, else None (a string, a list, NaN: never a traceback)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _cell(v: object, missing: str = "-") -> str:
    """A number as the file gave it (an int stays an int), or ``missing``."""
    return missing if _num(v) is None else str(v)


def merge_nodes(snaps: list[Mapping[str, object]]) -> Mapping[str, object]:
    """One job view from every node's snapshot (as read, untrusted): ranks together, the slowest by busy time,
    alerts in time order. One node's snapshot is shown as it is."""
    if len(snaps) == 1:
        return snaps[0]
    ranks: dict[str, object] = {}
    for h in snaps:
        part = h.get("ranks")
        if isinstance(part, dict):
            ranks.update(part)
    alerts = sorted((a for h in snaps for a in _list(h.get("alerts")) if isinstance(a, dict)),
                    key=lambda a: _num(a.get("time")) or 0.0)
    step_ms = [x for h in snaps if (x := _num(h.get("step_ms"))) is not None]
    steps = [x for h in snaps if (x := _num(h.get("step"))) is not None]
    updated = [x for h in snaps if (x := _num(h.get("updated"))) is not None]
    busy = {r: _num(v.get("busy_ms")) or 0.0 for r, v in ranks.items() if isinstance(v, dict)}
    merged: MergedHealth = {
        "version": snaps[0].get("version"), "nodes": [h.get("node") for h in snaps],
        "updated": max(updated) if updated else None, "finished": all(h.get("finished") for h in snaps),
        "world_size": max((_num(h.get("world_size")) or 0 for h in snaps), default=0) or None,
        "ranks_reporting": len(ranks), "step": int(max(steps)) if steps else 0,
        "step_ms": max(step_ms) if step_ms else None,  # a synchronous job runs at its slowest node's pace
        "steps_per_s": round(1e3 / max(step_ms), 3) if step_ms and max(step_ms) > 0 else None,
        "slowest_ranks": [int(r) for r in sorted(busy, key=lambda r: -busy[r]) if r.isdigit()][:5], "ranks": ranks,
        "alerts": alerts[-50:], "alerts_total": sum(int(_num(h.get("alerts_total")) or 0) for h in snaps),
        "waited_for": sorted((w for h in snaps for w in _list(h.get("waited_for")) if isinstance(w, dict)),
                             key=lambda w: -(_num(w.get("cost_ms_per_step")) or 0.0))[:5],
    }
    return merged


def _list(v: object) -> list[object]:
    """A list from an untrusted file, else none (what `or []` gave for a missing or empty value)."""
    return v if isinstance(v, list) else []


def status_text(st: Mapping[str, object], max_ranks: int = 16) -> str:
    """The terminal view: one header line, the job line, the slowest ranks, the alerts. ``st``: the state object
    (load_status, or `status --json` read back), untrusted."""
    health = st.get("health")
    h: Mapping[str, object] = health if isinstance(health, Mapping) else {}
    head = {"finished": f"finished (exit code {st.get('exit_code')})",
            "running": "running", "starting": "starting (no iteration reported yet)",
            "unfinished": "unfinished: ddpdoctor ended without finishing this run's record (killed with SIGKILL, "
                          "crashed, or the disk was full when it wrote the end); what was recorded until then is kept",
            "stale": f"no live update for {st.get('age_s')} s: is its ddpdoctor still running?"}[str(st["state"])]
    lines = [f"{clean_text(str(st['run_dir']))}: {head}"]
    if not st.get("live"):
        if st["state"] == "finished":
            lines.append("  no live state in this run (recorded without `ddpdoctor run`'s live watch)")
        return "\n".join(lines) + "\n"
    lines.append(f"  step {_cell(h.get('step'))}  ·  {_cell(h.get('steps_per_s'))} steps/s  ·  step time "
                 f"{_cell(h.get('step_ms'))} ms  ·  {_cell(h.get('ranks_reporting'))}/{_cell(h.get('world_size'), '?')} "
                 "ranks reporting")
    raw_ranks = h.get("ranks")
    ranks: Mapping[str, object] = raw_ranks if isinstance(raw_ranks, dict) else {}
    slow = h.get("slowest_ranks")
    slowest = [str(r) for r in slow] if isinstance(slow, list) else []
    if ranks:
        lines.append("  rank   step   step ms   busy ms   now        phase shares (busy = outside backward/collective)")
        shown = slowest + [r for r in sorted(ranks, key=lambda x: int(x) if x.isdigit() else 0) if r not in slowest]
        for r in shown[:max_ranks]:
            row = ranks.get(r)
            v: Mapping[str, object] = row if isinstance(row, dict) else {}
            raw_share = v.get("phase_share")
            share: Mapping[object, object] = raw_share if isinstance(raw_share, dict) else {}
            numeric = [(p, n) for p, x in share.items() if (n := _num(x)) is not None]
            shares = "  ".join(f"{clean_text(str(p))} {100 * n:.0f}%"
                               for p, n in sorted(numeric, key=lambda kv: -kv[1])[:4])
            lines.append(f"  {clean_text(r):>4} {_cell(v.get('step')):>6} {_cell(v.get('step_ms')):>9} "
                         f"{_cell(v.get('busy_ms')):>9}   {clean_text(str(v.get('phase_now')))[:10]:<10} {shares}")
        if len(shown) > max_ranks:
            lines.append(f"  ... {len(shown) - max_ranks} more ranks (--json for all)")
    waited = h.get("waited_for")
    for w in (waited if isinstance(waited, list) else [])[:5]:  # the collective ledger: who the others wait for
        if isinstance(w, dict):
            where = clean_text(str(w.get("phase"))) if w.get("phase") else "no longer host phase (device work?)"
            lines.append(f"  waited for: rank {clean_text(str(w.get('rank')))} in {where}, "
                         f"{_cell(w.get('cost_ms_per_step'))} ms per step ({_cell(w.get('cost_pct_of_step'))}% of the step)")
    alerts = [a for a in _list(h.get("alerts")) if isinstance(a, dict)]
    lines.append(f"  alerts: {_cell(h.get('alerts_total', len(alerts)))}" + ("" if alerts else " (none)"))
    for a in alerts[-10:]:
        lines.append(f"    step {a.get('step')}: {clean_text(str(a.get('id')))}: {clean_text(str(a.get('title')))}")
    return "\n".join(lines) + "\n"
