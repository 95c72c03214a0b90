"""Bounded, safe reading of untrusted input files, and text made safe for a terminal.

Every command and option that reads a path goes through here: only regular files are opened (a FIFO, a device or a
directory gets one BadInput line instead of blocking or reading forever), compressed data is decompressed as a
stream with a cap, and JSON nesting is bounded before it is decoded."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ddpdoctor.errors import BadInput
from ddpdoctor.terminal_text import clean_text

GZIP_MAGIC = b"\x1f\x8b"
# Caps on what one input file may expand to in memory. A real 8-GPU trace of a few steps is 100-500 MB; logs of a
# whole job rarely pass 1 GiB. `--max-input-mb` (or DDPDOCTOR_MAX_INPUT_MB) raises the cap.
DEFAULT_MAX_INPUT_MB = 4096
MAX_JSON_DEPTH = 256
MAX_INT_DIGITS = 4000  # below Python's int-string limit (4,300): a longer integer in any JSON input reads as null
# A gzip bomb expands ~1000x; profiler traces ~20x, logs rarely past 100x. Past 256 MiB, an input may expand at most
# 200x its compressed size, so a small bomb is refused after reading a few MB, not after filling the memory.
GZIP_MAX_RATIO = 200
GZIP_FREE_BYTES = 256 << 20
_CHUNK = 1 << 20


def bad_utf8(exc: BaseException) -> bool:
    """Whether a decoder refused its input for invalid UTF-8: UnicodeDecodeError (the standard library, msgspec
    before 0.23) or msgspec's DecodeError "Invalid UTF-8 encoded string" (msgspec 0.23 on, which also refuses the
    bytes of a lone surrogate)."""
    return isinstance(exc, UnicodeDecodeError) or (type(exc).__name__ == "DecodeError" and "UTF-8" in str(exc))


def max_input_bytes(default: int | None = None) -> int:
    """The cap on one input's (decompressed) size, from DDPDOCTOR_MAX_INPUT_MB, else ``default`` bytes (a
    command's own cap), else DEFAULT_MAX_INPUT_MB."""
    raw = os.environ.get("DDPDOCTOR_MAX_INPUT_MB", "")
    if not raw and default is not None:
        return default
    try:
        mb = float(raw) if raw else DEFAULT_MAX_INPUT_MB
    except ValueError:
        mb = DEFAULT_MAX_INPUT_MB
    return int(max(mb, 1) * (1 << 20))


def check_regular(path: Path, follow_links: bool = True) -> os.stat_result:
    """stat() the path and insist on a regular file; BadInput naming it otherwise (never blocks on a FIFO).
    ``follow_links=False``: a link is refused too (what a server reads on others' behalf)."""
    try:
        st = os.stat(path) if follow_links else os.lstat(path)
    except FileNotFoundError as exc:
        raise BadInput("file not found", path) from exc
    except OSError as exc:
        raise BadInput(f"cannot read ({exc.strerror or exc})", path) from exc
    if stat.S_ISLNK(st.st_mode):
        raise BadInput("is a symbolic link; not followed", path)
    if stat.S_ISDIR(st.st_mode):
        raise BadInput("is a directory, not a file", path)
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise BadInput(f"is {kind}, not a regular file", path)
    return st


def read_bytes(path: Path, limit: int | None = None, decompress: bool = True, follow_links: bool = True) -> bytes:
    """A regular file's bytes, gzip (by magic bytes) decompressed as a stream; BadInput past ``limit`` bytes,
    on a corrupt or truncated stream (naming the byte offset), or when the file cannot be read."""
    data = read_buffer(path, limit, decompress, follow_links)
    return data if isinstance(data, bytes) else bytes(data)


