"""`ddpdoctor logs` on the real texts in ../shared/logs (skips without ../shared). Each file's header says what a good
tool finds; the excerpts that mix several jobs are split on their '## ' headers and checked one job at a time."""

from __future__ import annotations

import re

import pytest

from ddpdoctor.logs.explain import explain_paths, explain_texts
from tests.conftest import shared_path

pytestmark = pytest.mark.shared


def ids(findings):
    out = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def sections(name: str) -> dict[str, str]:
    text = shared_path("logs", name).read_text()
    parts = re.split(r"^## (?:Source )?([A-D])\b.*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_01_shape_mismatch_from_one_rank_line():
    (m,) = ids(explain_paths([str(shared_path("logs", "01_pgwrapper_mismatch_shape_allreduce.txt"))]).findings)[
        "collective-mismatch"]
    assert m.ranks == [0, 1]
    assert m.evidence["collectives"]["1"]["shapes"] == [[195812480]]
    assert m.evidence["collectives"]["0"]["shapes"] == [[51123456]]
    assert m.evidence["collectives"]["0"]["seq"] == m.evidence["collectives"]["1"]["seq"] == 3104
    assert m.evidence["differs"] == ["shapes: rank 0 [[51123456]] vs rank 1 [[195812480]]"]


def test_03_barrier_sequence_number_mismatch_rank_2_behind():
    (m,) = ids(explain_paths([str(shared_path("logs", "03_pgwrapper_barrier_seqnum_plus_torchrun_report.txt"))])
               .findings)["collective-mismatch"]
    assert m.ranks == [1, 2] and m.evidence["behind_ranks"] == [2]
    assert {m.evidence["collectives"][r]["op"] for r in ("1", "2")} == {"BARRIER"}


@pytest.mark.parametrize("part, stalled, culprits, seq", [
    ("A", [0, 3, 4], [], 1580),  # every rank reported is inside #1580 with the same last enqueued #1582
    ("B", [0, 1], [], 808),
    ("C", [1, 3], [], 469508),
    ("D", [0], [7], 96120),  # rank 7 times out at #64088: far behind rank 0
])
def test_04_nccl_watchdog_per_job(part, stalled, culprits, seq):
    (hang,) = ids(explain_texts({f"04{part}.log": sections("04_nccl_watchdog_timeout_multi_rank.txt")[part]}))[
        "hang"]
    ev = hang.evidence
    assert (ev["stalled_ranks"], ev["culprit_ranks"], ev["collective"]["seq"]) == (stalled, culprits, seq)
    assert ev["collective"]["op"] == "ALLREDUCE" and ev["detected_after_s"] > 600


def test_07_torchrun_tables():
    parts = sections("07_torchrun_childfailederror_root_cause.txt")
    a = ids(explain_texts({"a.log": parts["A"]}))
    assert "rank-crashed" not in a and a["job-failed"][0].evidence["reported_root_cause_rank"] == 0
    assert "watchdog" in a["job-failed"][0].advice  # every rank SIGABRT: NCCL's watchdog, not 3 crashes
    b = ids(explain_texts({"b.log": parts["B"]}))
    (crash,) = b["rank-crashed"]
    assert crash.evidence["rank"] == 0 and "SIGKILL" in crash.evidence["exception"]
    c = ids(explain_texts({"c.log": parts["C"]}))
    assert c["job-failed"][0].evidence["failures"][0]["exitcode"] == 1


def test_08_unused_parameters_names_and_indices():
    (u,) = ids(explain_paths([str(shared_path("logs", "08_ddp_unused_parameters.txt"))]).findings)[
        "unused-parameters"]
    assert u.evidence["names"] == ["a.weight", "text_model.final_layer_norm.bias", "text_model.final_layer_norm.weight"]
    assert u.evidence["per_rank"]["7"]["indices"][:3] == [1360, 1361, 1362]


def test_10_dataloader_error_is_a_crash_and_11_has_nothing_to_explain():
    (crash,) = ids(explain_paths([str(shared_path("logs", "10_sampler_and_data_bugs.txt"))]).findings)[
        "rank-crashed"]
    assert crash.evidence["exception"] == "ValueError: sampler option is mutually exclusive with shuffle"
    report = explain_paths([str(shared_path("logs", "11_nccl_tests_all_reduce_perf_format.txt"))])
    assert report.findings == [] and any("nothing to explain" in n for n in report.notes)


RECORDED = {
    # file: (finding id, check)
    "mismatch_shape_DETAIL.log": ("collective-mismatch",
                                  lambda f: f.evidence["collectives"]["0"]["shapes"] == [[4]]
                                  and f.evidence["collectives"]["1"]["shapes"] == [[5]]),
    "mismatch_shape_OFF.log": ("collective-mismatch", lambda f: f.evidence["detected_on"] == [0]),
    # Each rank's own fingerprint: rank 0 in its all_reduce, rank 1 (which skipped it) already in the barrier.
    "mismatch_skip_DETAIL.log": ("collective-mismatch",
                                 lambda f: f.evidence["collectives"]["0"]["op"] == "ALLREDUCE"
                                 and f.evidence["collectives"]["1"]["op"] == "BARRIER"),
    "mismatch_skip_OFF.log": ("hang", lambda f: f.evidence["stalled_ranks"] == [0, 1]
                              and f.evidence["detected_after_s"] == 20.0),
    "mismatch_skip_nobarrier_DETAIL.log": ("hang", lambda f: f.evidence["culprit_ranks"] == [1]
                                           and f.evidence["stalled_ranks"] == [0]),
    "mismatch_skip_nobarrier_OFF.log": ("hang", lambda f: f.evidence["culprit_ranks"] == [1]
                                        and f.evidence["stalled_ranks"] == [0]),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_cpu_gloo(name):
    finding_id, check = RECORDED[name]
    found = ids(explain_paths([str(shared_path("logs", "recorded_cpu_gloo", name))]).findings)
    (f,) = found[finding_id]
    assert check(f), f.evidence
    if "nobarrier" in name:  # torchrun names rank 0, which only waited for rank 1
        assert found["misleading-root-cause"][0].evidence["reported_rank"] == 0


def test_every_shared_log_parses():
    for path in sorted(shared_path("logs").rglob("*")):
        if path.is_file() and path.suffix in (".txt", ".log"):
            explain_paths([str(path)])


# Two of them hold a failed connection setup (NCCL WARN lines: ibv_modify_qp failed; [Service thread] Error
# encountered progressing operation=Connect): never silent about those (issue 15.2); the others are healthy.
FAILING_NCCL_LOGS = {"01_nccltests185_roce_version_skew_warn.log": "nccl-error",
                     "02_nccl952_ibext_nodevice_socket_fallback.log": "nccl-error"}


def test_nccl_debug_logs_raise_no_false_alarm():
    """NCCL_DEBUG=INFO logs of healthy jobs (../shared/nccl/logs): nothing to explain, and a pointer to `topo`."""
    paths = sorted(p for p in shared_path("nccl", "logs").glob("*.log"))
    assert paths
    for path in paths:
        report = explain_paths([str(path)])
        if path.name in FAILING_NCCL_LOGS:
            assert [f.id for f in report.findings] == [FAILING_NCCL_LOGS[path.name]], path
            continue
        assert report.findings == [], (path, [f.id for f in report.findings])
        assert any("ddpdoctor topo" in n for n in report.notes), path
