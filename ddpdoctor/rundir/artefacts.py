"""Reading and writing run-directory artefacts: bounded reads, validation against rundir/schema.py, atomic writes.

A file that is not what its schema says is bad input naming the file and the field
(``ranks/rank1/summary.json: steps[3].ts: expected a number, got "x"``), never a traceback further down."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput
from ddpdoctor.rundir import schema as s

T = TypeVar("T")

# Run-directory artefacts are small (a summary of a long run is a few MB); this bounds a corrupted or hostile one.
MAX_ARTEFACT_BYTES = 512 << 20
_MSG = re.compile(r"^(?P<what>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "array": "a list", "object": "a JSON object",
               "bool": "true or false", "null": "null"}


class DiskFull(BadInput, OSError):
    """A write into the run directory failed for lack of space (or quota): what was written before is kept.
    Also an OSError, so code that already tolerates a failed write (a probe in a rank) keeps doing so."""


def schema_for(path: Path) -> type[s.Artefact] | None:
    """The schema of a run-directory file, by its name (RUN/preflight.json is the gathered form)."""
    if path.name == "preflight.json" and path.parent.name != "" and not path.parent.name.startswith("rank"):
        return s.PreflightGathered
    return s.BY_NAME.get(path.name)


def _label(path: Path) -> str:
    """The file as the user knows it inside the run directory (ranks/rank1/summary.json), else as given."""
    parts = path.parts
    if len(parts) >= 3 and parts[-3] == "ranks":
        return str(Path(*parts[-3:]))
    return str(path)


_JSON_TYPE = {"int": int, "float": float, "str": str, "array": list, "object": dict, "bool": bool,
              "null": type(None)}


def _resolve(data: Any, where: str, got: str | None) -> tuple[str, Any]:
    """The value at a msgspec path ("$.a[0].b"); a dict entry msgspec shows as "[...]" is resolved to the first key
    whose value has the type msgspec got (so the message names the key)."""
    m = re.match(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]", where)
    if not where:
        return "", data
    if not m:
        return where, msgspec.UNSET
    key, idx = m.groups()
    rest = where[m.end():]
    if idx == "...":
        if isinstance(data, dict):
            for k, v in data.items():
                shown, value = _resolve(v, rest, got)
                if value is not msgspec.UNSET and (got is None or type(value) is _JSON_TYPE.get(got)):
                    return f"[{json.dumps(k)}]" + shown, value
        return where, msgspec.UNSET
    try:
        child = data[key] if key else data[int(idx)]
    except (KeyError, IndexError, TypeError, ValueError):
        return where, msgspec.UNSET
    shown, value = _resolve(child, rest, got)
    return where[: m.end()] + shown, value


def _value_at(data: Any, where: str) -> Any:
    return _resolve(data, where, None)[1]


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def explain(exc: msgspec.ValidationError, data: Any) -> str:
    """msgspec's "Expected `float`, got `str` - at `$.steps[3].ts`" as "steps[3].ts: expected a number, got "x"."""
    m = _MSG.match(str(exc))
    what, where = (m.group("what"), m.group("path") or "") if m else (str(exc), "")
    exp = re.match(r"Expected `(.+?)`, got `(.+?)`$", what)
    if exp and m and m.group("key"):
        keys = _value_at(data, where)
        bad = next((k for k in keys if not k.lstrip("-").isdigit()), None) if isinstance(keys, dict) else None
        what = f"keys must be ranks (integers), got {_shown(bad) if bad is not None else 'another key'}"
    elif exp:
        wanted = " or ".join(_TYPE_WORDS.get(t.strip(), t.strip()) for t in exp.group(1).split("|"))
        where, value = _resolve(data, where, exp.group(2))
        got = _shown(value) if value is not msgspec.UNSET else _TYPE_WORDS.get(exp.group(2), exp.group(2))
        what = f"expected {wanted}, got {got}"
    else:
        what = what[:1].lower() + what[1:]
    field = where.lstrip(".")
    return f"{field}: {what}" if field else what


