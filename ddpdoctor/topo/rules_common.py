"""Helpers the log rules share: NCCL_* settings as the log echoed them, per host."""

from __future__ import annotations

from ddpdoctor.topo.analysis import Facts
from ddpdoctor.topo.parsed_log import HostInfo, Line


def env(host: HostInfo, name: str) -> tuple[str, Line] | None:
    return host.env.get(name)


def env_all(f: Facts, name: str) -> list[tuple[str, str, Line]]:
    """(host, value, line) for every host whose log echoed ``name``."""
    return [(h.name, v, ln) for h in f.log.hosts.values() if (e := env(h, name)) for v, ln in [e]]
