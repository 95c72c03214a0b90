"""Issue 40 item 4: every file ddpdoctor writes goes through one temporary name nobody can predict, created
O_EXCL|O_NOFOLLOW 0600, then renamed into place; links planted beside the target (for the names the writers used
to pick: `.NAME.PID.tmp`, `.NAME.tmp`, for a range of pids) are never written through."""

from __future__ import annotations

import gzip
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpdoctor import safe_io
from ddpdoctor.renderers.html import write_page
from ddpdoctor.renderers.merge import merge_traces
from ddpdoctor.rundir.artefacts import write_json, write_private_text


def _plant(folder: Path, name: str, victim: Path) -> list[Path]:
    """Links to ``victim`` under every name an older writer of ``name`` would have picked, around this pid."""
    me = os.getpid()
    names = [f".{name}.tmp", f".{name}.relay"] + [f".{name}.{p}.tmp" for p in range(me - 50, me + 50)] \
        + [f".{name}.{p}" for p in range(me - 50, me + 50)]
    links = []
    for n in names:
        (folder / n).symlink_to(victim)
        links.append(folder / n)
    return links


def _trace(path: Path) -> Path:
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 2.0}]}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


WRITERS: dict[str, Callable[[Path], object]] = {
    "report.html": lambda p: write_page("<html>report</html>", p),
    "merged.json.gz": lambda p: merge_traces([_trace(p.parent.parent / "t.pt.trace.json.gz")], p),
    "report.json": lambda p: write_json(p, {"findings": []}),
    "hang.txt": lambda p: write_private_text(p, "stacks"),
    "notes.bin": lambda p: safe_io.write_atomic(p, b"x"),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_planted_links_beside_the_target_are_never_written_through(tmp_path: Path, name: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "root-only"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o600)
    links = _plant(shared, name, victim)
    WRITERS[name](shared / name)
    assert victim.read_bytes() == b"precious"
    out = shared / name
    assert out.is_file() and not out.is_symlink() and stat.S_IMODE(out.stat().st_mode) == 0o600
    left = {p.name for p in shared.iterdir()} - {p.name for p in links} - {name}
    assert not left, left  # no temporary file left behind


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "root-only"
    victim.write_bytes(b"precious")
    (tmp_path / "report.html").symlink_to(victim)
    write_page("<html/>", tmp_path / "report.html")
    assert victim.read_bytes() == b"precious" and not (tmp_path / "report.html").is_symlink()


def test_temporary_names_are_unpredictable(tmp_path: Path) -> None:
    names = {safe_io.temp_name(tmp_path / "x").name for _ in range(100)}
    assert len(names) == 100


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), safe_io.atomic_file(tmp_path / "f") as fh:
        fh.write(b"half")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_what_libraries_write_with_the_users_umask_is_made_private(tmp_path: Path) -> None:
    # Issue 40 item 9: report.html, traces and scalars were 0644 where docs/trust.md says 0600.
    from ddpdoctor.renderers.tensorboard_tune import write_tune_scalars
    from ddpdoctor.rundir.private import make_private_tree

    old = os.umask(0o022)
    try:
        traces = tmp_path / "traces"
        traces.mkdir()
        (traces / "rank0.pt.trace.json").write_text("{}")
        victim = tmp_path / "theirs"
        victim.write_text("x")
        os.chmod(victim, 0o644)
        (traces / "link").symlink_to(victim)
        make_private_tree(traces)
        assert stat.S_IMODE((traces / "rank0.pt.trace.json").stat().st_mode) == 0o600
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644  # never through a link

        class _Trial:
            order, label, step_ms = 0, "baseline", [1.0, 2.0]

        (logdir,) = write_tune_scalars([_Trial()], tmp_path / "scalars")  # type: ignore[list-item]
        files = [p for p in logdir.rglob("*") if p.is_file()]
        assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
        write_page("<html/>", tmp_path / "report.html")
        assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_kinetos_usdt_lines_stay_in_the_rank_logs() -> None:
    # Issue 40 item 9: "USDT: ... profiler_start/stop" reached the user's console under profile and tune.
    from ddpdoctor.launch.rank_io import is_rank_line

    for line in (b"[default0]:USDT:2026-11-25 13:20:53 6118:6118 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
                 b"[default1]:USDT:2026-11-25 13:20:54 6118:6118 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"):
        assert not is_rank_line(line)
    assert is_rank_line(b"[default0]:epoch 1 loss 0.3\n") and is_rank_line(b"[default0]:USDT is a word I print\n")


def test_a_trace_is_made_private_where_the_rank_writes_it(tmp_path: Path, monkeypatch) -> None:
    # Issue 40 item 9: the launcher's final chmod of traces/ runs on the head node only; a non-head node's traces
    # kept Kineto's 0644. The rank's own trace handler makes each trace it wrote 0600, on every node.
    import torch

    from ddpdoctor.probes.profiler import ProfilerProbe

    def handler(trace_dir: str, worker_name: str, use_gzip: bool):  # type: ignore[no-untyped-def]
        return lambda _prof: (Path(trace_dir) / f"{worker_name}.1.pt.trace.json.gz").write_bytes(b"x")

    monkeypatch.setattr(torch.profiler, "tensorboard_trace_handler", handler)
    probe = object.__new__(ProfilerProbe)
    probe.trace_dir, probe.rank, probe.written = tmp_path / "traces", 3, []
    old = os.umask(0o022)
    try:
        probe._trace_ready(None)
    finally:
        os.umask(old)
    (trace,) = probe.written
    assert trace.name == "rank3.1.pt.trace.json.gz" and stat.S_IMODE(trace.stat().st_mode) == 0o600
