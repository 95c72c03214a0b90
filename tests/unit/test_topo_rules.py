"""Each topo finding id fires on a fixture that has the problem and stays quiet on a healthy one."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.findings.model import Finding
from ddpdoctor.topo.diagnose import diagnose, read_inputs
from ddpdoctor.topo.nccl_log import parse_text

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def _run(*names: str) -> tuple[dict, dict[str, Finding]]:
    logs = [FIX / n for n in names if n.endswith(".log")]
    xmls = [FIX / n for n in names if n.endswith(".xml")]
    inputs = read_inputs(logs, xmls)
    assert not inputs.problems
    sections, findings = diagnose(inputs.log, inputs.systems)
    return sections, {f.id: f for f in findings}


def _text(text: str) -> dict[str, Finding]:
    _, findings = diagnose(parse_text(text, "t.log"), [])
    return {f.id: f for f in findings}


def test_healthy_two_node_ib_job_has_no_findings_and_a_summary() -> None:
    sections, found = _run("torchrun_2node_ib_gdr.log")
    assert found == {}
    s = sections["summary"]
    assert (s["nodes"], s["gpus_per_node"], s["world_size"]) == (2, 2, 4)
    assert s["intra_node_transport"] == ["P2P/CUMEM"] and s["inter_node_transport"] == ["NET/IB"]
    assert s["gdr"] is True and s["network"] == ["IB"] and s["nccl_versions"] == ["2.22.3+cuda12.4"]
    hosts = {h["host"]: h for h in sections["hosts"]}
    assert hosts["gpu-b"]["ranks"] == [2, 3] and hosts["gpu-a"]["nccl_version_range"] == "2.22"
    assert [r["bus_id"] for r in sections["ranks"]] == ["18000", "2a000", "18000", "2a000"]
    t = sections["transports"]
    assert t["intra_node"] == {"P2P/CUMEM": 2} and t["inter_node"] == {"NET/IB": 4}
    assert {(p["src"], p["dst"], p["transport"], p["inter_node"]) for p in t["peers"]} >= {
        (0, 1, "P2P/CUMEM/read", False), (3, 0, "NET/IB/0/GDRDMA", True)}
    assert sections["channels"] == {"coll_channels": 2, "collnet_channels": 2, "nvls_channels": 0, "rings": 2,
                                    "ranks_in_rings": 4, "tree_channels": 2, "trees": ["Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2"]}


def test_socket_fallback_with_ipoib_present() -> None:
    sections, found = _run("slurm_ib_nodevice_socket_fallback.log")
    f = found["net-socket-internode"]
    assert f.severity.value == "error" and f.ranks == [0, 1]
    assert any("via NET/Socket/0" in ln for ln in f.evidence["lines"])
    assert found["net-device-missing"].severity.value == "error"
    assert "NET/IB : No device found" in " ".join(found["net-device-missing"].evidence["lines"])
    assert sections["summary"]["gdr"] is False


def test_version_and_env_mismatch_and_roce_error() -> None:
    _, found = _run("cloudwatch_version_env_mismatch.log")
    vm = found["nccl-version-mismatch"]
    # algo-1: 2.19.3 printed; algo-2: "NET/Plugin: Using internal network plugin." only exists in 2.21
    assert vm.evidence["host_ranges"] == {"algo-1": "2.19", "algo-2": "2.21"}
    assert "NCCL_IB_HCA" in found["env-mismatch"].evidence["differences"][0]
    assert found["roce-network-error"].title.startswith("The RoCE network")


def test_not_distributed() -> None:
    _, found = _run("not_distributed.log")
    assert found["not-distributed"].evidence["processes"] == 2
    assert found["not-distributed"].severity.value == "error"


def test_forced_algo_few_channels_and_nvls_with_hopper_topology() -> None:
    _, log_only = _run("h100_forced_nvls_few_channels.log")
    assert log_only["nvls-unavailable"].severity.value == "info"  # GPU generation unknown from the log alone
    assert log_only["few-channels"].evidence["channels"] == 4
    assert "forced-algo-ignored" in log_only
    _, both = _run("h100_forced_nvls_few_channels.log", "topo_numa_mismatch_gdr_off.xml")
    assert both["nvls-unavailable"].severity.value == "warning"  # sm=90 + NVSwitch links in the XML


def test_old_nccl_docker0_p2p_off_ib_error() -> None:
    sections, found = _run("mpirun_nccl24_rings_docker0.log")
    assert found["bad-socket-ifname"].evidence["interfaces"] == ["node1: docker0 (172.17.0.1)"]
    assert found["p2p-disabled"].severity.value == "warning"
    assert found["gdr-disabled"].severity.value == "warning"
    assert "error 12" in found["roce-network-error"].evidence["lines"][0]
    assert sections["summary"]["nodes"] == 2  # peers 2,3 reached over NET live on another node


def test_topology_findings() -> None:
    sections, found = _run("topo_numa_mismatch_gdr_off.xml")
    assert found["nic-numa-mismatch"].evidence["gpu_numa"] == [1]
    assert "gdr=0" in found["gdr-disabled"].evidence["lines"][0]
    assert "16.0 GT/s" in found["pcie-link-degraded"].evidence["lines"][0]
    assert "topology-truncated" not in found
    topo = sections["topology"][0]
    assert [g["nic_distance"] for g in topo["gpus"]] == ["PIX", "PIX", "SYS", "SYS"]


def test_p2p_level_sys_and_consumer_gpus() -> None:
    found = _text(
        "#  Rank  0 Group  0 Pid   10 on box device  0 [0x01] NVIDIA GeForce RTX 3090\n"
        "#  Rank  1 Group  0 Pid   10 on box device  1 [0x02] NVIDIA GeForce RTX 3090\n"
        "box:10:10 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n"
        "box:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
    )
    assert "NCCL_P2P_LEVEL=SYS" in found["p2p-pcie-risk"].title
    assert "GeForce" in found["p2p-pcie-risk"].title


def test_few_nics_and_gdr_disabled_for_hca() -> None:
    lines = ["n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
             "n1:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'",
             "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
             "n1:1:1 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0"]
    found = _text("\n".join(lines))
    assert found["few-nics"].evidence == {"host": "n1", "nics": 1, "gpus_per_node": 8, "lines": [
        "t.log:1: " + lines[0]]}
    assert len(found["gdr-disabled"].evidence["lines"]) == 2


def test_gdr_level_loc_and_ib_disable_env() -> None:
    found = _text("h:1:1 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to LOC\n"
                  "h:1:1 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n")
    assert set(found) == {"gdr-disabled-by-env", "ib-disabled-by-env"}


def test_nvlink_unused_when_sxm_gpus_use_shm() -> None:
    found = _text("#  Rank  0 Group  0 Pid   1 on h device  0 [0x07] NVIDIA A100-SXM4-80GB\n"
                  "#  Rank  1 Group  0 Pid   2 on h device  1 [0x0f] NVIDIA A100-SXM4-80GB\n"
                  "h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n")
    assert "SHM" in found["nvlink-unused"].title


def test_tunnel_iface_is_bad_and_normal_iface_is_not() -> None:
    assert "bad-socket-ifname" in _text("h:1:1 [0] NCCL INFO Bootstrap : Using tailscale0:100.64.0.2<0>\n")
    assert "bad-socket-ifname" in _text("h:1:1 [0] NCCL INFO NET/Socket : Using [0]virbr0:192.168.122.1<0>\n")
    assert "bad-socket-ifname" not in _text("h:1:1 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.3<0>\n")


def test_socket_network_severity_follows_what_the_log_proves() -> None:
    one_host = "h:1:1 [0] NCCL INFO Using network Socket\n"
    assert _text(one_host)["net-socket-internode"].severity.value == "warning"  # node count unknown
    two_hosts = one_host + "g:2:2 [0] NCCL INFO Using network Socket\n"
    assert _text(two_hosts)["net-socket-internode"].severity.value == "error"
    single_node = one_host + "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
    assert "net-socket-internode" not in _text(single_node)
