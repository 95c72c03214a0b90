"""The base of every run-directory artefact's schema (rundir/schema.py, rundir/schema_sync.py): the versioned
Struct and the number and free-form JSON field types."""

from __future__ import annotations

from typing import Any

import msgspec

Number = float  # msgspec accepts JSON integers for float fields; booleans are refused
Json = Any  # free-form: not read by any analysis (shown or copied only)


class Artefact(msgspec.Struct, kw_only=True):
    # 0: written before artefacts carried a version (e.g. sample_traces/).
    schema_version: int = 0