def read_buffer(path: Path, limit: int | None = None, decompress: bool = True,
                follow_links: bool = True) -> bytes | bytearray:
    """read_bytes, but decompressed data is the bytearray it was decompressed into (no copy of a 100 MB trace;
    traces/split.py writes into its own private copy)."""
    path = Path(path)
    limit = max_input_bytes() if limit is None else limit
    st = check_regular(path, follow_links)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else os.O_NOFOLLOW))
    except OSError as exc:
        raise BadInput(f"cannot read ({exc.strerror or exc})", path) from exc
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(2)
        if not (decompress and head == GZIP_MAGIC):
            if st.st_size > limit:
                raise BadInput(_too_big(st.st_size, limit), path)
            try:
                fh.seek(0)  # one read, no `head + rest` copy: a 100 MB trace must not briefly take 200 MB
                data = fh.read(limit + 1)
            except OSError as exc:
                raise BadInput(f"cannot read ({exc.strerror or exc})", path) from exc
            if len(data) > limit:  # a file that grew, or one whose stat size lies (/proc)
                raise BadInput(_too_big(None, limit), path)
            return data
        return _gunzip_stream(fh, head, path, limit)


def _gunzip_stream(fh, head: bytes, path: Path, limit: int) -> bytearray:  # type: ignore[no-untyped-def]
    out = bytearray()
    consumed = 0
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = head
    while True:
        if not data:
            data = fh.read(_CHUNK)
            if not data:
                break
        try:
            out += d.decompress(data, min(limit + 1 - len(out), 16 * _CHUNK))
        except zlib.error as exc:
            raise BadInput(f"gzip data is corrupt near byte {consumed} ({exc})", path) from exc
        consumed += len(data) - len(d.unconsumed_tail)
        data = d.unconsumed_tail
        if len(out) > limit:
            raise BadInput(_too_big(None, limit) + " once decompressed", path)
        if len(out) > GZIP_FREE_BYTES and len(out) > GZIP_MAX_RATIO * consumed:
            raise BadInput(f"gzip data expands more than {GZIP_MAX_RATIO}x ({consumed} bytes to over "
                           f"{len(out) >> 20} MiB): a gzip bomb? refused", path)
        if d.eof:
            rest = d.unused_data + data
            if not rest.startswith(GZIP_MAGIC):  # concatenated gzip members are legal; trailing junk is ignored
                break
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = rest
    if not d.eof:
        raise BadInput(f"gzip data is truncated at byte {consumed}", path)
    return out


def gunzip_open(fh, path: Path, limit: int | None = None) -> bytearray:  # type: ignore[no-untyped-def]
    """An open gzip file (read from its start) decompressed with the same cap and errors as ``read_buffer``."""
    fh.seek(0)
    return _gunzip_stream(fh, fh.read(2), path, max_input_bytes() if limit is None else limit)


def gunzip_bytes(data: bytes, limit: int, name: str = "<stdin>") -> bytes:
    """gzip data already in memory (stdin) decompressed with the same cap and errors as ``read_bytes``."""
    import io

    return bytes(_gunzip_stream(io.BytesIO(data[2:]), data[:2], Path(name), limit))


def _too_big(size: int | None, limit: int) -> str:
    shown = f"{size / (1 << 20):.0f} MiB " if size is not None else ""
    return (f"input {shown}exceeds the {limit / (1 << 20):.0f} MiB limit "
            "(raise it with --max-input-mb or DDPDOCTOR_MAX_INPUT_MB)")


