"""topo's extra evidence (ddpdoctor/topo/evidence.py): nccl-tests device lines, PCIe switch IDs, OFI without EFA
devices, one-rank communicators on every node, ncclMaxSharedMem. Lines in the formats the sources print."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.commands.topo import build_report


def _ids(tmp_path: Path, *texts: str) -> dict[str, object]:
    paths = []
    for i, text in enumerate(texts):
        p = tmp_path / f"node{i}.log"
        p.write_text(text)
        paths.append(p)
    return {f.id: f for f in build_report(paths, []).findings}


HEADER = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 "
          "validation: 1 graph: 0\n#\n# Using devices\n")


def test_consumer_gpus_from_nccl_tests_header(tmp_path: Path) -> None:
    text = HEADER + ("#  Rank  0 Group  0 Pid  41410 on   tinybox device  0 [0x01] NVIDIA GeForce RTX 4090\n"
                     "#  Rank  1 Group  0 Pid  41410 on   tinybox device  1 [0000:41:00] NVIDIA GeForce RTX 4090\n")
    found = _ids(tmp_path, text)
    f = found.get("p2p-consumer-gpu") or found.get("p2p-pcie-risk")
    assert f is not None, found


def test_plx_switch_in_topology_print(tmp_path: Path) -> None:
    text = ("box:1:1 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
            "box:1:1 [0] NCCL INFO === System : maxBw 12.0 totalBw 24.0 ===\n"
            "box:1:1 [0] NCCL INFO CPU/0 (1/1/2)\n"
            "box:1:1 [0] NCCL INFO + PCI[24.0] - PCI/3000 (10b5874710b58747)\n"
            "box:1:1 [0] NCCL INFO               + PCI[24.0] - GPU/4000 (0)\n")
    f = _ids(tmp_path, text)["gpus-behind-pcie-switch"]
    assert "PLX" in f.title


def test_ofi_plugin_without_efa_device(tmp_path: Path) -> None:
    text = ("ip-10-0-0-1:77:77 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
            "ip-10-0-0-1:77:77 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.9.1-aws\n"
            "ip-10-0-0-1:77:77 [0] NCCL WARN NET/OFI Unable to find a protocol that worked.  Failing initialization.\n"
            "libfabric:77:1700000000::efa:core:efa_device_list_initialize():60<warn> No EFA devices found\n")
    assert "ofi-no-efa-device" in _ids(tmp_path, text)


def test_nccl_tests_without_mpi_on_two_nodes(tmp_path: Path) -> None:
    a = HEADER + "#  Rank  0 Group  0 Pid  1000 on  node-a device  0 [0x07] NVIDIA H100 80GB HBM3\n"
    b = HEADER + "#  Rank  0 Group  0 Pid  2000 on  node-b device  0 [0x07] NVIDIA H100 80GB HBM3\n"
    f = _ids(tmp_path, a, b)["nccl-tests-no-mpi"]
    assert f.evidence["hosts"] == ["node-a", "node-b"]


def test_max_shared_mem_warning(tmp_path: Path) -> None:
    text = ("g:5:5 [0] NCCL INFO NCCL version 2.26.2+cuda12.2\n"
            "g:5:5 [0] NCCL WARN cudaArch 1200 ncclMaxSharedMem 232448 exceeds device/fn maxSharedMem 101376\n")
    assert "nccl-shared-mem-exceeded" in _ids(tmp_path, text)


def test_each_node_its_own_communicator(tmp_path: Path) -> None:
    a = "".join(f"node-a:1{r}:2{r} [{r}] NCCL INFO comm 0x55aa{r} rank {r} nranks 2 cudaDev {r} busId {r}000 - Init "
                f"COMPLETE\n" for r in range(2))
    b = a.replace("node-a", "node-b")
    f = _ids(tmp_path, a, b)["comm-per-node"]
    assert f.evidence == {"hosts": ["node-a", "node-b"], "nranks": 2}
    assert "comm-per-node" not in _ids(tmp_path, a)


def test_plx_switch_in_topology_xml(tmp_path: Path) -> None:
    xml = tmp_path / "topo.xml"
    xml.write_text('<system version="1"><cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel">'
                   '<pci busid="0000:03:00.0" class="0x060400" vendor="0x10b5" device="0x8747" link_speed="8.0 GT/s PCIe"'
                   ' link_width="16"><pci busid="0000:05:00.0" class="0x030200" vendor="0x10de" device="0x1db4">'
                   '<gpu dev="0" sm="70" rank="0" gdr="1"/></pci></pci></cpu></system>')
    found = {f.id: f for f in build_report([], [xml]).findings}
    assert "PLX" in found["gpus-behind-pcie-switch"].title


def _no_mpi_process(tag: str, host: str, pid: int) -> str:
    """One process of `mpirun -np N all_reduce_perf -g 1` built without MPI=1: its own header, 'Rank 0', a 1-rank
    communicator, and NCCL's network lines (which then describe no job at all)."""
    lines = [*HEADER.splitlines(), f"#  Rank  0 Group  0 Pid {pid:6d} on {host} device  0 [0x07] NVIDIA H100 80GB HBM3",
             f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using eth0:10.0.0.{pid % 200}<0>",
             f"{host}:{pid}:{pid} [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.{pid % 200}<0>",
             f"{host}:{pid}:{pid} [0] NCCL INFO Using network Socket",
             f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.18.1+cuda12.1",
             f"{host}:{pid}:{pid + 5} [0] NCCL INFO comm 0x55aa{pid} rank 0 nranks 1 cudaDev 0 busId 7000 commId 0x12 - "
             "Init COMPLETE",
             "# Avg bus bandwidth    : 0 "]
    return "".join(f"{tag}{ln}\n" for ln in lines)


def test_nccl_tests_without_mpi_under_mpirun_on_one_host(tmp_path: Path) -> None:
    # Before: 'not-distributed' (each process its own communicator) and nothing about the build.
    text = "".join(_no_mpi_process(f"[1,{i}]<stdout>:", "node-a", 1000 + i) for i in range(4))
    found = _ids(tmp_path, text)
    assert list(found) == ["nccl-tests-no-mpi"], list(found)
    assert found["nccl-tests-no-mpi"].evidence["mpi_ranks_printing_rank_0"] == ["0", "1", "2", "3"]


def test_nccl_tests_without_mpi_on_two_hosts_hides_the_rank_layout_findings(tmp_path: Path) -> None:
    text = "".join(_no_mpi_process(f"[1,{i}]<stdout>:", "node-a" if i < 2 else "node-b", 1000 + i) for i in range(4))
    assert list(_ids(tmp_path, text)) == ["nccl-tests-no-mpi"]


def test_two_single_gpu_runs_in_one_log_are_not_nccl_tests_without_mpi(tmp_path: Path) -> None:
    # The same host, no mpirun: someone ran all_reduce_perf twice; nothing says MPI was meant.
    text = _no_mpi_process("", "node-a", 1000) + _no_mpi_process("", "node-a", 2000)
    assert "nccl-tests-no-mpi" not in _ids(tmp_path, text)
