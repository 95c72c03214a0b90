"""Tolerant parser for NCCL_DEBUG=INFO output (NCCL 2.4-2.30 wording, any launcher prefix) into an NcclLog."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ddpdoctor.topo import versions
from ddpdoctor.topo.grammar import (
    _ALGO_IGNORED,
    _BARE_VERSION,
    _BOOTSTRAP,
    _CHANNELS,
    _COMM,
    _CONN,
    _DRIVER,
    _ENV,
    _ENV_SET,
    _GDR_HCA,
    _GDR_RING,
    _IB_DEV,
    _IB_USING,
    _IFACE_TOKENS,
    _IFACES,
    _INIT,
    _INTERNAL_NETS,
    _LAUNCHER_RANK,
    _MAX_LINE,
    _NCCL,
    _NCCL_NO_HOST,
    _NETWORK,
    _NVLS,
    _OFI,
    _P2P_OFF,
    _P2P_PLUGIN,
    _PLUGIN_FAILED,
    _PLUGIN_LOADED,
    _PLUGIN_PATH,
    _RDMA_ERR,
    _RING_LIST,
    _SOCKET,
    _TESTS_RANK,
    _TOPO_PRINT,
    UNKNOWN_HOST,
)
from ddpdoctor.topo.parsed_log import ConnStat, HostInfo, Line, NcclLog


def transport_kind(via: str) -> tuple[str, bool]:
    """Normalise a `via ...` transport to its kind and whether it uses GPUDirect RDMA."""
    parts = via.split("/")
    head = parts[0]
    gdr = "GDRDMA" in via
    if head == "P2P" and len(parts) > 1:
        sub = parts[1].split("(")[0]
        if sub.startswith("direct"):
            sub = "direct"
        elif sub.startswith("indirect"):
            sub = "indirect"
        return f"P2P/{sub}", False
    if head == "SHM" or head.startswith("direct shared"):  # "direct shared memory": the <=2.12 SHM wording
        return "SHM", False
    if head == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}", gdr
    if head == "COLLNET" and len(parts) > 1:
        return f"COLLNET/{parts[1]}", gdr
    return head, gdr


def _ifaces(text: str) -> dict[str, str]:
    """'eth0:10.1.2.3<0>' pairs, read token by token (tokens over 256 characters are no interface): linear in the
    line, where one search over it was quadratic on a long line without '<N>'."""
    out: dict[str, str] = {}
    for token in _IFACE_TOKENS.split(text):
        if len(token) > 256:
            continue
        for m in _IFACES.finditer(token):
            out[m.group(1)] = m.group(2)
    return out


def _int(text: str | None) -> int | None:
    return int(text) if text is not None else None


class _Parser:
    def __init__(self, log: NcclLog) -> None:
        self.log = log
        self.last_host: str | None = None

    def feed(self, file: str, lines: Iterable[str]) -> int:
        """Parse one file's lines; returns how many NCCL lines it held."""
        found = 0
        for lineno, raw in enumerate(lines, 1):
            self.log.lines_read += 1
            # NCCL lines are short; clipping bounds regex work on a pathological (binary, runaway) line.
            text = raw[:_MAX_LINE].rstrip("\r\n")
            if "NCCL" not in text and "Rank" not in text:
                continue
            if self._line(file, lineno, text):
                found += 1
        self.log.nccl_lines += found
        return found

    def _line(self, file: str, lineno: int, text: str) -> bool:
        m = _NCCL.search(text)
        pid = 0
        if m is not None:
            host_name, pid = m.group("host"), int(m.group("pid"))
        elif (m := _NCCL_NO_HOST.search(text)) is not None:
            host_name = self.last_host or UNKNOWN_HOST  # an elided prefix: most likely the host printing around it
        else:
            return self._other(file, lineno, text)
        log = self.log
        line = Line(file, lineno, text.strip())
        host = log.host(host_name)
        self.last_host = host.name
        dev = int(m.group("dev") or 0)
        if pid:
            host.pids.add(pid)
        host.devs.add(dev)
        lr = _LAUNCHER_RANK.match(text)
        if lr:
            r = int(next(g for g in lr.groups() if g is not None))
            info = log.rank(r)
            info.host = info.host or host.name
            info.cuda_dev = info.cuda_dev if info.cuda_dev is not None else dev
        msg = (m.group("msg") or "").strip()
        if m.group("level") == "WARN":
            log.warnings.append(line)
        if not msg.startswith(("Channel ", "Ring ")) or msg.endswith("shared memory"):
            self._fingerprint(host, msg, line)  # connection lines (the bulk) carry no version wording
        self._message(host, dev, pid, msg, line)
        return True

    def _other(self, file: str, lineno: int, text: str) -> bool:
        """Lines without the NCCL prefix: the bare <=2.21 version line and nccl-tests' device table."""
        m = _BARE_VERSION.search(text)
        if m and "INFO" not in text:
            # Printed by the process itself with no host; the nearest preceding NCCL line names the host.
            if self.last_host is not None:
                line = Line(file, lineno, text.strip())
                host = self.log.host(self.last_host)
                host.versions.setdefault(m.group(1), line)
                v = versions.parse_version(m.group(1))
                if v is not None:
                    host.fingerprints.append((v, v, line))
            return True
        m = _TESTS_RANK.search(text)
        if m:
            info = self.log.rank(int(m.group(1)))
            info.host = m.group(3)
            info.cuda_dev = int(m.group(4))
            info.gpu_name = m.group(6).strip() or None
            info.line = info.line or Line(file, lineno, text.strip())
            host = self.log.host(m.group(3))
            if info.gpu_name:
                host.gpu_names[info.cuda_dev] = info.gpu_name
            return False  # not an NCCL line itself
        return False

    def _fingerprint(self, host: HostInfo, msg: str, line: Line) -> None:
        v = versions.version_of_line(msg)
        if v is not None:
            host.fingerprints.append((v[0], v[1], line))

    def _message(self, host: HostInfo, dev: int, pid: int, msg: str, line: Line) -> None:
        log = self.log
        if msg.startswith("NCCL version "):
            host.versions.setdefault(msg.split()[2], line)
            return
        if (m := _CONN.match(msg)) is not None:
            self._connection(host, m, line)
            return
        if (m := _RING_LIST.match(msg)) is not None:
            total = m.group(2)
            n = int(total) if total is not None else int(m.group(1)) + 1
            if log.rings is None or n > log.rings[0]:
                log.rings = (n, line)
            if len(log.ring_ranks) < 100_000:
                log.ring_ranks.update(int(r) for r in m.group(3).split())
            return
        if (m := _ENV.match(msg)) is not None:
            value = m.group(2)
            if re.fullmatch(r"-?\d+\.", value):  # integer params print a trailing period
                value = value[:-1]
            host.env.setdefault(m.group(1), (value, line))
            return
        if (m := _ENV_SET.match(msg)) is not None:
            host.env.setdefault(m.group(1), (m.group(2), line))
            return
        if (m := _BOOTSTRAP.match(msg)) is not None:
            found = _ifaces(m.group(1))
            host.bootstrap_ifaces.update(found)
            for iface in found:
                host.iface_lines.setdefault(iface, line)
            return
        if (m := _SOCKET.match(msg)) is not None:
            found = _ifaces(m.group(1))
            host.socket_ifaces.update(found)
            for iface in found:
                host.iface_lines.setdefault(iface, line)
            return
        if (m := _IB_USING.match(msg)) is not None:
            for d in _IB_DEV.finditer(m.group(1)):
                host.ib_devices[f"{d.group(1)}:{d.group(2)}"] = d.group(3)
            host.ib_devices_line = host.ib_devices_line or line
            return
        if re.match(r"^NET/IB ?: No device found", msg):
            host.ib_no_device = host.ib_no_device or line
            return
        if (m := _NETWORK.match(msg)) is not None:
            host.networks.setdefault(m.group(1), line)
            return
        if (m := _GDR_HCA.match(msg)) is not None:
            host.gdr_hca.append((m.group(2) == "Enabled", m.group(3), line))
            return
        if (m := _GDR_RING.search(msg)) is not None:
            host.gdr_ring.append((m.group(1) == "1", line))
            return
        if (m := _INIT.search(msg)) is not None:
            rank, nranks = int(m.group(1)), int(m.group(2))
            if len(log.inits) < 100_000:
                log.inits.append((host.name, pid, rank, nranks, line))
            info = log.rank(rank)
            if info.nranks is None or nranks >= info.nranks:  # several communicators: keep the widest
                info.host, info.cuda_dev, info.bus_id = host.name, int(m.group(3)), m.group(4).lower()
                info.nranks, info.line = nranks, line
            return
        if (m := _COMM.search(msg)) is not None:
            info = log.rank(int(m.group(1)))
            info.host = info.host or host.name
            info.cuda_dev = info.cuda_dev if info.cuda_dev is not None else dev
            info.nranks, info.nnodes, info.local_ranks = int(m.group(2)), int(m.group(3)), int(m.group(4))
            info.line = info.line or line
            return
        if (m := _CHANNELS.match(msg)) is not None:
            self._max("coll_channels", int(m.group(1)), line)
            if m.group(2) is not None:
                self._max("collnet_channels", int(m.group(2)), line)
            if m.group(3) is not None:
                self._max("nvls_channels", int(m.group(3)), line)
            return
        if msg.startswith("Trees"):
            if len(log.trees) < 50:
                log.trees.append(line)
            chans = [int(c) for c in re.findall(r"\[(\d+)\]", msg)]
            if chans:
                self._max("tree_channels", max(chans) + 1, line)  # one "[c]" per channel
            return
        if (m := _NVLS.search(msg)) is not None:
            host.nvls[int(m.group(2))] = (m.group(1) is None, line)
            return
        if (m := _TOPO_PRINT.search(msg)) is not None:
            if m.group(1) == "NVL":
                host.nvlink = host.nvlink or line
            if m.group(2) == "NVS":
                host.nvswitch = host.nvswitch or line
            return
        if (m := _DRIVER.match(msg)) is not None:
            host.cuda_driver = m.group(1)
            return
        if _P2P_OFF.search(msg):
            log.p2p_disabled.append(line)
            return
        if _RDMA_ERR.search(msg) and ("WARN" in line.text):
            log.rdma_errors.append(line)
            return
        if _ALGO_IGNORED.search(msg):
            log.algo_ignored.append(line)
            return
        self._plugin(host, msg, line)

    def _plugin(self, host: HostInfo, msg: str, line: Line) -> None:
        if (m := _PLUGIN_FAILED.match(msg)) is not None:
            host.plugin_failures.append(line)
        if (m := _P2P_PLUGIN.match(msg)) is not None:
            host.plugins.setdefault(m.group(1), line)
        elif (m := _PLUGIN_PATH.match(msg)) is not None:
            host.plugins.setdefault(m.group(1).rsplit("/", 1)[-1], line)
        elif (m := _PLUGIN_LOADED.match(msg)) is not None:
            name = m.group(1) or m.group(2)
            if name not in _INTERNAL_NETS:
                host.plugins.setdefault(name, line)
        elif _OFI.match(msg):
            host.plugins.setdefault("OFI", line)
            if (p := re.search(r"Selected Provider is (\w+)", msg)) is not None:
                host.plugins.setdefault(f"OFI:{p.group(1)}", line)

    def _max(self, attr: str, value: int, line: Line) -> None:
        cur = getattr(self.log, attr)
        if cur is None or value > cur[0]:
            setattr(self.log, attr, (value, line))

    def _connection(self, host: HostInfo, m: re.Match[str], line: Line) -> None:
        log = self.log
        src, dst, direction, via = int(m.group(2)), int(m.group(3)), m.group(4), m.group(5)
        kind, gdr = transport_kind(via)
        me = dst if direction == "receive" else src
        info = log.rank(me)
        info.host = info.host or host.name
        key = (src, dst, via)
        stat = log.connections.get(key)
        if stat is None:
            log.connections[key] = ConnStat(src, dst, via, kind, gdr, host.name, 1, line)
        else:
            stat.count += 1


def parse_lines(log: NcclLog, file: str, lines: Iterable[str]) -> int:
    """Add one file's lines to ``log``; returns the number of NCCL lines found in it."""
    parser = _Parser(log)
    log.files.append(file)
    return parser.feed(file, lines)


def parse_text(text: str, file: str = "<text>") -> NcclLog:
    log = NcclLog()
    parse_lines(log, file, text.splitlines())
    return log
