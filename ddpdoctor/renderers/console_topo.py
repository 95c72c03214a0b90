"""Terminal view of `topo`'s sections (and of a launch's "topology" section): the fabric summary, the hosts table,
the topology files."""

from __future__ import annotations

from typing import Any, cast

from ddpdoctor.report import Report
from ddpdoctor.topo.section_types import RunTopology, TopoSections


def render_sections(report: Report, out: Any, verbose: bool) -> None:
    """Terminal view of the topo sections (the renderer only formats what the analysis put in the report)."""
    from rich.markup import escape
    from rich.table import Table

    from ddpdoctor.reports.sections import NcclUseSection, TopologySection, TopoSection, section_of

    use = section_of(report, NcclUseSection)
    if use is not None and use.nccl_used is False:
        out.print(f"NCCL: not used ({escape(str(use.reason))})")
        return
    launch = section_of(report, TopologySection)
    topo_section = section_of(report, TopoSection)
    sections: TopoSections
    if launch is not None:  # a profile/run report: the topo sections sit under "topology"
        nested = launch.topology
        if not nested.get("nccl_used", True):
            out.print(f"NCCL: not used ({escape(str(nested.get('reason')))})")
            return
        sections = cast(RunTopology, nested)
    elif topo_section is not None:
        sections = topo_section.sections()
    else:
        return
    s = sections.get("summary") or {}
    if s:
        gdr = {True: "yes", False: "no", None: "unknown"}[s.get("gdr")]
        out.print(
            f"[bold]{s.get('nodes') or '?'} node(s) x {s.get('gpus_per_node') or '?'} GPU(s)[/bold]"
            f"  world size {s.get('world_size') or '?'}  network {escape(','.join(s.get('network') or []) or '?')}"
        )
        out.print(f"  inside a node: {escape(', '.join(s.get('intra_node_transport') or []) or 'not seen')}")
        out.print(f"  between nodes: {escape(', '.join(s.get('inter_node_transport') or []) or 'not seen')}")
        out.print(f"  GPUDirect RDMA: {gdr}" + (f"  [dim]({escape(str(s['gdr_evidence']))})[/dim]"
                                              if verbose and s.get("gdr_evidence") else ""))
        if s.get("nccl_versions"):
            out.print(f"  NCCL: {escape(', '.join(s['nccl_versions']))}")
    hosts = sections.get("hosts") or []
    if hosts:
        table = Table(title="Hosts", expand=False)
        for col in ("host", "NCCL", "ranks", "bootstrap", "network", "NICs", "NCCL_* set"):
            table.add_column(col, overflow="fold")
        limit = len(hosts) if verbose else 16
        for h in hosts[:limit]:
            ranks = h["ranks"]
            table.add_row(
                escape(h["host"]), escape(", ".join(h["nccl_version"] or []) or (f"{h['nccl_version_range']} (from wording)"
                                                              if h["nccl_version_range"] else "?")),
                escape(_ranks(ranks)), escape(",".join(h["bootstrap_ifaces"]) or "-"),
                escape(",".join(h["network"] + h["plugins"]) or "-"),
                escape(",".join(f"{k}/{v}" for k, v in h["ib_devices"].items()) or "-"),
                escape(" ".join(f"{k}={v}" for k, v in h["env"].items()) or "-"),
            )
        out.print(table)
        if len(hosts) > limit:
            out.print(f"[dim]… {len(hosts) - limit} more hosts (--verbose)[/dim]")
    for topo in sections.get("topology") or []:
        gpus, nics = topo["gpus"], topo["nics"]
        ng = len(gpus) if isinstance(gpus, list) else gpus
        nn = len(nics) if isinstance(nics, list) else nics
        out.print(f"topology {escape(topo['file'])}: {topo['kind']}, {ng} GPU(s), {nn} NIC port(s), NUMA "
                  f"{escape(','.join(topo['numa_nodes']) or '?')}" + (" [yellow](truncated)[/yellow]" if topo["truncated"] else ""))
        if verbose and isinstance(gpus, list):
            for g in gpus:
                out.print(f"  GPU {escape(str(g['busid']))} sm={g['sm']} numa={g['numa']} pcie={escape(g['pcie'])} "
                          f"nvlinks={g['nvlinks']} nearest NIC={escape(str(g['nearest_nic']))} ({g['nic_distance']})")


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks[:8]) + ("…" if len(ranks) > 8 else "")
