"""NCCL log parser and topology XML reader on hand-written fixtures (tests/fixtures/nccl, from GRAMMAR.md)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.topo import versions
from ddpdoctor.topo.diagnose import diagnose
from ddpdoctor.topo.nccl_log import parse_lines, parse_text, transport_kind
from ddpdoctor.topo.parsed_log import NcclLog
from ddpdoctor.topo.topo_xml import nearest_nic, parse_topo_xml, path_type

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def _parse(name: str) -> NcclLog:
    log = NcclLog()
    parse_lines(log, name, (FIX / name).read_text().splitlines())
    return log


def test_torchrun_prefixes_ranks_hosts_and_transports() -> None:
    log = _parse("torchrun_2node_ib_gdr.log")
    assert set(log.hosts) == {"gpu-a", "gpu-b"}
    assert {r: (i.host, i.cuda_dev, i.bus_id, i.nranks) for r, i in log.ranks.items()} == {
        0: ("gpu-a", 0, "18000", 4), 1: ("gpu-a", 1, "2a000", 4),
        2: ("gpu-b", 0, "18000", 4), 3: ("gpu-b", 1, "2a000", 4),
    }
    assert log.ranks[0].nnodes == 2 and log.ranks[0].local_ranks == 2
    a = log.hosts["gpu-a"]
    assert list(a.versions) == ["2.22.3+cuda12.4"]
    assert a.bootstrap_ifaces == {"eth0": "10.0.0.11"}
    assert a.ib_devices == {"mlx5_0:1": "IB", "mlx5_1:1": "IB"}
    assert list(a.networks) == ["IB"]
    assert a.cuda_driver == "12040"
    kinds = {(c.src, c.dst, c.kind, c.gdr) for c in log.connections.values()}
    assert (0, 1, "P2P/CUMEM", False) in kinds and (1, 2, "NET/IB", True) in kinds
    assert log.coll_channels is not None and log.coll_channels[0] == 2
    assert log.nvls_channels is not None and log.nvls_channels[0] == 0
    assert log.rings is not None and log.rings[0] == 2 and log.ring_ranks == {0, 1, 2, 3}
    assert len(log.trees) == 1


def test_evidence_names_file_and_line() -> None:
    log = _parse("torchrun_2node_ib_gdr.log")
    line = log.hosts["gpu-a"].networks["IB"]
    assert line.lineno == 12 and line.ref().startswith("torchrun_2node_ib_gdr.log:12: [rank0]:gpu-a")


def test_slurm_labels_truncated_line_and_crlf() -> None:
    text = (FIX / "slurm_ib_nodevice_socket_fallback.log").read_text().replace("\n", "\r\n")
    log = parse_text(text, "slurm.out")
    assert set(log.hosts) == {"node-17", "node-18"}
    assert log.hosts["node-17"].ib_no_device is not None
    assert log.hosts["node-18"].socket_ifaces == {"ib0": "192.168.10.18"}
    # the cut "[se" line is an NCCL line but not a connection; the four whole ones are
    assert sum(c.count for c in log.connections.values()) == 4
    assert log.nccl_lines == 19


def test_cloudwatch_prefix_bare_version_goes_to_preceding_host() -> None:
    log = _parse("cloudwatch_version_env_mismatch.log")
    assert list(log.hosts["algo-1"].versions) == ["2.19.3+cuda12.2"]
    assert not log.hosts["algo-2"].versions
    assert log.hosts["algo-1"].env["NCCL_IB_HCA"][0] == "mlx5_0,mlx5_1"
    assert log.hosts["algo-2"].ib_devices == {"mlx5_2:1": "RoCE"}
    assert len(log.warnings) == 1 and len(log.rdma_errors) == 1


def test_nccl_2_4_ring_wording_and_mpirun_prefix() -> None:
    log = _parse("mpirun_nccl24_rings_docker0.log")
    assert list(log.hosts["node1"].versions) == ["2.4.8+cuda10.1"]
    assert log.hosts["node1"].env["NCCL_P2P_DISABLE"][0] == "1"  # trailing period of int params dropped
    assert log.ranks[1].host == "node1" and log.ranks[1].cuda_dev == 1  # from the [1,1]<stdout>: prefix
    kinds = {(c.src, c.dst, c.kind) for c in log.connections.values()}
    assert (3, 0, "NET/IB") in kinds and (0, 1, "SHM") in kinds
    assert log.hosts["node1"].bootstrap_ifaces == {"docker0": "172.17.0.1", "eth0": "10.5.0.1"}


def test_warn_with_timestamp_prefix_and_graph_print() -> None:
    log = _parse("h100_forced_nvls_few_channels.log")
    h = log.hosts["h100-a"]
    assert len(log.warnings) == 1 and log.warnings[0].lineno == 15
    assert h.nvlink is not None and h.nvswitch is not None
    assert h.nvls == {0: (False, h.nvls[0][1])}
    assert h.env["NCCL_MAX_NCHANNELS"][0] == "4"
    assert versions.intersect([(lo, hi) for lo, hi, _ in h.fingerprints]) == ((2, 27), (2, 27))


def test_nccl_2_30_wording() -> None:
    log = parse_text(
        "h:1:1 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_0:1/IB, [1] mlx5_1:1/IB} [1]mlx5_2:1/RoCE:0 [RO]; "
        "OOB eth0:1.2.3.4<0>\n"
        "[2026-01-01 10:00:00] h:1:2 [0] net_ib.cc:12 (ncclIbConnect) NCCL WARN NET/IB: Got completion from peer "
        "1.2.3.4<5> with status=12 opcode=0 len=0 vendor err 129\n"
        "h:1:1 [0] 123.456 init.cc:1 NCCL TRACE something\n"
    )
    assert log.hosts["h"].ib_devices == {"mlx5_0:1": "IB", "mlx5_1:1": "IB", "mlx5_2:1": "RoCE"}
    assert len(log.warnings) == 1 and len(log.rdma_errors) == 1 and log.nccl_lines == 3


def test_elided_host_prefix_is_still_read() -> None:
    log = parse_text("./all_reduce_perf -g 2\n...\nNCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1\n"
                     "[1] NCCL INFO Channel 00/0 : 1[21000] -> 0[1000] via P2P/direct pointer\n")
    assert log.nccl_lines == 2 and list(log.hosts) == ["(host not printed)"]
    assert log.tree_channels is not None and log.tree_channels[0] == 2
    assert [(c.src, c.dst, c.kind) for c in log.connections.values()] == [(1, 0, "P2P/direct")]


def test_transport_kinds() -> None:
    assert transport_kind("P2P/IPC/read") == ("P2P/IPC", False)
    assert transport_kind("P2P/CUMEM/CE") == ("P2P/CUMEM", False)
    assert transport_kind("P2P/direct pointer") == ("P2P/direct", False)
    assert transport_kind("SHM/direct/direct") == ("SHM", False)
    assert transport_kind("direct shared memory") == ("SHM", False)
    assert transport_kind("NET/IB/0(4)/GDRDMA(PCI)") == ("NET/IB", True)
    assert transport_kind("NET/Socket/1") == ("NET/Socket", False)
    assert transport_kind("NET/AWS Libfabric/0/GDRDMA".split(" ")[0]) == ("NET/AWS", False)


def test_version_fingerprints() -> None:
    assert versions.version_of_line("NET/Plugin : Plugin load (libnccl-net.so) returned 2 : x") == ((2, 17), (2, 18))
    assert versions.version_of_line("Bootstrap: Using eth0:1.2.3.4<0>") == ((2, 24), versions.ANY_HIGH)
    assert versions.version_of_line("NCCL version 2.21.5+cuda12.4") == ((2, 21), (2, 21))
    assert versions.version_of_line("Connected all rings") is None
    assert versions.intersect([((2, 17), (2, 18)), ((2, 19), (2, 20))]) is None
    assert versions.fmt_range(((2, 19), (2, 21))) == "2.19-2.21"


def test_non_nccl_text_yields_nothing() -> None:
    log = parse_text("epoch 1 loss 0.3\nNCCL is great\n[rank0]: hello\n")
    assert log.nccl_lines == 0 and not log.hosts


def test_topology_xml_full_file() -> None:
    s = parse_topo_xml((FIX / "topo_numa_mismatch_gdr_off.xml").read_text(), "t.xml")
    assert s.kind == "topology" and not s.truncated
    assert [(g.dev, g.numa, g.gdr, g.nvlink_count) for g in s.gpus] == [
        (0, 0, True, 18), (1, 0, False, 18), (2, 1, True, 18), (3, 1, True, 18)]
    assert [(n.name, n.speed_mbps, n.numa) for n in s.nets] == [("mlx5_0", 400000, 0), ("mlx5_1", 400000, 0)]
    g0, g2 = s.gpus[0], s.gpus[2]
    assert path_type(g0, s.nets[0]) == "PIX" and path_type(g0, s.nets[1]) == "PHB"
    assert path_type(g2, s.nets[0]) == "SYS"
    near = nearest_nic(s.gpus[1], s.nets)
    assert near is not None and near[0] == "PIX" and near[1].name == "mlx5_1"
    assert s.gpus[1].link_speed == "16.0 GT/s PCIe" and s.gpus[1].link_width == 8
    assert s.gpus[0].line == 5


def test_topology_xml_cut_mid_tag_is_truncated_but_read() -> None:
    s = parse_topo_xml((FIX / "topo_cut_mid_tag.xml").read_text(), "cut.xml")
    assert s.truncated and s.kind == "topology"
    assert len(s.gpus) == 2 and len(s.nets) == 2  # everything before the cut


def test_topology_xml_excerpt_starting_mid_file() -> None:
    text = '      <nvlink target="0000:c4:00.0" count="2"/>\n    </gpu>\n  </pci>\n</cpu>\n<cpu numaid="1">\n' \
           '<pci busid="0000:61:00.0" class="0x020700"><nic><net name="mlx5_4" dev="4" speed="200000" gdr="1"/>' \
           '</nic></pci></cpu>\n</system>\n'
    s = parse_topo_xml(text, "mid.xml")
    assert s.truncated and [n.name for n in s.nets] == ["mlx5_4"] and s.nets[0].numa == 1


def test_graph_schema() -> None:
    s = parse_topo_xml((FIX / "graph_dump.xml").read_text(), "g.xml")
    assert s.kind == "graph" and s.graphs[0]["nchannels"] == "2" and not s.gpus and not s.truncated


def test_xml_entities_are_not_expanded() -> None:
    bomb = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><system version="1"><cpu numaid="&a;"/></system>'
    s = parse_topo_xml(bomb, "bomb.xml")
    assert s.cpus == [{"numaid": "&a;"}]


# Any text, however mangled, parses without raising: pieces of real NCCL lines, cut and glued at random.
_PIECES = ["host:1:2 [0] NCCL INFO ", "NCCL WARN ", "Channel 00/0 : 0[0] -> 1[1] ", "via NET/IB/0/GDRDMA",
           "[send] ", "NCCL version 2.", "set by environment to ", "Bootstrap : Using eth0:1.2.3.4<0>",
           "NET/IB : Using [0]mlx5_0:1/RoCE", "comm 0x1 rank 3 nranks 4 cudaDev 1 busId 1a000", "[rank1]:",
           "<system>", "<gpu dev=\"0\" sm=\"90\">", "</pci>", "<nvlink count=\"x\"/>", "\n", "\r\n", "\x00", "é"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=12)), max_size=40))
def test_parsers_never_raise(parts: list[str]) -> None:
    text = "".join(parts)
    log = parse_text(text, "fuzz.log")
    diagnose(log, [parse_topo_xml(text, "fuzz.xml")])
