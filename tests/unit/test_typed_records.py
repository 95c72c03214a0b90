"""What a rank writes is typed (probes/records.py, preflight/record.py) and agrees with what the readers validate
(rundir/schema.py); and the packages typed for issue 25 keep their `dict[str, Any]` to the boundaries listed here.

The writers' shapes are TypedDicts (the files stay byte for byte what they were); the readers' are msgspec schemas.
A field a reader's schema declares but no writer's shape has would be a reader waiting for a key nobody writes."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from ddpdoctor.preflight import record as preflight_record
from ddpdoctor.probes import records
from ddpdoctor.rundir import records as run_records
from ddpdoctor.rundir import schema

PKG = Path(__file__).resolve().parents[2] / "ddpdoctor"

# (writer's TypedDict, reader's schema, keys added to the document outside the TypedDict's builder)
PAIRS = [
    (records.RankStatusDoc, schema.RankStatus, set()),
    (records.RankInfoDoc, schema.RankInfo, set()),
    (records.DDPModuleDoc, schema.DDPModule, set()),
    (records.ProcessGroupDoc, schema.ProcessGroupInfo, set()),
    (records.SyncDoc, schema.SyncRecord, set()),
    (records.SyncModuleDoc, schema.SyncModule, set()),
    (records.FingerprintRow, schema.SyncRow, set()),
    (records.DataDoc, schema.DataRecord, {"rank"}),  # probes/sync.py writes {"rank": R, **sampler.data()}
    (records.LoaderDoc, schema.LoaderRecord, set()),
    (records.EpochRecord, schema.LoaderEpoch, set()),
    (records.Beat, schema.Beat, set()),
    (run_records.RankExitDoc, schema.RankExit, set()),
    (run_records.RankBeatsDoc, schema.RankBeats, set()),
    (run_records.HeartbeatsDoc, schema.Heartbeats, set()),
    (run_records.HangDoc, schema.Hang, set()),
    (run_records.HangDiagnosisDoc, schema.HangFileDiagnosis, set()),
    (run_records.PositionDoc, schema.Position, set()),
    (run_records.RankClassDoc, schema.HangClass, set()),
    (run_records.RunEndedDoc, schema.RunEnded, set()),
    (preflight_record.RankPreflight, schema.PreflightRecord, set()),
    (preflight_record.CheckOutcome, schema.CheckRecord, set()),
    (preflight_record.DeviceFacts, schema.Devices, set()),
]


@pytest.mark.parametrize(("shape", "reader", "added"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_every_field_a_reader_validates_is_a_key_its_writer_declares(
        shape: type, reader: type[msgspec.Struct], added: set[str]) -> None:
    declared = set(shape.__annotations__) | added  # a TypedDict's annotations include its bases' keys
    read = set(reader.__struct_fields__) - {"schema_version"}  # stamped by rundir's write_json
    assert read <= declared, f"{reader.__name__} reads {sorted(read - declared)}, which {shape.__name__} never has"


def test_the_pairing_check_can_fail() -> None:
    """The check above on a shape that lacks a field the reader has: it must see the gap."""
    declared = set(records.DataDoc.__annotations__)
    assert "rank" in set(schema.DataRecord.__struct_fields__) - declared


# `dict[str, Any]` left in each package, all at boundaries: raw JSON in (the options in $DDPDOCTOR_CONFIG,
# a monitor's request, torch's own DDP logging record, a rank's message, a file read back before it is narrowed),
# the user's own keyword arguments (DataLoader(...), a collective's call, click's options), and evidence maps (a
# preflight check's evidence, shown and copied into the finding). The ceiling only goes down.
CEILINGS = {
    # $DDPDOCTOR_CONFIG's options as they arrive (typed through ProbeConfig.probe_options), monitor requests x2,
    # torch's DDP logging record, the user's DataLoader and collective kwargs
    "probes": 6,
    "preflight": 9,  # evidence maps x9 (a check's row is CheckRowJson)
    "topo": 0,
    "traces": 0,
    "logs": 0,
    "tensorboard_plugin": 0,
    "sync_api.py": 0,
    # renderers/, reports/, commands/ and report.py: tests/unit/test_typed_reports.py
    # The job core (issue 25) takes rundir/records.py's shapes (a rank's beat, exit and status, hang.json,
    # heartbeats.json) and its own (the store's envelope, capture requests, the head's word). Left: the store's
    # raw values (get_many x2), click's keyword arguments (launch/flags.py), evidence maps (Finding.evidence and
    # three rules' own), the raw JSON of a run file (artefacts.load_dict,
    # manifest.load, rundir's sync.json/data.json loader x2).
    "job": 2,
    "launch": 1,
    "findings": 4,
    "rundir": 4,
    # Everything live/ writes is typed (live/records.py), a rank's message is rundir/records.py's RankMessage, and
    # what it reads back (alerts.jsonl, snapshots, capture records) is Mapping[str, object], narrowed where read.
    "live": 0,
}
# Left out: probes/ledger.py is reworked as a Flight Recorder source (issue 28) in the same round.
NOT_COUNTED = {"probes/ledger.py"}
_ANY_DICT = re.compile(r"dict\[str, Any\]")


def _count(where: str) -> int:
    root = PKG / where
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    return sum(len(_ANY_DICT.findall(p.read_text())) for p in files
               if str(p.relative_to(PKG)) not in NOT_COUNTED)


@pytest.mark.parametrize("where", sorted(CEILINGS))
def test_untyped_dicts_stay_at_the_boundaries(where: str) -> None:
    assert _count(where) <= CEILINGS[where], (
        f"ddpdoctor/{where} has {_count(where)} `dict[str, Any]` (ceiling {CEILINGS[where]}): type the new one "
        "(a dataclass, a msgspec Struct, or a TypedDict for a JSON document passed through)")
