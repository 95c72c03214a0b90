"""The Report every command returns: the JSON contract's envelope around typed sections (docs/json.md).

A section is a typed object (a ``Section``) that serialises to some of the report's top-level JSON keys and loads
back from them; the concrete sections and the one assembly per command live in ``ddpdoctor/reports/``. A section
not yet typed travels as a ``RawSection`` (JSON-ready data, the boundary this file keeps for older builders)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from ddpdoctor.findings.model import Finding, Severity, Stopped, exit_code, ordered, status_word
from ddpdoctor.jsontypes import JsonObject

# The JSON contract's version (docs/json.md): raised when a key is renamed or removed or changes meaning, not when
# one is added.
SCHEMA_VERSION = 1
ENVELOPE = ("tool", "schema_version", "version", "command", "status", "stopped", "findings", "notes")

S = TypeVar("S", bound="Section")


class Section:
    """A typed part of a Report. Subclasses are dataclasses whose fields are their top-level JSON keys (``KEYS``,
    in output order); ``OPTIONAL`` keys are left out of the JSON while None. Override ``to_json``/``from_json``
    where a field's JSON is not the field itself."""

    KEYS: ClassVar[tuple[str, ...]] = ()
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> JsonObject:
        out: JsonObject = {}
        for key in self.KEYS:
            value = getattr(self, key)
            if value is None and key in self.OPTIONAL:
                continue
            out[key] = value.to_json() if hasattr(value, "to_json") else value
        return out

    @classmethod
    def present_in(cls, doc: Mapping[str, object]) -> bool:
        """Whether a saved report holds this section (its first key)."""
        return bool(cls.KEYS) and cls.KEYS[0] in doc

    @classmethod
    def from_json(cls: type[S], doc: Mapping[str, object]) -> S:
        """The section a saved report holds (keys it lacks take their field's default, or None)."""
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in doc:
                kwargs[f.name] = doc[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = None
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class RawSection(Section):
    """Sections not typed yet: top-level keys with JSON-ready values, kept in their order."""

    data: Mapping[str, Any]

    def to_json(self) -> JsonObject:
        return dict(self.data)

    @classmethod
    def present_in(cls, doc: Mapping[str, object]) -> bool:
        return True


def split_sections(data: Mapping[str, Any], kinds: Iterable[type[Section]]) -> list[Section]:
    """``data``'s top-level keys as sections: each of ``kinds`` present, typed; the keys none claims (one a newer
    builder added) kept as one RawSection, so nothing is lost on the way."""
    parts: list[Section] = []
    claimed: set[str] = set()
    for kind in kinds:
        if kind.present_in(data):
            parts.append(kind.from_json(data))
            claimed.update(kind.KEYS)
    rest = {k: v for k, v in data.items() if k not in claimed}
    if rest:
        parts.append(RawSection(rest))
    return parts


class _SectionsView(dict[str, Any]):  # a read view of JSON: the public API's boundary
    """Report.sections: the merged JSON of the sections; item assignment goes to the Report's RawSection."""

    def __init__(self, report: Report) -> None:
        merged: JsonObject = {}
        for part in report.parts:
            merged.update(part.to_json())
        super().__init__(merged)
        self._report = report

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._report._set_raw(key, value)


class Report:
    """What a command found: typed ``parts`` (sections), findings and notes, plus ``stopped`` (a ``Stopped``)
    when ddpdoctor was stopped by a signal; it sets the status word and the exit code."""

    def __init__(self, command: str, sections: Mapping[str, Any] | None = None,
                 findings: Iterable[Finding] = (), notes: Iterable[str] = (),
                 stopped: Stopped | None = None, parts: Iterable[Section] = ()) -> None:
        self.command = command
        self.parts: list[Section] = list(parts)
        if sections:
            self.parts.append(RawSection(dict(sections)))
        self.findings: list[Finding] = list(findings)
        self.notes: list[str] = list(notes)
        self.stopped: Stopped | None = Stopped(**stopped) if stopped else None

    def __repr__(self) -> str:
        return (f"Report(command={self.command!r}, parts={[type(p).__name__ for p in self.parts]}, "
                f"findings={[f.id for f in self.findings]}, status={self.status!r})")

    # the public API's read view of the JSON (``report.sections["job"]["exit_code"]``): a boundary
    @property
    def sections(self) -> dict[str, Any]:
        """Every section's JSON, merged in the order of ``parts``. Kept for readers of the JSON shape, such as the
        public ``ddpdoctor.check_sync(...).sections["job"]``. Setting a key adds it as a RawSection: the older
        builders not moved to ddpdoctor/reports yet still write this way."""
        return _SectionsView(self)

    @sections.setter
    def sections(self, value: Mapping[str, Any]) -> None:
        self.parts = [RawSection(dict(value))]

    def _set_raw(self, key: str, value: Any) -> None:
        raw = next((p for p in reversed(self.parts) if isinstance(p, RawSection) and isinstance(p.data, dict)), None)
        if raw is None:
            self.parts.append(RawSection({key: value}))
        else:
            raw.data[key] = value  # type: ignore[index]

    def section(self, kind: type[S]) -> S | None:
        """The first section of type ``kind`` (renderers choose sections by type)."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    def add(self, *parts: Section) -> None:
        """Add sections (the assembly of a command, in ddpdoctor/reports/, is the only caller)."""
        self.parts.extend(parts)

    @property
    def status(self) -> str:
        if self.stopped:
            return str(self.stopped["status"])
        return status_word(self.findings)

    def exit_code(self, fail_on: Severity = Severity.ERROR) -> int:
        return exit_code(self.findings, fail_on)

    def to_json(self) -> JsonObject:
        from ddpdoctor.version import __version__

        out: JsonObject = {
            "tool": "ddpdoctor",
            "schema_version": SCHEMA_VERSION,
            "version": __version__,
            "command": self.command,
            "status": self.status,
        }
        if self.stopped:
            st = self.stopped
            out["stopped"] = {"status": st["status"], "signal": st["signal"], "exit_code": st["exit_code"],
                              "message": st["message"]}
        out.update(self.sections)
        out["findings"] = [f.to_json() for f in ordered(self.findings)]
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], kinds: Iterable[type[Section]] = ()) -> Report:
        """The Report a saved report.json describes (the views re-render it; unknown severities become info).
        Each of ``kinds`` present in ``data`` is loaded typed (ddpdoctor/reports picks them by command); the keys
        none of them claims are kept as one RawSection."""
        findings = []
        for f in data.get("findings") or []:
            if not isinstance(f, dict):
                continue
            try:
                severity = Severity(f.get("severity"))
            except ValueError:
                severity = Severity.INFO
            findings.append(Finding(str(f.get("id", "")), severity, str(f.get("title", "")),
                                    [r for r in f.get("ranks") or [] if isinstance(r, int)],
                                    f["evidence"] if isinstance(f.get("evidence"), dict) else {},
                                    str(f.get("advice") or "")))
        notes = [str(n) for n in data.get("notes") or []]
        parts = split_sections({k: v for k, v in data.items() if k not in ENVELOPE}, kinds)
        raw = data.get("stopped")
        stopped = Stopped(status=str(raw.get("status")), signal=str(raw.get("signal")),
                          exit_code=int(raw.get("exit_code") or 0), message=str(raw.get("message") or "")) \
            if isinstance(raw, dict) else None
        return cls(command=str(data.get("command", "")), findings=findings, notes=notes, stopped=stopped,
                   parts=parts)
