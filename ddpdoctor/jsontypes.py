"""The type of a JSON document ddpdoctor writes (a report, a section's JSON, an artefact), checked on the writing
side: a value that JSON cannot hold (a dataclass, a Path, a set) is a type error, not a surprise in json.dumps.

Reading JSON in is the other boundary: decoded documents are ``Mapping[str, object]`` (or a typed schema,
rundir/schema.py) and are narrowed where they are read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

# Mapping and Sequence (not dict and list): they are covariant, so a dict[str, float] is a JsonValue.
JsonValue: TypeAlias = str | int | float | bool | None | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
JsonObject: TypeAlias = dict[str, JsonValue]  # one JSON object being built, to be written out
