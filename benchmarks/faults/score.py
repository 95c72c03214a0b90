"""Scoring: per scenario and overall, for each tool. Definitions (docs/accuracy.md):
- culprit accuracy: runs of fault scenarios with a single culprit set where the tool blamed exactly those ranks;
- cause-class accuracy: runs of fault scenarios where the tool's cause class is the true one (or one the scenario
  accepts);
- detected: runs of fault scenarios where the tool reported any fault;
- false alarms per healthy run: healthy runs where the tool reported a fault, over healthy runs;
- time to verdict: from the first fault mark a rank wrote to the moment the tool's verdict reached the user
  (its verdict line on stderr, else its report at exit), over the runs where it gave one."""

from __future__ import annotations

import statistics
from typing import Any

from scenarios import BY_NAME


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}% ({a}/{b})" if b else "n/a"


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def judge(o: dict[str, Any]) -> dict[str, Any]:
    """One run's marks: culprit_ok, class_ok (None where not scored), false_alarm."""
    sc = BY_NAME[o["scenario"]]
    out: dict[str, Any] = {"culprit_ok": None, "class_ok": None, "false_alarm": None, "detected": None}
    if not o["ran"]:
        return out
    if sc.healthy:
        out["false_alarm"] = bool(o["alarm"])
        return out
    out["detected"] = bool(o["alarm"])
    if sc.culprits is not None:
        out["culprit_ok"] = o["culprits"] is not None and sorted(o["culprits"]) == sorted(sc.culprits)
    out["class_ok"] = sc.right_class(o["cause"])
    return out


def summarise(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall figures of one tool's runs."""
    marks = [(o, judge(o)) for o in outcomes]
    ran = [(o, m) for o, m in marks if o["ran"]]
    cul = [m["culprit_ok"] for _, m in ran if m["culprit_ok"] is not None]
    cls = [m["class_ok"] for _, m in ran if m["class_ok"] is not None]
    det = [m["detected"] for _, m in ran if m["detected"] is not None]
    fa = [m["false_alarm"] for _, m in ran if m["false_alarm"] is not None]
    ttv = [o["time_to_verdict_s"] for o, m in ran if m["detected"] and o["time_to_verdict_s"] is not None]
    return {
        "runs": len(outcomes), "not_run": len(outcomes) - len(ran),
        "culprit": [sum(cul), len(cul)], "cause_class": [sum(cls), len(cls)], "detected": [sum(det), len(det)],
        "false_alarms": [sum(fa), len(fa)],
        "time_to_verdict_s": {"median": statistics.median(ttv) if ttv else None, "p95": _quantile(ttv, 0.95),
                              "n": len(ttv)},
    }


def markdown(results: dict[str, list[dict[str, Any]]], header: str) -> str:
    lines = [header, "", "## Overall", "",
             "| tool | culprit accuracy | cause-class accuracy | faults detected | false alarms per healthy run "
             "| time to verdict, median / p95 (n) | runs not run |", "|---|---|---|---|---|---|---|"]
    for tool, outs in results.items():
        s = summarise(outs)
        t = s["time_to_verdict_s"]
        ttv = f"{t['median']:.1f} s / {t['p95']:.1f} s ({t['n']})" if t["median"] is not None else "n/a"
        fa = s["false_alarms"]
        lines.append(f"| {tool} | {_pct(*s['culprit'])} | {_pct(*s['cause_class'])} | {_pct(*s['detected'])} | "
                     f"{fa[0] / fa[1]:.3f} ({fa[0]}/{fa[1]}) | {ttv} | {s['not_run']} |" if fa[1] else
                     f"| {tool} | {_pct(*s['culprit'])} | {_pct(*s['cause_class'])} | {_pct(*s['detected'])} | "
                     f"n/a | {ttv} | {s['not_run']} |")
    lines += ["", "## Per scenario", "",
              "Each cell: culprit ranks / cause class the tool gave, ✓ or ✗ for culprit and class (healthy: "
              "`ok` or `FALSE ALARM`), time to verdict.", ""]
    tools = list(results)
    lines.append("| scenario | truth | " + " | ".join(tools) + " |")
    lines.append("|---|---|" + "---|" * len(tools))
    names = list(dict.fromkeys(o["scenario"] for outs in results.values() for o in outs))
    for name in names:
        sc = BY_NAME[name]
        truth = "healthy" if sc.healthy else f"{ranks(sc.culprits) if sc.culprits is not None else 'all'} {sc.cause}"
        cells = []
        for tool in tools:
            runs = [o for o in results[tool] if o["scenario"] == name]
            cells.append("<br>".join(_cell(o) for o in runs) or "")
        lines.append(f"| {name} | {truth} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ranks(rs: list[int] | tuple[int, ...] | None) -> str:
    """Rank lists as ranges: [512-639] for 128 ranks."""
    if rs is None:
        return "none"
    xs = sorted(rs)
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return "[" + ",".join(parts) + "]"


def _cell(o: dict[str, Any]) -> str:
    if not o["ran"]:
        return f"not run: {o['not_run']}"
    m = judge(o)
    if m["false_alarm"] is not None:
        return f"FALSE ALARM: {ranks(o['culprits'])} {o['cause']}" if m["false_alarm"] else "ok"
    if not o["alarm"]:
        return "✗ nothing reported"
    c = "" if m["culprit_ok"] is None else ("✓" if m["culprit_ok"] else "✗")
    k = "✓" if m["class_ok"] else "✗"
    t = o["time_to_verdict_s"]
    return f"{ranks(o['culprits'])} {c} / {o['cause']} {k}" + (f" / {t:.1f} s" if t is not None else "")
