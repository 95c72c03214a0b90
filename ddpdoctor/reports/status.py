"""`status`'s view of a job under `ddpdoctor run`: its live state read from the run directory, typed. Its JSON is
the state object of docs/live.md (no report envelope: `status` reports a job in flight, not findings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.jsontypes import JsonObject


@dataclass(frozen=True)
class LiveStatus:
    state: str  # "running" | "finished" | "unfinished" | "stale" | "starting"
    run_dir: str
    command: str | None
    exit_code: int | None
    live: bool
    health: JsonObject | None  # the merged live/nodeN/health.json snapshots, passed through (docs/live.md)
    age_s: float | None

    def to_json(self) -> JsonObject:
        return {"state": self.state, "run_dir": self.run_dir, "command": self.command, "exit_code": self.exit_code,
                "live": self.live, "health": self.health, "age_s": self.age_s}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> LiveStatus:
        """The state object (live/status.py load_status, or a saved `status --json`)."""
        command, code, health, age = doc.get("command"), doc.get("exit_code"), doc.get("health"), doc.get("age_s")
        return cls(state=str(doc.get("state")), run_dir=str(doc.get("run_dir")),
                   command=command if isinstance(command, str) else None,
                   exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                   live=bool(doc.get("live")), health=dict(health) if isinstance(health, dict) else None,
                   age_s=float(age) if isinstance(age, (int, float)) and not isinstance(age, bool) else None)

    def exit_code_for(self, fail_on: str) -> int:
        """1 for a finished job that failed (an error), a run whose ddpdoctor was killed ("unfinished"), or any live
        alert (warnings) with --fail-on warning."""
        if fail_on == "none":
            return 0
        failed = (self.state == "finished" and self.exit_code not in (0, None)) or self.state == "unfinished"
        alerted = bool((self.health or {}).get("alerts_total"))
        return 1 if failed or (fail_on == "warning" and alerted) else 0


def assemble(run_root: Path, now: float | None = None) -> LiveStatus:
    from ddpdoctor.live.status import load_status

    return LiveStatus.from_json(load_status(run_root, now))
