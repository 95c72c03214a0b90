"""Tolerant reader for NCCL topology XML (NCCL_TOPO_DUMP_FILE / NCCL_TOPO_FILE), truncated excerpts included.

A tag scanner, not an XML library: pasted dumps are often cut off mid-file, and a regex scanner never resolves
entities or fetches anything, so a hostile file can do no more than be misread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*)((?:\s+[\w:.-]+\s*=\s*\"[^\"]*\")*)\s*(/?)>")
_ATTR = re.compile(r"(?<![\w:.-])([\w:.-]+)\s*=\s*\"([^\"]*)\"")
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)

CLASS_BRIDGE = "0x060400"
NVSWITCH_TCLASS = "0x068000"


@dataclass
class TopoGpu:
    busid: str
    dev: int | None
    sm: int | None
    rank: int | None
    gdr: bool | None
    numa: int | None
    host_hash: str | None
    link_speed: str | None
    link_width: int | None
    ancestors: tuple[str, ...]  # enclosing PCI elements' busids, outermost first
    line: int
    nvlinks: list[tuple[str, int, str]] = field(default_factory=list)  # (target busid, count, tclass)

    @property
    def nvlink_count(self) -> int:
        return sum(c for _, c, _ in self.nvlinks)


@dataclass
class TopoNet:
    name: str
    dev: int | None
    speed_mbps: int | None
    port: int | None
    guid: str | None
    gdr: bool | None
    nic_busid: str | None  # None: a NIC without a PCI path (virtual, socket iface)
    numa: int | None
    host_hash: str | None
    link_speed: str | None
    link_width: int | None
    ancestors: tuple[str, ...]
    line: int


@dataclass
class TopoSystem:
    file: str
    kind: str = "unknown"  # "topology" | "graph" | "unknown"
    truncated: bool = False
    cpus: list[dict[str, str]] = field(default_factory=list)
    pci_count: int = 0
    gpus: list[TopoGpu] = field(default_factory=list)
    nets: list[TopoNet] = field(default_factory=list)
    graphs: list[dict[str, str]] = field(default_factory=list)  # NCCL_GRAPH_DUMP_FILE <graph> attributes
    elements: int = 0
    pci_gpus: int = 0  # PCI functions of GPU class (static files list GPUs only as <pci class="0x03...">)
    pci_nics: int = 0

    @property
    def usable(self) -> bool:
        return self.kind != "unknown" and self.elements > 0


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0) if value.startswith("0x") else int(float(value))
    except (ValueError, OverflowError):  # "inf" / "nan" / "1e999" in a hostile or corrupt file
        return None


def _flag(value: str | None) -> bool | None:
    return None if value is None else value.strip() not in ("0", "")


@dataclass
class _Frame:
    tag: str
    attrs: dict[str, str]


def parse_topo_xml(text: str, file: str = "<xml>") -> TopoSystem:
    """Read what is there; ``truncated`` says when the file was cut (unclosed or orphan tags, a partial tag)."""
    system = TopoSystem(file)
    if _COMMENT.search(text) and re.search(r"<!--(?:(?!-->).)*\Z", text, re.DOTALL):
        system.truncated = True  # an unterminated comment
    body = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    stack: list[_Frame] = []
    pos = 0
    lineno = 1
    last_end = 0
    for m in _TAG.finditer(body):
        lineno += body.count("\n", pos, m.start())
        pos = m.start()
        last_end = m.end()
        closing, tag, attr_text, selfclose = m.group(1), m.group(2), m.group(3), m.group(4)
        if closing:
            if any(f.tag == tag for f in stack):
                while stack and stack.pop().tag != tag:
                    system.truncated = True  # an element closed without its children closing
            else:
                system.truncated = True  # an excerpt that starts mid-file
            continue
        attrs = dict(_ATTR.findall(attr_text))
        system.elements += 1
        _element(system, stack, tag, attrs, lineno)
        if not selfclose:
            stack.append(_Frame(tag, attrs))
    if stack or "<" in body[last_end:]:
        system.truncated = True
    return system


def _element(system: TopoSystem, stack: list[_Frame], tag: str, attrs: dict[str, str], lineno: int) -> None:
    if tag == "system":
        system.kind = "topology"
    elif tag == "graphs":
        system.kind = "graph"
    elif tag == "graph":
        system.kind = "graph" if system.kind == "unknown" else system.kind
        system.graphs.append(attrs)
    elif tag == "cpu":
        system.kind = "topology" if system.kind == "unknown" else system.kind
        system.cpus.append(attrs)
    elif tag == "pci":
        system.pci_count += 1
        cls = attrs.get("class", "")
        system.pci_gpus += cls.startswith("0x03")
        system.pci_nics += cls.startswith("0x02")
        system.kind = "topology" if system.kind == "unknown" else system.kind
    elif tag == "gpu" and system.kind != "graph":
        cpu, pcis = _context(stack)
        own = pcis[-1] if pcis else {}
        system.gpus.append(TopoGpu(
            busid=own.get("busid", "?"), dev=_int(attrs.get("dev")), sm=_int(attrs.get("sm")),
            rank=_int(attrs.get("rank")), gdr=_flag(attrs.get("gdr")), numa=_numa(cpu),
            host_hash=(cpu or {}).get("host_hash"), link_speed=own.get("link_speed"),
            link_width=_int(own.get("link_width")), ancestors=tuple(p.get("busid", "?") for p in pcis[:-1]),
            line=lineno,
        ))
    elif tag == "nvlink":
        if stack and stack[-1].tag == "gpu" and system.gpus:
            system.gpus[-1].nvlinks.append(
                (attrs.get("target", "?"), _int(attrs.get("count")) or 1, attrs.get("tclass", ""))
            )
    elif tag == "net" and system.kind != "graph":
        cpu, pcis = _context(stack)
        own = pcis[-1] if pcis else {}
        system.nets.append(TopoNet(
            name=attrs.get("name", "?"), dev=_int(attrs.get("dev")), speed_mbps=_int(attrs.get("speed")),
            port=_int(attrs.get("port")), guid=attrs.get("guid"), gdr=_flag(attrs.get("gdr")),
            nic_busid=own.get("busid"), numa=_numa(cpu), host_hash=(cpu or {}).get("host_hash"),
            link_speed=own.get("link_speed"), link_width=_int(own.get("link_width")),
            ancestors=tuple(p.get("busid", "?") for p in pcis[:-1]), line=lineno,
        ))


def _context(stack: list[_Frame]) -> tuple[dict[str, str] | None, list[dict[str, str]]]:
    cpu = None
    pcis: list[dict[str, str]] = []
    for frame in stack:
        if frame.tag == "cpu":
            cpu, pcis = frame.attrs, []
        elif frame.tag == "pci":
            pcis.append(frame.attrs)
    return cpu, pcis


def _numa(cpu: dict[str, str] | None) -> int | None:
    return _int(cpu.get("numaid")) if cpu else None


def path_type(gpu: TopoGpu, net: TopoNet) -> str:
    """NCCL's GPU<->NIC distance class from the PCI tree: PIX (one switch), PXB (several), PHB (CPU), SYS."""
    if gpu.host_hash and net.host_hash and gpu.host_hash != net.host_hash:
        return "SYS"
    common = 0
    for a, b in zip(gpu.ancestors, net.ancestors, strict=False):
        if a != b:
            break
        common += 1
    if common:
        # Both directly below the shared switch: one hop (PIX); deeper on either side: PXB.
        return "PIX" if len(gpu.ancestors) == common and len(net.ancestors) == common else "PXB"
    if gpu.numa is not None and gpu.numa == net.numa and gpu.numa >= 0:
        return "PHB"
    if gpu.numa is not None and gpu.numa == net.numa:
        return "PHB"  # numaid -1: one pseudo CPU, still the host bridge
    return "SYS"


PATH_ORDER = ["PIX", "PXB", "PHB", "SYS"]


def nearest_nic(gpu: TopoGpu, nets: list[TopoNet]) -> tuple[str, TopoNet] | None:
    best: tuple[str, TopoNet] | None = None
    for net in nets:
        p = path_type(gpu, net)
        if best is None or PATH_ORDER.index(p) < PATH_ORDER.index(best[0]):
            best = (p, net)
    return best


def gt_per_s(link_speed: str | None) -> float | None:
    """'16.0 GT/s PCIe' / '8 GT/s' -> 16.0 / 8.0; unreadable -> None."""
    if not link_speed:
        return None
    m = re.match(r"\s*([\d.]+)\s*GT/s", link_speed)
    return float(m.group(1)) if m else None
