"""Untrusted input to `logs` and `topo`: bounded reads (FIFO, /dev/zero, gzip bomb, inf in XML), the Flight
Recorder reference bomb, and escape sequences kept off the terminal (issues 12.2, 13.5, 13.6)."""

from __future__ import annotations

import gzip
import os
import pickle
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.commands.logs import command as logs_command
from ddpdoctor.commands.topo import command as topo_command
from ddpdoctor.errors import BadInput
from ddpdoctor.logs.flight_recorder import loads_pickle
from tests.conftest import run_cli

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _run(command, *args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(command, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _one_line_exit_2(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in out + err


def test_reference_bomb_pickle_is_refused_within_a_second() -> None:
    shared: list = []
    for _ in range(60):
        shared = [shared, shared]  # 404 bytes of pickle, 2^60 objects once expanded
    data = pickle.dumps({"version": "2.4", "entries": shared}, protocol=4)
    assert len(data) < 500
    start = time.monotonic()
    with pytest.raises(BadInput, match="shared references"):
        loads_pickle(data)
    assert time.monotonic() - start < 1.0


def test_self_holding_pickle_and_real_dump() -> None:
    loop: list = []
    loop.append(loop)
    with pytest.raises(BadInput, match="holds itself"):
        loads_pickle(pickle.dumps({"version": "2.4", "entries": loop}))
    assert len(loads_pickle((FIX / "logs" / "fr_rank0.pkl").read_bytes())["entries"]) > 0


def test_bomb_pickle_through_the_cli(tmp_path: Path) -> None:
    shared: list = []
    for _ in range(60):
        shared = [shared, shared]
    bomb = tmp_path / "fr_rank0.pkl"
    bomb.write_bytes(pickle.dumps({"version": "2.4", "entries": shared}, protocol=4))
    _one_line_exit_2(*_run(logs_command, bomb), "shared references")


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.log.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        chunk = b"\0" * (1 << 20)
        for _ in range(24):  # 24 MiB of zeros in 24 KiB: past the 16 MiB cap the test sets
            fh.write(chunk)
    return path


@pytest.mark.parametrize("cmd", ["logs", "topo", "topo-xml"])
def test_fifo_dev_zero_and_gzip_bomb_are_one_line_exit_2(tmp_path: Path, cmd: str, bomb: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPDOCTOR_MAX_INPUT_MB", "16")  # the same cap logic as the defaults (512 MiB, 1 GiB)
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    command = logs_command if cmd == "logs" else topo_command
    for path, needle in ((fifo, "FIFO"), (Path("/dev/zero"), "device"), (bomb, "limit")):
        args = ["--topo-xml", path] if cmd == "topo-xml" else [path]
        _one_line_exit_2(*_run(command, *args), needle)


def test_topology_xml_with_inf_attribute(tmp_path: Path) -> None:
    xml = tmp_path / "topo.xml"
    xml.write_text('<system version="1"><cpu numaid="inf" affinity="ff"><pci busid="0000:07:00.0" '
                   'link_width="inf" link_speed="16 GT/s"><gpu dev="inf" sm="1e999" rank="nan"/></pci></cpu>'
                   '</system>')
    code, out, err = _run(topo_command, "--topo-xml", xml)
    assert code in (0, 1) and "Traceback" not in out + err


def test_escape_sequences_never_reach_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    log.write_text("Traceback (most recent call last):\n"
                   '  File "/job/train.py", line 3, in <module>\n'
                   "ValueError: bad \x1b]0;pwned\x07 value \x1b[2J\x1b[H\x07 end\n")
    code, out, err = _run(logs_command, log, "--json")
    assert "\x1b" not in out + err and "\x07" not in out + err
    proc = run_cli("logs", str(log))  # the console renderer, as a user's terminal gets it
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 1 and "bad" in out
    assert "\x1b]0;" not in out + err and "\x1b[2J" not in out + err and "\x07" not in out + err
    nccl = tmp_path / "nccl.log"
    nccl.write_text("node1:12:12 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
                    "node1:12:12 [0] NCCL INFO Bootstrap : Using eth0\x1b]0;title\x07:10.0.0.1<0>\n"
                    "node1:12:12 [0] NCCL WARN \x1b[2Jscreen cleared\n")
    code, out, err = _run(topo_command, nccl, "--verbose", "--json")
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "screen cleared" in out
