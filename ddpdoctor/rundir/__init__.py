"""The run directory: the on-disk record of one job that every analysis reads."""

from ddpdoctor.rundir.layout import RunDir, read_json, write_json

__all__ = ["RunDir", "read_json", "write_json"]
