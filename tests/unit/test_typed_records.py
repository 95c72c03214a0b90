"""What a rank writes is typed (probes/records.py, preflight/record.py) and agrees with what the readers validate
(rundir/schema.py).

The writers' shapes are TypedDicts (the files stay byte for byte what they were); the readers' are msgspec schemas.
A field a reader's schema declares but no writer's shape has would be a reader waiting for a key nobody writes."""

from __future__ import annotations

import msgspec
import pytest

from ddpdoctor.preflight import record as preflight_record
from ddpdoctor.probes import records
from ddpdoctor.rundir import schema

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
