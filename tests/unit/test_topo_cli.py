"""`ddpdoctor topo` as a user runs it: exit codes, --json sections, one-line errors for bad input."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.commands.topo import command

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(command, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_json_report_sections_and_exit_code_1_on_errors() -> None:
    code, out, _ = _invoke(FIX / "slurm_ib_nodevice_socket_fallback.log", "--json")
    assert code == 1
    data = json.loads(out)
    assert data["command"] == "topo" and data["status"] == "error"
    assert {"summary", "hosts", "ranks", "topology", "findings"} <= set(data)
    assert data["findings"][0]["id"] in {"net-socket-internode", "net-device-missing"}
    assert all(f["evidence"].get("lines") for f in data["findings"])


def test_healthy_log_exits_0_and_prints_summary() -> None:
    code, out, _ = _invoke(FIX / "torchrun_2node_ib_gdr.log")
    assert code == 0
    assert "2 node(s) x 2 GPU(s)" in out and "GPUDirect RDMA: yes" in out and "No findings" in out


def test_log_plus_topology_xml_option() -> None:
    code, out, _ = _invoke(FIX / "h100_forced_nvls_few_channels.log", "--topo-xml",
                           FIX / "topo_numa_mismatch_gdr_off.xml", "--json")
    data = json.loads(out)
    assert code == 0  # warnings only; --fail-on error is the default
    assert data["topology"][0]["file"].endswith("topo_numa_mismatch_gdr_off.xml")
    assert "nic-numa-mismatch" in {f["id"] for f in data["findings"]}


def test_fail_on_warning() -> None:
    code, _, _ = _invoke(FIX / "h100_forced_nvls_few_channels.log", "--fail-on", "warning")
    assert code == 1


@pytest.mark.parametrize("content,problem", [
    (b"", "empty file"),
    (b"\x00\x01\x02binary\xff\xfe" * 100, "binary data"),
    (b"epoch 1 loss 0.5\nepoch 2 loss 0.4\n", "no NCCL lines"),
    (b"<html><body>not a topology</body></html>\n", "no NCCL lines"),
    (b"\x1f\x8b\x08\x00garbage", "gzip data is"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "input.log"
    path.write_bytes(content)
    code, out, err = _invoke(path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(path) in err and problem in err


def test_missing_file_and_no_args() -> None:
    code, _, err = _invoke("/nonexistent/slurm-1.out")
    assert code == 2 and "/nonexistent/slurm-1.out: file not found" in err
    code, _, err = _invoke()
    assert code == 2 and "give at least one" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.log"
    path.write_text("h:1:1 [0] NCCL INFO Using network IB\n")
    path.chmod(0)
    code, _, err = _invoke(path)
    assert code == 2 and "cannot read" in err


def test_some_files_usable_gives_warning_plus_analysis(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    code, out, err = _invoke(empty, FIX / "not_distributed.log", "--json")
    assert code == 1
    assert f"warning: skipped {empty}: empty file" in err
    data = json.loads(out)
    assert data["notes"] == [f"skipped {empty}: empty file"]
    assert data["findings"][0]["id"] == "not-distributed"


def test_gzipped_log_and_xml_detected_by_content(tmp_path: Path) -> None:
    gz = tmp_path / "log.gz"
    gz.write_bytes(gzip.compress((FIX / "torchrun_2node_ib_gdr.log").read_bytes()))
    xml = tmp_path / "dump.txt"
    xml.write_text((FIX / "graph_dump.xml").read_text())
    code, out, _ = _invoke(gz, xml, "--json")
    data = json.loads(out)
    assert code == 0 and data["summary"]["nodes"] == 2 and data["topology"][0]["kind"] == "graph"


def test_terminal_output_escapes_markup(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("[bold]evil:1:1 [0] NCCL INFO Bootstrap : Using [red]lo:127.0.0.1<0>\n")
    code, out, _ = _invoke(path)
    assert code == 0 and "bad-socket-ifname" in out  # one node: a warning
    assert "[bold]evil" in out.replace("\n", "")  # printed literally, not taken as rich markup


def test_directory_of_logs(tmp_path: Path) -> None:
    (tmp_path / "node1.out").write_text((FIX / "not_distributed.log").read_text())
    (tmp_path / "notes.txt").write_text("nothing here\n")
    code, out, err = _invoke(tmp_path, "--json")
    assert code == 1 and "notes.txt: no NCCL lines" in err
    assert json.loads(out)["findings"][0]["id"] == "not-distributed"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _invoke(empty)
    assert code == 2 and "is a directory" in err
