"""A Perfetto protobuf trace (.pftrace) is refused in one line that says what to give instead (issue 39)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.traces.loader import load_raw

# The first bytes of a Trace message: field 1 (TracePacket), length-delimited, then binary varints.
_PROTO = b"\x0a\x12\x08\x01\x10\x02\x1a\x05hello\x08\x00\x10\x00"


@pytest.mark.parametrize("name", ["rank0.pftrace", "rank0.perfetto-trace", "rank0.trace"])
def test_perfetto_trace_is_one_clear_line(name: str, tmp_path: Path) -> None:
    p = tmp_path / name
    p.write_bytes(_PROTO)
    with pytest.raises(BadInput) as exc:
        load_raw(p)
    assert "Perfetto protobuf trace" in str(exc.value) and "export_chrome_trace" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_json_trace_that_starts_with_a_newline_is_still_read(tmp_path: Path) -> None:
    p = tmp_path / "rank0.pt.trace.json"
    p.write_text('\n{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}')
    assert load_raw(p).events