def decode_json(path: Path, limit: int = MAX_ARTEFACT_BYTES) -> Any:
    """A JSON file's value, bounded in size and nesting, or BadInput naming the file."""
    label = _label(path)
    try:
        data = safe_io.read_bytes(path, limit)
    except BadInput as exc:
        raise BadInput(exc.problem, label) from exc
    deep = safe_io.json_depth_ok(data)
    if deep is not None:
        raise BadInput(f"JSON nested deeper than {safe_io.MAX_JSON_DEPTH} levels (at byte {deep})", label)
    try:
        return safe_io.loads_json(data)  # NaN/Infinity (not JSON) read as null, a lone surrogate as U+FFFD
    except UnicodeDecodeError as exc:
        raise BadInput(f"not UTF-8 text (byte {exc.start})", label) from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc.msg} at line {exc.lineno}, byte {exc.pos})", label) from exc
    except ValueError as exc:  # anything else json refuses (never a traceback)
        raise BadInput(f"not valid JSON ({exc})", label) from exc
    except RecursionError as exc:  # depth is bounded above; this is belt and braces
        raise BadInput("JSON nested too deeply", label) from exc


def validate(data: Any, schema: Any, label: str | Path) -> Any:
    """``data`` (decoded JSON) as ``schema``, or BadInput naming the file and the field path."""
    try:
        return msgspec.convert(data, schema, str_keys=True)
    except msgspec.ValidationError as exc:
        raise BadInput(explain(exc, data), str(label)) from exc


@overload
def load(path: Path, schema: type[T]) -> T: ...
@overload
def load(path: Path, schema: None = None) -> Any: ...
def load(path: Path, schema: Any = None) -> Any:
    """Read and validate one artefact (its schema from its name unless given): a typed object."""
    path = Path(path)
    schema = schema or schema_for(path)
    if schema is None:
        raise ValueError(f"no schema for {path.name}")
    return validate(decode_json(path), schema, _label(path))


# A boundary: a file's own JSON object (raw JSON in, validated), which the typed loaders narrow or cast.
def load_dict(path: Path, schema: Any = None) -> dict[str, Any]:
    """Read and validate one artefact, returned as the file's own JSON object (unknown fields kept): for code
    that still reads dicts. Every known field has been checked against its type."""
    path = Path(path)
    schema = schema or schema_for(path)
    data = decode_json(path)
    validate(data, schema, _label(path))
    if not isinstance(data, dict):  # the schema is an object, so validate() has already refused this
        raise BadInput("expected a JSON object", _label(path))
    return data


def load_optional(path: Path, schema: type[T]) -> T | None:
    """Like load(), None when the file does not exist (a rank killed before writing it)."""
    if not os.path.lexists(path):
        return None
    return load(path, schema)


def to_dict(obj: Any) -> Any:
    """A loaded artefact (or part of one) back to JSON-ready builtins."""
    return msgspec.to_builtins(obj)


def _stamp(path: Path, data: Any) -> Any:
    schema = schema_for(path)
    if schema is not None and isinstance(data, dict) and "schema_version" not in data:
        data = {"schema_version": s.VERSIONS[schema], **data}
    return data


def write_json(path: Path, data: Any, compact: bool = False) -> None:
    """Write an artefact atomically (a rank killed mid-write leaves the old file, never half a file), stamped
    with its schema_version. A full disk raises DiskFull (a BadInput) and leaves no temporary file behind."""
    path = Path(path)
    data = _stamp(path, data)
    text = (json.dumps(data, separators=(",", ":"), default=str) if compact
            else json.dumps(data, indent=1, default=str))
    write_private_text(path, text)


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` atomically into a file only its owner can read (0600: run-directory files hold stacks,
    environments and logs; docs/trust.md). A full disk raises DiskFull and leaves no temporary file behind."""
    path = Path(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _fault_hook(path)
        safe_io.write_atomic(path, text)  # an unpredictable temporary name, O_EXCL|O_NOFOLLOW, renamed into place
    except OSError as exc:
        raise write_error(exc, path) from exc


def write_error(exc: OSError, path: Path) -> BadInput:
    """The one line for a failed write into the run directory."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"cannot write: {exc.strerror} (what was written before is kept)", path)
    return BadInput(f"cannot write ({exc.strerror or exc})", path)


def _fault_hook(path: Path) -> None:
    """Tests only: DDPDOCTOR_TEST_ENOSPC=GLOB makes writes of files matching GLOB fail as on a full disk (used
    where the sandbox cannot mount a small filesystem)."""
    pattern = os.environ.get("DDPDOCTOR_TEST_ENOSPC")
    if pattern and path.match(pattern):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
