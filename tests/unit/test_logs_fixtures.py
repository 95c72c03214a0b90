"""`ddpdoctor logs` on our own recordings (2 gloo ranks under torchrun; tests/fixtures/logs/README.md) and the CLI
contract: exit codes, --json, stdin, bad input. One test runs the real `python -m ddpdoctor`; the others use click's
in-process runner because every fresh interpreter pays ~5 s importing torch (see `ddpdoctor/__init__.py`)."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main
from ddpdoctor.logs.explain import explain_paths, explain_texts
from tests.conftest import REPO, run_cli

FIX = REPO / "tests" / "fixtures" / "logs"
SCRIPT = "faulty_job.py"


def findings(*names: str):
    report = explain_paths([str(FIX / n) for n in names])
    out = {}
    for f in report.findings:
        out.setdefault(f.id, []).append(f)
    return out


def line_of(pattern: str) -> int:
    """The line of the recording script that a finding must point at (found, not hard-coded)."""
    for i, text in enumerate((FIX / "scripts" / SCRIPT).read_text().splitlines(), start=1):
        if pattern in text:
            return i
    raise AssertionError(pattern)


def test_shape_mismatch_detail():
    (m,) = findings("shape_DETAIL.log")["collective-mismatch"]
    ev = m.evidence
    assert ev["ranks"] == [0, 1]
    assert ev["collectives"]["0"]["shapes"] == [[4]] and ev["collectives"]["1"]["shapes"] == [[5]]
    assert ev["collectives"]["0"]["op"] == ev["collectives"]["1"]["op"] == "ALLREDUCE"
    assert ev["differs"] == ["shapes: rank 0 [[4]] vs rank 1 [[5]]"]
    site = f"{SCRIPT}:{line_of('dist.all_reduce(stats)')}"
    assert sorted(ev["call_sites"]) == ["0", "1"] and all(s.endswith(site) for s in ev["call_sites"].values())


def test_shape_mismatch_debug_off_names_gloo_size_and_the_aborting_rank():
    found = findings("shape_OFF.log")
    (m,) = found["collective-mismatch"]
    assert m.evidence["detected_on"] == [0] and m.evidence["ranks"] == [0, 1]
    assert m.evidence["differs"] == ["message size: received 8 bytes where its collective expected 4"]
    assert "rank-crashed" not in found  # rank 1's "Connection reset by peer" is a consequence


def test_rank_raising_is_the_crash_not_its_peer():
    found = findings("raise.log")
    (crash,) = found["rank-crashed"]
    assert crash.evidence["rank"] == 1
    assert crash.evidence["exception"] == "ValueError: corrupt sample in shard 1 at step 3"
    assert crash.evidence["traceback"].startswith("Traceback (most recent call last):")
    assert crash.evidence["call_site"].endswith(f"{SCRIPT}:{line_of('raise ValueError')}")
    assert "misleading-root-cause" not in found  # torchrun got this one right


def test_torchrun_blames_the_victim_with_tee_prefixes():
    found = findings("raise_slow_tee.log")
    assert [f.evidence["rank"] for f in found["rank-crashed"]] == [1]
    (mis,) = found["misleading-root-cause"]
    assert mis.evidence["reported_rank"] == 0 and mis.evidence["culprit_ranks"] == [1]
    assert "Timed out waiting 6000ms" in mis.evidence["reported_error"]


def test_unused_parameters_names_and_indices():
    (u,) = findings("unused_INFO.log")["unused-parameters"]
    assert u.evidence["names"] == ["aux.bias", "aux.weight"] and u.ranks == [0, 1]
    (u_off,) = findings("unused_OFF.log")["unused-parameters"]
    assert u_off.evidence["names"] == [] and u_off.evidence["indices"] == [4, 5]


def test_segfault_ranks_from_torchrun_table_with_faulthandler_stack():
    crashes = findings("ddp_segv_DETAIL.log")["rank-crashed"]
    assert sorted(c.evidence["rank"] for c in crashes) == [0, 1]
    assert all("Segmentation fault" in c.evidence["exception"] for c in crashes)
    assert all("_ddp_init_helper" in c.evidence["traceback"] for c in crashes)


def test_hang_from_per_rank_logdir_names_culprit_and_call_site():
    found = findings("skip.log", "skip_logdir")
    (hang,) = found["hang"]
    ev = hang.evidence
    assert ev["stalled_ranks"] == [0] and ev["culprit_ranks"] == [1]
    assert ev["collective"]["op"] == "all_reduce" and ev["detected_after_s"] == 6.0
    assert ev["call_sites"]["0"].endswith(f"{SCRIPT}:{line_of('dist.all_reduce(torch.ones(3))')}")
    assert "Timed out waiting 6000ms" in ev["stacks"]["0"]
    assert found["misleading-root-cause"][0].evidence["reported_rank"] == 0


def test_uneven_batches_ranks_wait_in_different_collectives():
    found = findings("uneven.log")
    (hang,) = found["hang"]
    assert hang.evidence["stalled_ranks"] == [0, 1] and hang.evidence["culprit_ranks"] == []
    assert "different collectives" in hang.title
    (m,) = found["collective-mismatch"]
    ops = {r: c["op"] for r, c in m.evidence["collectives"].items()}
    assert ops == {"0": "allreduce (DDP gradient buckets, in backward)", "1": "barrier"}
    assert m.evidence["call_sites"]["0"].endswith(f"{SCRIPT}:{line_of('loss.backward()')}")
    assert m.evidence["call_sites"]["1"].endswith(f"{SCRIPT}:{line_of('dist.barrier()')}")


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_flight_recorder_dumps_name_the_rank_that_never_enqueued(ext):
    (hang,) = findings(f"fr_rank0.{ext}", f"fr_rank1.{ext}")["hang"]
    ev = hang.evidence
    assert ev["culprit_ranks"] == [1] and ev["stalled_ranks"] == [0]
    assert ev["collective"] == {"op": "all_reduce", "seq": 9, "group": "0 (default_pg)"}
    assert ev["per_rank"]["1"]["last_enqueued"] == 8 and ev["per_rank"]["0"]["last_enqueued"] == 9
    assert ev["per_rank"]["0"]["last_enqueued_op"] == "all_reduce" and ev["per_rank"]["0"]["last_enqueued_sizes"] == [[3]]


def test_flight_recorder_json_through_explain_texts():
    texts = {f"fr_rank{r}.json": (FIX / f"fr_rank{r}.json").read_text() for r in (0, 1)}
    (hang,) = [f for f in explain_texts(texts) if f.id == "hang"]
    assert hang.evidence["culprit_ranks"] == [1]


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def in_process(*args: str, input: str | None = None) -> _Result:
    r = CliRunner().invoke(main, list(args), input=input)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return _Result(r.exit_code, r.stdout, r.stderr)


def test_cli_json_exit_1_and_contract():
    proc = in_process("logs", "--json", str(FIX / "raise.log"))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["command"] == "logs" and doc["status"] == "error"
    crash = next(f for f in doc["findings"] if f["id"] == "rank-crashed")
    assert set(crash["evidence"]) >= {"rank", "exception", "traceback"}


def test_cli_stdin_gzip_and_terminal_output(tmp_path):
    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress((FIX / "unused_INFO.log").read_bytes()))
    proc = in_process("logs", str(gz))
    assert proc.returncode == 1 and "unused-parameters" in proc.stdout and "aux.weight" in proc.stdout
    proc = run_cli("logs", "-", input=(FIX / "shape_DETAIL.log").read_text())
    assert proc.returncode == 1 and "collective-mismatch" in proc.stdout


def test_cli_bad_inputs_exit_2_with_one_line(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    prose = tmp_path / "notes.txt"
    prose.write_text("shopping list\nmilk\n")
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(gzip.compress(b"hello " * 1000)[:40])
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    for path, words in ((empty, "empty"), (binary, "binary"), (prose, "nothing recognisable"),
                        (truncated, "gzip"), (tmp_path / "missing.log", "not found"), (hollow, "empty directory")):
        proc = in_process("logs", str(path))
        assert proc.returncode == 2, (path, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and words in proc.stderr and "Traceback" not in proc.stderr


def test_cli_healthy_plus_unrecognised_file_exit_0_with_a_note(tmp_path):
    ok = tmp_path / "rank0.log"
    ok.write_text("[rank0] step 1 loss 0.5\n")
    prose = tmp_path / "notes.txt"
    prose.write_text("shopping list\n")
    proc = in_process("logs", "--json", str(ok), str(prose))
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert any("notes.txt: nothing recognisable" in n for n in notes)
    assert any("rank0.log: no failure found" in n for n in notes)


def test_cli_several_unusable_inputs_one_line(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("hello\n")
    proc = in_process("logs", str(a), str(b))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "none of the 2 inputs is usable" in proc.stderr and "a.log: empty" in proc.stderr


def test_recorded_sigkill_rank_is_the_culprit_and_its_gloo_peer_a_victim():
    """killed.log (scripts/killed_job.py kill): rank 1 SIGKILLed in step 3; rank 0 gets gloo's Connection reset."""
    found = findings("killed.log")
    (crash,) = found["rank-crashed"]
    assert crash.ranks == [1] and "SIGKILL" in crash.title
    assert crash.evidence["victim_ranks"] == [0] and "Connection reset" in crash.evidence["victims"]["0"]
    assert "peer-lost" not in found and "unrecognised-failure" not in found


def test_recorded_ddp_model_check_names_both_ranks_and_their_counts():
    """model_mismatch.log (scripts/killed_job.py model): rank 1 built one more layer; with two ranks each message names
    the other, so the finding gives both with their parameter counts instead of blaming the printer."""
    (f,) = findings("model_mismatch.log")["model-mismatch"]
    assert f.ranks == [0, 1] and f.evidence["params_per_rank"] == {"0": 4, "1": 6}
    assert "rank-crashed" not in findings("model_mismatch.log")
