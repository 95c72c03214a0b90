"""`logs` (text logs, Flight Recorder JSON and pickle dumps) and `topo` (NCCL logs, topology XML), mutated."""

from __future__ import annotations

import json
import pickle

from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.commands.topo import build_report
from ddpdoctor.logs import flight_recorder
from ddpdoctor.logs.explain import explain_paths
from tests.conftest import REPO
from tests.fuzz.common import result_or_bad_input
from tests.fuzz.mutate import FUZZ, damage, dumps, mutate, mutate_lines, mutate_xml

LOGS = REPO / "tests" / "fixtures" / "logs"
NCCL = REPO / "tests" / "fixtures" / "nccl"
TEXT_LOGS = sorted(LOGS.glob("*.log"))
NCCL_LOGS = sorted(NCCL.glob("*.log"))
XMLS = sorted(NCCL.glob("*.xml"))
FR_JSON = json.loads((LOGS / "fr_rank0.json").read_text())
FR_PICKLE = flight_recorder.loads_pickle((LOGS / "fr_rank0.pkl").read_bytes(), "fr_rank0.pkl")


def _logs(path):  # type: ignore[no-untyped-def]
    return explain_paths([str(path)]).to_json()


def _topo(logs, xmls):  # type: ignore[no-untyped-def]
    return build_report(logs, xmls).to_json()


@FUZZ
@given(st.sampled_from(TEXT_LOGS), st.randoms(use_true_random=False))
def test_logs_text(tmp_path_factory, seed, rnd):
    p = tmp_path_factory.mktemp("l") / "rank1.log"
    p.write_bytes(damage(mutate_lines(seed.read_text(errors="replace"), rnd).encode("utf-8", "surrogatepass"), rnd))
    result_or_bad_input(_logs, p)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_logs_flight_recorder_json(tmp_path_factory, rnd):
    p = tmp_path_factory.mktemp("f") / "fr_rank0.json"
    p.write_bytes(damage(dumps(mutate(FR_JSON, rnd)), rnd))
    result_or_bad_input(_logs, p)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_logs_flight_recorder_pickle(tmp_path_factory, rnd):
    p = tmp_path_factory.mktemp("f") / "fr_rank0.pkl"
    p.write_bytes(pickle.dumps(mutate(FR_PICKLE, rnd), protocol=4))
    result_or_bad_input(_logs, p)


@FUZZ
@given(st.sampled_from(NCCL_LOGS), st.randoms(use_true_random=False))
def test_topo_nccl_log(tmp_path_factory, seed, rnd):
    p = tmp_path_factory.mktemp("t") / "job.log"
    p.write_bytes(damage(mutate_lines(seed.read_text(errors="replace"), rnd).encode("utf-8", "surrogatepass"), rnd))
    result_or_bad_input(_topo, [p], [])


@FUZZ
@given(st.sampled_from(XMLS), st.randoms(use_true_random=False))
def test_topo_xml(tmp_path_factory, seed, rnd):
    p = tmp_path_factory.mktemp("x") / "topo.xml"
    p.write_bytes(damage(mutate_xml(seed.read_text(errors="replace"), rnd).encode("utf-8", "surrogatepass"), rnd))
    result_or_bad_input(_topo, [], [p])
