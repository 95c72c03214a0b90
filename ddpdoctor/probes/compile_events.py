"""torch.compile's events on this rank, for the per-step fingerprint (probes/divergence.py): graphs compiled,
recompiles and graph breaks, and when one happened in a step, its reason, read from torch._dynamo's own records
(``counters["stats"]["unique_graphs"]``; ``guard_failures``: per compiled function the guard failures that made it
recompile, as TORCH_LOGS=recompiles prints them; ``counters["graph_break"]``: per graph-break message its count).

Nothing is imported: until the script imports torch._dynamo there is nothing to read (graphs -1). A step reads one
counter; the failures and breaks are walked only in a step whose graph count moved (a compile)."""

from __future__ import annotations

import sys
from typing import Any

MAX_REASON = 300
MAX_KEPT = 1024  # compiled functions and graph-break messages remembered (torch keeps as many itself)


class CompileEvents:
    def __init__(self) -> None:
        self.graphs = -1
        self.recompiles = 0
        self.breaks = 0
        self._failures: dict[int, int] = {}  # id(code) -> guard failures seen
        self._messages: dict[str, int] = {}  # graph-break message -> count seen

    def take(self) -> tuple[int, int, int, str | None]:
        """(graphs, recompiles, graph breaks, the reason of what happened since the last call or None)."""
        dynamo = sys.modules.get("torch._dynamo.utils")
        if dynamo is None:
            return -1, 0, 0, None
        try:
            graphs = int(dynamo.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001 - another torch's counters
            return -1, 0, 0, None
        if graphs == self.graphs:
            return graphs, self.recompiles, self.breaks, None
        self.graphs = graphs
        reasons: list[str] = []
        try:
            reasons += self._new_recompiles(dynamo.guard_failures)
            reasons += self._new_breaks(dynamo.counters.get("graph_break") or {})
        except Exception:  # noqa: BLE001 - another torch's records: the counts stay, the reason is not read
            pass
        return graphs, self.recompiles, self.breaks, ("; ".join(reasons)[:MAX_REASON] or None)

    def _new_recompiles(self, failures: Any) -> list[str]:
        out = []
        total = 0
        for code, fails in list(failures.items()):
            total += len(fails)
            if len(fails) > self._failures.get(id(code), 0) and fails:
                where = f"{getattr(code, 'co_name', '?')} ({getattr(code, 'co_filename', '?').rsplit('/', 1)[-1]}:" \
                        f"{getattr(code, 'co_firstlineno', '?')})"
                out.append(f"recompiled {where}: {str(fails[-1]).splitlines()[0] if str(fails[-1]) else '?'}")
            if len(self._failures) < MAX_KEPT or id(code) in self._failures:
                self._failures[id(code)] = len(fails)
        self.recompiles = total
        return out

    def _new_breaks(self, counts: Any) -> list[str]:
        out = []
        total = 0
        for msg, n in list(counts.items()):
            total += int(n)
            if int(n) > self._messages.get(str(msg), 0):
                out.append(f"graph break: {str(msg).splitlines()[0] if str(msg) else '?'}")
            if len(self._messages) < MAX_KEPT or str(msg) in self._messages:
                self._messages[str(msg)] = int(n)
        self.breaks = total
        return out
