"""Issue 39's classes of logs (and issue 37 item 6), on the real texts of tests/fixtures/logs/real: NCCL's `Last
error:` cause in the finding, one-line pastes cut back into records, a start-up that never fills the store barrier, a
store that never answered, DDP's reducer "marked as ready twice" hard-wrapped, FSDP/DTensor errors with their cause,
and a healthy training log that is "no failure found", not bad input."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.logs.causes import nccl_cause
from ddpdoctor.logs.explain import explain_paths, explain_texts
from ddpdoctor.logs.lines import records

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real"


def _first(name: str):  # noqa: ANN202 - a Finding
    report = explain_paths([str(REAL / name)])
    assert report.findings, report.notes
    return report.findings[0]


def test_last_error_names_the_cause_in_title_evidence_and_advice() -> None:
    f = _first("nccl_duplicate_gpu_last_error_mambair39.log")
    assert f.id == "nccl-error"
    assert "ranks 0 and 2 on one GPU (CUDA device 4000)" in f.title
    assert f.evidence["cause_kind"] == "usage" and "Duplicate GPU" in f.evidence["cause_line"]
    assert f.advice.startswith("Give each process its own GPU") and "set_device" in f.advice


def test_duplicate_gpu_as_the_nccl_warn_itself() -> None:
    f = _first("nccl_duplicate_gpu_warn_mpirun_horovod3929.log")
    assert f.evidence["cause"].startswith("ranks 0 and 2 on one GPU")


def test_one_line_paste_is_cut_back_and_the_network_cause_wins_over_the_remote_error() -> None:
    f = _first("nccl_remote_ib_error12_one_line_alpaca207.log")
    assert f.id == "nccl-error" and f.title.startswith("Network error")
    assert "completion error 12 (transport retry counter exceeded)" in f.title
    assert "11.214.147.122<39138>" in f.title and "ibstat" in f.advice


def test_the_cause_family_across_nccl_versions() -> None:
    cases = {
        "NET/IB : Got completion from peer 10.0.0.1<1234> with error 12, opcode 0, len 0, vendor err 129": "network",
        "NET/IB : Got completion from peer 10.0.0.1<1234> with status=4 opcode=0 len=0 vendor err 81 (Send)": "network",
        "NET/IB: Got completion from peer 10.0.0.1<1234> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) "
        "vendor_err=129 hca mlx5_0": "network",
        "NET/OFI Request 0x7fbb completed with error. RC: 20. Error: unknown error.": "network",
        "Bootstrap : no socket interface found": "network",
        "Net : Connect to 10.1.1.1<4444> failed : Connection refused": "network",
        "Call to ibv_create_qp failed": "network",
        "Error: failed to extend /dev/shm/nccl-abc to 9637892 bytes": "host",
        "Cuda failure 'invalid device ordinal'": "gpu",
        "NET/Socket : peer 10.0.0.2<3> message truncated : receiving 1024 bytes instead of 512.": "usage",
        "Invalid rank requested : 9/8": "usage",
        "socketProgress: Connection closed by remote peer node2<4567>": "peer",
    }
    for text, where in cases.items():
        cause = nccl_cause(text)
        assert cause is not None and cause.where == where, (text, cause)
    ib = nccl_cause("NET/IB: Got completion from peer h<1> with status=IBV_WC_LOC_PROT_ERR(4) opcode=X(0) vendor_err=0")
    assert ib is not None and "local protection" in ib.name
    assert nccl_cause("NCCL WARN something new") is None


def test_remote_error_whose_last_error_is_a_closed_peer_stays_a_victim() -> None:
    text = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or "
            "there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed possibly due to a network "
            "error or a remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by remote "
            "peer node2<4567>\n")
    assert "nccl-error" not in [f.id for f in explain_texts({"rank3.log": text})]


def test_store_barrier_that_never_fills_is_a_hang_at_start_up() -> None:
    f = _first("store_barrier_never_fills_lightning4420.log")
    assert f.id == "hang" and f.evidence["phase"] == "init"
    assert (f.evidence["arrived"], f.evidence["expected"]) == (7, 8)
    assert f.evidence["stalled_ranks"] == [0, 1, 2, 3, 5, 6, 7]  # rank 4 never arrived
    many = _first("store_barrier_too_many_workers_yolov5_4574.log")
    assert (many.evidence["arrived"], many.evidence["expected"]) == (8, 4) and "two jobs share" in many.title


def test_store_barrier_timeout_of_torch_2() -> None:
    text = ("[rank3]: torch.distributed.DistStoreError: Timed out initializing process group in store based barrier on "
            "rank 3, for key: store_based_barrier_key:1 (world_size=4, num_workers_joined=2, timeout=0:30:00 "
            "error=wait timeout after 30000ms, keys: /store_based_barrier_key:1:last_worker)\n")
    (f,) = explain_texts({"job.log": text})
    assert f.id == "hang" and (f.evidence["arrived"], f.evidence["expected"]) == (2, 4) and "before its timeout" in f.title


def test_c10d_socket_warnings_then_torchruns_traceback_are_a_store_timeout() -> None:
    f = _first("store_socket_timeout_torchrun_msswift3343.log")
    assert f.id == "store-failure" and f.title.startswith("The c10d store timed out after 900 s")
    assert f.evidence["store_addresses"] == ["::ffff:33.148.62.162:23456"] and f.evidence["waited_ms"] == 900000


def test_agents_role_info_wait_timeout() -> None:
    text = ("torch.distributed.DistStoreError: wait timeout after 900000ms, keys: /none/torchelastic/role_info/0, "
            "/none/torchelastic/role_info/1\n")
    (f,) = explain_texts({"node1.err": text})
    assert "torchrun's agents on the other nodes" in f.title and "role_info" in f.evidence["keys"]


def test_ready_twice_hard_wrapped_inside_the_parameter_name() -> None:
    f = _first("ddp_ready_twice_wrapped_msswift3446.log")
    assert f.id == "param-ready-twice" and f.ranks == [0]
    assert f.evidence["parameter"] == "base_model.model.model.layers.27.mlp.down_proj.lora_B.default.weight"
    assert "use_reentrant=False" in f.advice and "static_graph" in f.advice
    wrapped = ("[rank0]: Parameter at index 279 with name base_model.model.model.layers.27.mlp.do\n"
               "wn_proj.lora_B.default.weight has been marked as ready twice. This means that multiple autograd\n")
    (g,) = explain_texts({"job.log": wrapped})
    assert g.evidence["parameter"].endswith("mlp.down_proj.lora_B.default.weight")
    index_only = _first("ddp_ready_twice_index_only_chatglm114.log")
    assert index_only.evidence["parameter_index"] == 55 and "rank-crashed" not in [index_only.id]


def test_fsdp_and_dtensor_errors_with_cause_and_rank() -> None:
    f = _first("fsdp_uniform_requires_grad_transformers27542.log")
    assert f.id == "fsdp-error" and "requires_grad in one FSDP unit" in f.title and "use_orig_params=True" in f.advice
    assert "placement" in _first("dtensor_sharding_propagation_pytorch164543.log").evidence["cause"]
    assert "placement" in _first("dtensor_placements_expected_torchtitan3762.log").evidence["cause"]
    text = ("[rank5]: Traceback (most recent call last):\n[rank5]:   File \"/w/train.py\", line 12, in main\n"
            "[rank5]:     model = fully_shard(model)\n[rank5]: ValueError: output tensor size must be equal to "
            "world_size times input tensor size\n")
    (g,) = explain_texts({"job.log": text})
    assert g.id == "fsdp-error" and g.ranks == [5] and "different sizes" in g.title
    assert g.evidence["call_sites"] == {"5": "/w/train.py:12"}
    meta = explain_texts({"r.log": "RuntimeError: FSDP parameters should be materialized from meta device before "
                                   "training, but the following were still on meta device: ['w']\n"})
    assert "meta" in meta[0].title


def test_a_healthy_training_log_is_no_failure_found_not_bad_input(tmp_path: Path) -> None:
    report = explain_paths([str(REAL / "healthy_ddp_mmdet_reducer_rebuilt_proposalcontrast3.log")])
    assert report.findings == [] and any("no failure found" in n for n in report.notes)
    log = tmp_path / "train.log"
    log.write_text("[I reducer.cpp:1258] Reducer buckets have been rebuilt in this iteration.\n"
                   "Epoch 1/10: 100%|##########| 50/50 [00:10<00:00,  4.91it/s, loss=0.693]\n")
    report = explain_paths([str(log)])
    assert report.findings == [] and any("no failure found" in n for n in report.notes)


def test_records_cut_in_one_pass_and_never_from_their_own_prefix() -> None:
    record = "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. "
    for n in (50, 100):  # two sizes: pieces grow with the records, one regex pass over the line
        assert len(list(records(record * n))) == n
    prefixed = "[rank1]: RuntimeError: " + "x" * 200
    assert list(records(prefixed)) == [prefixed]
    assert list(records("short line RuntimeError: x")) == ["short line RuntimeError: x"]


def test_mp_spawn_reraise_names_the_child_and_the_users_call_site() -> None:
    # torch.multiprocessing.spawn (and launchers built on it) re-raises a child's exception in the parent as
    # ProcessRaisedException, with the child's traceback after "-- Process N terminated with the following error:"
    # (spawn.py, torch 1.8-2.13; the wording as in greatlog/SWAHR-HumanPose#11): the crash is process N's own, at the
    # user's line inside the child, not the parent's mp.spawn call.
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/train.py", line 60, in <module>\n'
        "    mp.spawn(main, args=(world_size,), nprocs=world_size, join=True)\n"
        '  File "/usr/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 160, in join\n'
        "    raise ProcessRaisedException(msg, error_index, failed_process.pid)\n"
        "torch.multiprocessing.spawn.ProcessRaisedException:\n\n"
        "-- Process 1 terminated with the following error:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 69, in _wrap\n'
        "    fn(i, *args)\n"
        '  File "/home/u/train.py", line 22, in step\n'
        '    raise ValueError("corrupt sample in shard 7")\n'
        "ValueError: corrupt sample in shard 7\n")
    (f,) = explain_texts({"spawn.log": text})
    assert f.id == "rank-crashed" and f.ranks == [1] and "ValueError: corrupt sample" in f.title
    assert f.evidence["call_site"] == "/home/u/train.py:22"


def test_undoing_a_hard_wrap_never_swallows_a_record_after_fixed_width_lines() -> None:
    # Progress bars are lines of one width, like a terminal's wrap: what follows them stays a record of its own.
    bar = " 4{i}%|####      | 4{i}/100 [00:10<00:12,  4.51it/s] loss=0.6931 lr=0.0001 grad=1.23 step=4{i} "
    text = "".join(bar.format(i=i) + "\n" for i in range(5)) + "Killed\n"
    found = explain_texts({"rank1.log": text})
    assert [f.id for f in found] == ["rank-crashed"] and "SIGKILL" in found[0].title


def test_a_long_warning_that_names_an_error_is_not_cut_into_a_failure() -> None:
    line = ("/usr/lib/python3.10/site-packages/transformers/trainer.py:1234: UserWarning: this option is deprecated "
            "and will raise a RuntimeError: in a future release of the library; please migrate to the new option now")
    assert list(records(line)) == [line]
    assert explain_texts({"rank0.log": line + "\nEpoch 1 loss 0.5\n"}) == []


def test_the_one_gate_passes_every_line_either_reader_takes() -> None:
    # explain._EITHER replaces two searches per line (messages._ANY, explain._MAYBE_FAILURE) on the bulk of a log:
    # every line either of them matches must pass it (the words of both, in any case).
    import random

    from ddpdoctor.logs.explain import _EITHER, _MAYBE_FAILURE
    from ddpdoctor.logs.messages import _ANY

    words = [w for w in (_ANY.pattern + "|" + _MAYBE_FAILURE.pattern).replace("\\(", "(").split("|")]
    words = [w.replace("[Ll]", "L") for w in words]
    rng = random.Random(40)
    for _ in range(5000):
        w = rng.choice(words)
        w = "".join(c.upper() if rng.random() < 0.5 else c for c in w)
        text = "x" * rng.randint(0, 5) + w + " y"
        if _ANY.search(text) or _MAYBE_FAILURE.search(text.lower()):
            assert _EITHER.search(text.lower()), text
    for w in words:
        assert _EITHER.search(w.lower()), w


def test_a_run_of_rank_prefixes_is_read_as_the_prefix_loop_reads_it() -> None:
    # lines._RANK_RUN matches the whole run of stacked prefixes at once (cached rank per run text): the same text
    # consumed and the same rank as matching _RANK_PREFIX again and again, on random soups of prefix pieces.
    import random

    from ddpdoctor.logs.lines import _RANK_PREFIX, _RANK_RUN, _run_rank

    pieces = ["[default", "[rank", "]", ":", " ", "1", "23", "[4,5]", "<stdout>", "<stderr>", ",", "[", "x", "]:"]
    rng = random.Random(40)
    for _ in range(20000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        rest, rank = line, None
        while m := _RANK_PREFIX.match(rest):
            rank = int(m.group(m.lastindex or 1))
            rest = rest[m.end():]
        run = _RANK_RUN.match(line)
        assert (run.end() if run else 0) == len(line) - len(rest), line
        if run:
            assert _run_rank(run.group()) == rank, line
