"""One big GPU trace read on several cores: its traceEvents array cut into byte ranges at event boundaries, each range
read, decoded and reduced to columns (scan.Part) by its own process; only the columns come back, pickled through a
pipe.

Where the bytes come from (a Source): an uncompressed file is read range by range, each reading child mapping its
own range copy-on-write (the reads run in parallel, and no process holds the whole file); a compressed one is
decompressed first and its buffer shared with forked children. Only the file's head and tail (its metadata) and a
window at each cut are read (pread) by the process that plans the cut.

The cut is checked, not trusted: a range decodes as a list of events only when it starts and ends where the one-pass
parse would be between two events (a cut inside a string or a nested array leaves a range that is not a whole JSON
array), and the file's other fields are decoded from its head and tail around an empty array. Anything else (a
damaged file, a CPU trace, a cut that fails, a file that changed while it was read) is read by the one-pass path,
which gives the same columns or the same error.

`prefetch` starts the reading processes for a trace named on the command line before the analyses are imported
(numpy alone takes as long to import as a core takes to decode 40 MB); `load_trace` collects them."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import pickle
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput
from ddpdoctor.traces.loader import (
    _DOC,
    DECODE_ERRORS,
    RawTrace,
    TraceDoc,
    no_gc,
    raw_from_bytes,
    read_buffer,
)
from ddpdoctor.traces.ranges import (  # noqa: F401 - re-exported: split's names before the move
    _BETWEEN,
    _KEY,
    _MAX_EDGE,
    _OVERLAP,
    _WINDOW,
    Buffer,
    BufferSource,
    Cut,
    FileChanged,
    FileSource,
    Source,
    _boundary,
    _changed,
    _edges,
    _source,
    _tagged_or_any,
    cut,
    cut_at,
    decode_range,
)
from ddpdoctor.traces.scan import Part, scan

if TYPE_CHECKING:
    from ddpdoctor.traces.trace import (
        Trace,  # numpy: imported where a Trace is made, not by a reading process
    )

MIN_SPLIT_BYTES = 32 << 20  # below this, forking and pickling cost more than a core saves
def _reduce(src: Source, start: int, end: int, path: str) -> Part | None:
    """One range's columns as a GPU trace's (they do not depend on the thread names: only a CPU trace's gloo
    threads do); None where the range does not decode, holds a damaged event, or the file changed."""
    gc.disable()  # a child's own: nothing it builds is in a cycle, and it exits when done
    try:
        return scan(src.events(start, end), True, set(), path)
    except (*DECODE_ERRORS, BadInput, FileChanged, OSError, ValueError):  # ValueError: a map past a shrunk end
        return None


Child = tuple[int, int]  # (pid, read end of its pipe)
T = TypeVar("T")


def _spawn(fn: Callable[..., object], jobs: list[tuple]) -> list[Child]:  # type: ignore[type-arg]
    """fn(*job) for each job in a forked child (which sees the parent's memory: a buffer is not copied)."""
    children: list[Child] = []
    try:
        for job in jobs:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
                code = 1
                try:
                    faulthandler.disable()  # a child killed by SIGBUS (a map of a truncated file) dies quietly
                    os.close(r)
                    blob = pickle.dumps(fn(*job), protocol=pickle.HIGHEST_PROTOCOL)
                    with os.fdopen(w, "wb") as fh:
                        fh.write(blob)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
    except BaseException:
        _reap(children)
        raise
    return children


def _gather(children: list[Child], kind: type[T]) -> list[T | None]:
    """Each child's answer, in order (None for one that died or sent something else); every child reaped, even
    when this fails."""
    out: list[T | None] = []
    try:
        for i, (_, r) in enumerate(children):
            with os.fdopen(r, "rb") as fh:
                children[i] = (children[i][0], -1)  # closed by the `with`, whatever happens
                blob = fh.read()
            answer = pickle.loads(blob) if blob else None
            out.append(answer if isinstance(answer, kind) else None)
        return out
    finally:
        _reap(children)


def _reap(children: list[Child]) -> None:
    for _, r in children:  # a child blocked on a full pipe gets EPIPE and exits
        if r >= 0:
            with contextlib.suppress(OSError):
                os.close(r)
    for pid, _ in children:
        with contextlib.suppress(ChildProcessError):  # reaped already (a caller's SIGCHLD handler)
            os.waitpid(pid, 0)


def _fork_map(fn: Callable[..., Part | None], jobs: list[tuple]) -> list[Part | None]:  # type: ignore[type-arg]
    """fn(*job) for every job, the first in this process and each other in a forked child."""
    children = _spawn(fn, jobs[1:])
    try:
        first = fn(*jobs[0])
    except BaseException:
        _reap(children)
        raise
    return [first, *_gather(children, Part)]


def _has_devices(doc: TraceDoc) -> bool:
    """The profiler recorded GPU devices (Kineto writes deviceProperties for each): a trace of GPU kernels, whose
    ranges are reduced alone. A CPU trace's ranges would not be (its gloo threads are named anywhere in the file),
    and learning that from the workers would cost a second read."""
    try:
        devices = msgspec.json.decode(doc.deviceProperties)
    except DECODE_ERRORS:
        return False
    return isinstance(devices, list) and bool(devices)


def _plan(src: Source, workers: int) -> Cut | None:
    c = cut(src, workers)
    return c if c is not None and len(c.ranges) >= 2 and _has_devices(c.doc) else None


def split_trace(data: Buffer, path: Path, workers: int, fallback_rank: int | None = None) -> Trace | None:
    """The trace in memory read by ``workers`` processes, or None where the one-pass reader must read it."""
    src = BufferSource(data)
    c = _plan(src, workers)
    return reduce_cut(src, path, c, fallback_rank) if c is not None else None


def reduce_cut(data: Buffer | Source, path: Path, c: Cut, fallback_rank: int | None = None) -> Trace | None:
    """The trace from its ranges, one process each; None where a range does not decode as a run of events."""
    src = _source(data)
    jobs = [(src, s, e, str(path)) for s, e in c.ranges]
    # A file's ranges are mapped, each by a forked child (never by this process: see FileSource.events); a buffer's
    # first range is reduced here.
    answers = _gather(_spawn(_reduce, jobs), Part) if isinstance(src, FileSource) else _fork_map(_reduce, jobs)
    return _joined(answers, path, c, fallback_rank)


def _joined(answers: list[Part | None], path: Path, c: Cut, fallback_rank: int | None) -> Trace | None:
    from ddpdoctor.traces.trace import join_parts  # numpy: not needed by a reading process

    parts = [a for a in answers if a is not None]
    if len(parts) < len(c.ranges):
        return None  # undecodable, or a damaged event: the one-pass reader names the first problem, as always
    if not any(p.has_kernels for p in parts) or not sum(p.n_events for p in parts):
        return None  # a CPU trace (its gloo threads need the whole trace), or no events at all
    doc = c.doc
    return join_parts(RawTrace(str(path), [], doc.distributedInfo, doc.host_name), parts, True, fallback_rank)


@contextlib.contextmanager
def _open_big(path: Path, min_bytes: int | None = None) -> Iterator[FileSource | None]:
    """A big uncompressed trace file (``min_bytes`` or more, MIN_SPLIT_BYTES by default), open for reading by
    offset; None for a small, compressed or oversized one (read whole by read_buffer, which names what is wrong
    with it)."""
    st = safe_io.check_regular(path)
    if st.st_size < (MIN_SPLIT_BYTES if min_bytes is None else min_bytes) or st.st_size > safe_io.max_input_bytes() or path.suffix == ".gz":
        yield None  # a ".gz" is read_buffer's to check (named .gz but not gzip is bad input)
        return
    try:
        fd, now = _open_as(path, st)
    except (FileChanged, OSError):
        yield None
        return
    try:
        yield FileSource(fd, now) if os.pread(fd, 2, 0) != safe_io.GZIP_MAGIC else None
    finally:
        os.close(fd)


def _open_as(path: Path, st: os.stat_result) -> tuple[int, os.stat_result]:
    """The path opened for reading (never blocking on a FIFO), with what fstat says of it; FileChanged when it is
    not the regular file ``st`` described (replaced between the stat and the open)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise FileChanged
    return fd, now


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a SLURM or container allotment), not the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parallel() -> bool:
    return sys.platform.startswith("linux")  # macOS system libraries are not fork-safe


def load_trace(path: Path, fallback_rank: int | None = None, workers: int = 1) -> Trace:
    """One trace file as a Trace; a big GPU trace on up to ``workers`` cores (forked workers, on Linux): its ranges
    read and decoded in parallel (one started by `prefetch` is collected)."""
    from ddpdoctor.traces.chunks import MIN_CHUNKED_BYTES, read_buffer_chunked, read_chunked
    from ddpdoctor.traces.trace import build_trace

    path = Path(path)
    with no_gc():
        fid = _file_id(path) if _PREFETCHED else None  # (no stat per file of a 1,024-rank job)
        pending = _PREFETCHED.pop(fid, None) if fid is not None else None
        if pending is not None and (trace := pending.collect(path, fallback_rank)) is not None:
            return trace
        parallel = workers > 1 and _parallel()
        planned = False
        with _open_big(path, min(MIN_SPLIT_BYTES, MIN_CHUNKED_BYTES) if parallel else MIN_CHUNKED_BYTES) as src:
            if src is not None:
                with contextlib.suppress(FileChanged, OSError):
                    c = _plan(src, workers) if parallel and src.size >= MIN_SPLIT_BYTES else None
                    if c is not None and (trace := reduce_cut(src, path, c, fallback_rank)):
                        return trace
                    planned = c is not None
                    # Not a GPU trace to split among the cores: read a range at a time (traces/chunks.py).
                    if not planned and (trace := read_chunked(src, path, fallback_rank)):
                        return trace
        data = read_buffer(path)  # small or compressed (decompressed), or not split: read whole
        if src is None:  # (a file whose ranges were planned or read and failed is not cut again)
            if parallel and len(data) >= MIN_SPLIT_BYTES and (trace := split_trace(data, path, workers,
                                                                                   fallback_rank)):
                return trace
            if (trace := read_buffer_chunked(data, path, fallback_rank)) is not None:
                return trace
        return build_trace(raw_from_bytes(data, path), fallback_rank)  # the same bytes, not a second read


@dataclass
class Reduced:
    """A compressed trace reduced by its reading child: the parts of its ranges and its cut."""

    parts: list[Part]
    cut: Cut


@dataclass
class Pending:
    """A trace being read by child processes (prefetch): one child per range of an uncompressed file (``cut`` known),
    or one child that decompresses a compressed file and reduces its ranges (``cut`` None: it comes back with the
    parts). The file stays open until collected."""

    fd: int
    st: os.stat_result  # the file when it was opened
    cut: Cut | None
    children: list[Child]

    def collect(self, path: Path, fallback_rank: int | None) -> Trace | None:
        """The trace, when the path still names the file that was opened, unchanged, and every range decoded."""
        try:
            named = os.stat(path)
            if (named.st_dev, named.st_ino) != (self.st.st_dev, self.st.st_ino) or _changed(self.fd, self.st):
                self.discard()
                return None
            if self.cut is not None:
                return _joined(_gather(self.children, Part), path, self.cut, fallback_rank)
            [reduced] = _gather(self.children, Reduced)
            return _joined(list(reduced.parts), path, reduced.cut, fallback_rank) if reduced else None
        except OSError:
            self.discard()
            return None
        finally:
            self.children = []
            self._close()

    def discard(self) -> None:
        _reap(self.children)
        self.children = []
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_PREFETCHED: dict[tuple[int, int], Pending] = {}  # (device, inode) of the file -> its reading processes


def _file_id(path: Path) -> tuple[int, int] | None:
    """What a prefetched file is known by: the same file named by another path (relative, through a link) is found,
    and a path that names another file by now is not."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def prefetch(paths: list[Path], workers: int) -> Iterator[None]:
    """When ``paths`` is one big GPU trace file, start reading it on ``workers`` cores now, while the caller imports
    and prepares; `load_trace` of that path collects it. Whatever is not collected is discarded on exit. Anything
    else is left alone and read as usual: several files are read one per process (analyses/pipeline.py), and
    starting them all at once would hold every rank's events at the same time."""
    try:
        if len(paths) == 1 and workers > 1 and _parallel():
            with contextlib.suppress(BadInput, FileChanged, OSError, ValueError):
                _start(Path(paths[0]), workers)
        yield
    finally:
        for key in list(_PREFETCHED):
            _PREFETCHED.pop(key).discard()


def _start(path: Path, workers: int) -> None:
    if not path.is_file() or _file_id(path) in _PREFETCHED:
        return
    with _open_big(path) as src:
        if src is not None:
            if (c := _plan(src, workers)) is not None:
                fd = os.dup(src.fd)  # kept open (for the children, and to check the path names it) until collected
                _register(fd, src.st, c, _reduce, [(FileSource(fd, src.st), s, e, str(path)) for s, e in c.ranges])
            return
    st = safe_io.check_regular(path)
    if fd := _open_gpu_gzip(path, st):
        _register(fd, st, None, _reduce_gzip, [(fd, st, path, workers)])


def _register(fd: int, st: os.stat_result, cut: Cut | None, fn: Callable[..., object],
              jobs: list[tuple]) -> None:  # type: ignore[type-arg]
    try:
        _PREFETCHED[(st.st_dev, st.st_ino)] = Pending(fd, st, cut, _spawn(fn, jobs))
    except BaseException:
        os.close(fd)
        raise


_GZ_HEAD_IN = 1 << 16  # compressed bytes read at a time to find the head


def _open_gpu_gzip(path: Path, st: os.stat_result) -> int:
    """An open file descriptor of a gzip file whose trace is big (the size its trailer gives, modulo 4 GiB) and
    records GPU devices in its head; 0 for anything else."""
    if st.st_size < 64:
        return 0
    try:
        fd, now = _open_as(path, st)
    except (FileChanged, OSError):
        return 0
    try:
        if os.pread(fd, 2, 0) != safe_io.GZIP_MAGIC:
            raise FileChanged
        if int.from_bytes(os.pread(fd, 4, now.st_size - 4), "little") < MIN_SPLIT_BYTES:
            raise FileChanged  # small once decompressed: read whole, as usual
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        head, at = bytearray(), 0
        while len(head) < _MAX_EDGE and not d.eof:
            chunk = d.unconsumed_tail or os.pread(fd, _GZ_HEAD_IN, at)
            if not d.unconsumed_tail:
                at += len(chunk)
            if not chunk:
                break
            head += d.decompress(chunk, _MAX_EDGE - len(head))
        m = _KEY.search(head)
        if m is None or not _has_devices(_DOC.decode(bytes(head[:m.end() - 1]) + b"[]}")):
            raise FileChanged  # not a GPU trace (or not the usual shape): read as usual
        return fd
    except (FileChanged, OSError, zlib.error, *DECODE_ERRORS):
        os.close(fd)
        return 0


def _reduce_gzip(fd: int, st: os.stat_result, path: Path, workers: int) -> Reduced | None:
    """In a reading child: the compressed file decompressed (bounded, as read_buffer does), cut, and its ranges
    reduced by this process and forked grandchildren; None where the one-pass reader must read it."""
    gc.disable()
    try:
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = safe_io.gunzip_open(fh, path)
        if _changed(fd, st) or len(data) < MIN_SPLIT_BYTES:
            return None
        src = BufferSource(data)
        c = _plan(src, workers)
        if c is None:
            return None
        parts = _fork_map(_reduce, [(src, s, e, str(path)) for s, e in c.ranges])
        return Reduced([p for p in parts if p is not None], c) if all(parts) else None
    except (BadInput, OSError, *DECODE_ERRORS):
        return None
