"""The one typed hang verdict, for a job of one node or many: what hung, when it was seen, the diagnosis, every
rank's stack and Flight Recorder dump; RUN/hang.json is its to_json(). The node monitor and the job's head build
it the same way; a job of many nodes adds its rank classes and its nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.findings.hang import HangDiagnosis


@dataclass
class HangVerdict:
    detected_after_s: float  # seconds without progress when the rule called it a hang
    hang_timeout_s: float
    hang_timeout_set: bool  # the user's --hang-timeout (else the automatic one)
    startup_timeout_s: float
    in_startup: bool  # no rank had completed a step
    on_hang: str  # kill | report
    diagnosis: HangDiagnosis
    stacks: dict[int, str | None] = field(default_factory=dict)
    flight_recorder: dict[int, Any] = field(default_factory=dict)
    reported_after_s: float = 0.0  # detection plus collecting stacks and dumps (bounded by timeout + 5 s)
    heartbeats: dict[int, Any] | None = None  # one node: each rank's last heartbeat
    classes: list[dict[str, Any]] | None = None  # many nodes: ranks grouped by state and stack
    nodes: dict[int, dict[str, Any]] | None = None  # many nodes: host, lost, ranks of each

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "detected_after_s": self.detected_after_s, "hang_timeout_s": self.hang_timeout_s,
            "hang_timeout_set": self.hang_timeout_set, "startup_timeout_s": self.startup_timeout_s,
            "in_startup": self.in_startup, "on_hang": self.on_hang, "diagnosis": self.diagnosis.to_json(),
            "stacks": {str(r): s for r, s in self.stacks.items()},
        }
        if self.heartbeats is not None:
            out["heartbeats"] = {str(r): b for r, b in self.heartbeats.items()}
        if self.classes is not None:
            out["classes"] = self.classes
        if self.nodes is not None:
            out["nodes"] = {str(n): v for n, v in self.nodes.items()}
        out["flight_recorder"] = {str(r): d for r, d in self.flight_recorder.items()}
        out["reported_after_s"] = self.reported_after_s
        return out