def read_text(path: Path, limit: int | None = None) -> str:
    """A regular (optionally gzipped) text file, bounded, invalid UTF-8 replaced."""
    return read_bytes(path, limit).decode("utf-8", "replace")


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def json_depth_ok(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> int | None:
    """None when JSON nesting stays within ``max_depth``; else the byte offset where it first goes deeper.

    At C speed for real traces (hundreds of MB): escapes are removed (``\\\\`` first, then ``\\"``, which is
    how JSON reads them left to right), everything but quotes and brackets is deleted by bytes.translate, and
    numpy finds the brackets outside strings and sums them. Only a file that does go too deep is then walked
    byte by byte, to name the offset (it stops there)."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return None
    import numpy as np

    marks = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    a = np.frombuffer(marks, dtype=np.uint8)
    outside = (np.cumsum(a == 0x22) & 1) == 0
    step = (((a == 0x5B) | (a == 0x7B)) & outside).astype(np.int8) - (((a == 0x5D) | (a == 0x7D)) & outside)
    if not len(step) or int(np.cumsum(step, dtype=np.int64).max()) <= max_depth:
        return None
    return _first_too_deep(data, max_depth)


def _first_too_deep(data: bytes, max_depth: int) -> int:
    depth = 0
    in_str = False
    escape = False
    for i, ch in enumerate(data):
        if in_str:
            if escape:
                escape = False
            elif ch == 0x5C:  # backslash
                escape = True
            elif ch == 0x22:
                in_str = False
        elif ch == 0x22:
            in_str = True
        elif ch in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                return i
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return len(data)  # only unbalanced strings get here: call it too deep at the end


def clean_data(value: Any, depth: int = 0) -> Any:
    """``clean_text`` applied to every string (keys too) of JSON-like data; deeper than 64 levels is left as is."""
    if isinstance(value, str):
        return clean_text(value)
    if depth > 64:
        return value
    if isinstance(value, dict):
        return {clean_data(k, depth + 1): clean_data(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_data(v, depth + 1) for v in value]
    return value


# JSON in and out. Python's json reads NaN/Infinity (and 1e999 as inf) and writes them back: neither is JSON, and
# a strict reader of our --json output (jq, serde, JSON.parse) fails on them. A lone surrogate ("\ud800") decodes
# to a str that cannot be encoded (a traceback when printed or written). So does a surrogate written as raw bytes
# (ED A0 80 .. ED BF BF, invalid UTF-8 that json.loads decodes with "surrogatepass", and what a str read with
# "surrogateescape" encodes to). Both are fixed once, here.
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _int_or_none(text: str) -> int | None:
    """An integer of JSON; null past 4,000 digits (Python refuses to convert those: a ValueError out of json.loads
    that readers took for a decoding error, or not at all)."""
    return int(text) if len(text) <= MAX_INT_DIGITS else None


def loads_json(data: bytes | str, finite: bool = True) -> Any:
    """``json.loads`` where a lone surrogate is U+FFFD, an integer of more than 4,000 digits is null and
    (``finite``) NaN, Infinity and numbers past the float range are null. Raises what json.loads raises
    (ValueError)."""
    value = (json.loads(data, parse_constant=lambda _c: None, parse_float=_finite_or_none, parse_int=_int_or_none)
             if finite else json.loads(data, parse_int=_int_or_none))
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _SURROGATE_ESCAPE.search(raw):
        value = _fix_surrogates(value)
    return value


def _fix_text(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:  # pairs become their character; a lone surrogate becomes U+FFFD
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _fix_surrogates(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _fix_text(value)
    if depth > 2 * MAX_JSON_DEPTH:
        return value
    if isinstance(value, dict):
        return {_fix_text(k) if isinstance(k, str) else k: _fix_surrogates(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_fix_surrogates(v, depth + 1) for v in value]
    return value


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` with every NaN/Infinity as None and every string encodable as UTF-8 (lone surrogates U+FFFD)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _fix_text(value)
    if depth > 2 * MAX_JSON_DEPTH:
        return None
    if isinstance(value, dict):
        return {json_safe(k, depth + 1) if isinstance(k, str) else k: json_safe(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, depth + 1) for v in value]
    return value


def dumps_json(value: Any, **kwargs: Any) -> str:
    """JSON text that any strict reader accepts (what every --json prints): no NaN/Infinity (null instead), no
    lone surrogate. The fast path is plain json.dumps; only data that holds one of them is walked.

    indent=2 (every --json) is written compact by json's C encoder and then indented by msgspec's formatter, which
    only moves whitespace: the same text, byte for byte, as json.dumps(indent=2), whose pure-Python encoder took
    0.08 CPU s of the 1 s `analyze --json` spends on a 110 MB trace (a 3 MB report)."""
    kwargs.setdefault("default", str)
    indent = kwargs.pop("indent") if kwargs.get("indent") == 2 and "separators" not in kwargs else None
    try:
        text = json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        text = json.dumps(json_safe(value), allow_nan=False, **kwargs)
    else:
        if "\\ud" in text or "\\uD" in text:
            text = json.dumps(json_safe(value), allow_nan=False, **kwargs)
    if indent is None:
        return text
    import msgspec  # a dependency; imported here so that modules reading files only do not pay for it

    return msgspec.json.format(text, indent=indent)


JSON_BATCH = 2_000  # elements of a long list encoded at once by iter_json


def iter_json(value: Any, level: int = 0) -> Iterator[str]:
    """dumps_json(value, indent=2) in pieces, the same text byte for byte once joined: a report's long lists (one
    entry per step or per collective: 300 MB of text for 200,000 steps) are encoded JSON_BATCH elements at a time,
    so neither the whole text nor its indented copy is ever held (issue 40). Small values are encoded whole."""
    pad = "  " * level
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and _long(value):
        yield "{\n"
        for i, (k, v) in enumerate(value.items()):
            yield f",\n{pad}  " if i else f"{pad}  "
            yield dumps_json(k) + ": "
            yield from iter_json(v, level + 1)
        yield f"\n{pad}}}"
    elif isinstance(value, list) and value and _long(value):
        yield "[\n"
        i, first = 0, True
        # The elements of a long list are taken as short (a step's or a call's entry): one check per element of a
        # report's 200,000-entry lists would cost more than encoding them.
        check = len(value) <= JSON_BATCH
        while i < len(value):
            sep = "" if first else ",\n"
            first = False
            if check and _long(value[i]):
                yield f"{sep}{pad}  "
                yield from iter_json(value[i], level + 1)
                i += 1
                continue
            j = i + 1
            while j < len(value) and j - i < JSON_BATCH and not (check and _long(value[j])):
                j += 1
            # "[\n  a,\n  b\n]" less its brackets: the elements one level in, then moved to this level
            inner = dumps_json(value[i:j], indent=2)[2:-2]
            yield sep + pad + (inner.replace("\n", "\n" + pad) if pad else inner)
            i = j
        yield f"\n{pad}]"
    else:
        text = dumps_json(value, indent=2)
        yield text.replace("\n", "\n" + pad) if pad else text


def _long(value: Any, depth: int = 3) -> bool:
    """Whether ``value`` is, or holds within ``depth`` levels, a list longer than JSON_BATCH."""
    if isinstance(value, list):
        if len(value) > JSON_BATCH:
            return True
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return False
    return depth > 0 and any(_long(v, depth - 1) for v in items if isinstance(v, list | dict))


# -- writing ---------------------------------------------------------------------------------------------------
def temp_name(path: Path) -> Path:
    """A temporary name beside ``path`` nobody can predict (128 random bits): another user who may create names in
    that folder cannot plant a link there beforehand for ddpdoctor to write through."""
    return path.with_name(f".{path.name[:200]}.{secrets.token_hex(16)}.tmp")


@contextlib.contextmanager
def atomic_file(path: Path, mode: int = 0o600) -> Iterator[IO[bytes]]:
    """Every file ddpdoctor writes: a new file under an unpredictable name beside ``path``, created with
    O_EXCL|O_NOFOLLOW (never through a link, never an existing file) and mode ``mode`` (0600 by default), then
    renamed over ``path`` once complete (a crash or a full disk leaves the old file or none, never half of one; the
    rename replaces a link at ``path`` itself, never its target). Removed on any failure. Raises OSError."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(path: Path, data: bytes | str, mode: int = 0o600) -> None:
    """``data`` into ``path`` through atomic_file (text as UTF-8). Raises OSError."""
    with atomic_file(path, mode) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
