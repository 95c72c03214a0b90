"""Runs on every rank of a preflight job: local checks, rendezvous, then the checks that need the process group.

Started by the launcher in place of the bootstrap (LaunchSpec.program). Settings arrive in $DDPDOCTOR_CONFIG
(``options``). After every check the rank rewrites RUN/ranks/rankR/preflight.json, so a rank that is killed
mid-way still leaves what it measured; rank 0 also writes RUN/preflight.json with every rank's record, gathered
through the process group (for multi-node jobs without a shared file system)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Started as a file: make the package importable the way the launcher saw it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ddpdoctor.preflight import local  # noqa: E402
from ddpdoctor.preflight.checks import FAIL, SKIPPED  # noqa: E402
from ddpdoctor.preflight.comm_checks import (  # noqa: E402
    allreduce_latency,
    bandwidth_sweep,
    clock_skew,
    collectives,
    compute,
)
from ddpdoctor.preflight.netprobe import probe_tcp  # noqa: E402
from ddpdoctor.preflight.record import CheckOutcome, RankPreflight  # noqa: E402
from ddpdoctor.probes.config import ProbeConfig, rank_from_env  # noqa: E402
from ddpdoctor.rundir.layout import RunDir, write_json  # noqa: E402

KEY_PREFIX = "ddpdoctor/preflight"
EXIT_TIMED_OUT = 3
STALL_ENV = "DDPDOCTOR_PREFLIGHT_STALL"  # "RANK:CHECK": that rank hangs in that check (tests the timeouts)


def _stall() -> CheckOutcome:
    time.sleep(3600)
    return {}


class Worker:
    """One rank's preflight: a record of check results, saved after each check."""

    def __init__(self, config: ProbeConfig) -> None:
        self.opts = config.probe_options()
        self.rank, self.world_size, self.local_rank = rank_from_env()
        self.run = RunDir(Path(config.run_dir))
        self.timeout = float(self.opts.get("check_timeout", 20))
        self.device: Any = None
        self.broken: str | None = None  # the check after which the process group is unusable
        self.record: RankPreflight = {
            "rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
            "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "finished": False,
            "env": local.launcher_env(), "dist_env": local.dist_env(), "checks": {},
        }
        self._lock = threading.Lock()

    def save(self) -> None:
        with self._lock:
            write_json(self.run.rank_file(self.rank, "preflight.json"), self.record)

    def set_check(self, cid: str, result: CheckOutcome, seconds: float | None = None) -> None:
        if seconds is not None:
            result = {**result, "seconds": round(seconds, 3)}
        self.record["checks"][cid] = result
        self.save()

    def watchdog(self, cid: str) -> threading.Timer:
        """A started timer that records ``cid`` as timed out and ends the rank (exit 3) unless cancelled first.

        The process-group and store timeouts should fire first; this is the backstop for anything stuck
        outside them (a hung nvidia-smi or file system, a communicator that never forms)."""
        budget = 2 * self.timeout + 5

        def expire() -> None:
            self.record["checks"][cid] = {"status": FAIL, "summary": f"timed out after {budget:.0f} s on rank {self.rank}",
                                          "evidence": {"timeout_s": budget}, "seconds": budget}
            self.save()
            os._exit(EXIT_TIMED_OUT)

        timer = threading.Timer(budget, expire)
        timer.daemon = True
        timer.start()
        return timer

    def guarded(self, cid: str, fn: Callable[[], CheckOutcome], uses_pg: bool = True) -> None:
        """Run one check under a watchdog: a check that outlives its budget ends the rank (exit 3), after
        recording the timeout, so a stuck rank can never hang the preflight."""
        if uses_pg and self.broken is not None:
            self.set_check(cid, {"status": SKIPPED, "summary": f"process group unusable after {self.broken} failed",
                                 "evidence": {}})
            return
        started = time.monotonic()
        if os.environ.get(STALL_ENV) == f"{self.rank}:{cid}":
            fn = _stall
        timer = self.watchdog(cid)
        try:
            result = fn()
        except Exception as exc:  # a peer died or the collective timed out: record it, skip the rest
            result = {"status": FAIL, "summary": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                      "evidence": {"error": str(exc)[:2000], "traceback": traceback.format_exc(limit=4)[-2000:]}}
            if uses_pg:
                self.broken = cid
        finally:
            timer.cancel()
        self.set_check(cid, result, time.monotonic() - started)

    # -- local facts, before any network -------------------------------------------------------------

    def local_checks(self) -> None:
        try:
            self.record["versions"] = local.versions()
            self.record["devices"] = local.devices(self.local_rank)
            self.record["ib_ports"] = local.ib_ports()
        except Exception as exc:  # a broken CUDA install must still leave a record that says so
            self.record.setdefault("versions", {})
            self.record["devices"] = {"cuda_available": False, "count": 0, "uuid": None,
                                      "error": f"{type(exc).__name__}: {exc}"}
        self.save()
        self.guarded("gpu_health", lambda: local.gpu_health(self.record["devices"].get("uuid")), uses_pg=False)
        self.guarded("checkpoint_dir", lambda: local.checkpoint_dir(
            self.opts.get("checkpoint_dir"), float(self.opts.get("min_free_gb", 1.0)), self.rank), uses_pg=False)

    def backend(self) -> str:
        import torch.distributed as dist

        wanted = self.opts.get("backend", "auto")
        if wanted != "auto":
            return str(wanted)
        devs = self.record["devices"]
        if devs["cuda_available"] and self.local_rank < devs["count"] and dist.is_nccl_available():
            return "nccl"
        return "gloo"

    # -- rendezvous ----------------------------------------------------------------------------------

    def rendezvous(self) -> bool:
        import torch
        import torch.distributed as dist

        backend = self.backend()
        self.record["backend"] = backend
        addr = os.environ.get("MASTER_ADDR", "")
        raw_port = os.environ.get("MASTER_PORT", "")
        port = int(raw_port) if raw_port.isdigit() else -1
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        td = timedelta(seconds=self.timeout)
        started = time.monotonic()
        # an evidence map (free-form per check: shown and copied into the finding)
        evidence: dict[str, Any] = {"master_addr": addr, "master_port": port, "timeout_s": self.timeout,
                                    "agent_store": agent_store}
        stage = "connect to the rendezvous store"
        if not addr or not 0 < port < 65536:
            evidence["error"] = f"MASTER_ADDR={addr!r} MASTER_PORT={raw_port!r}: both must be set, the port 1-65535"
            self.set_check("rendezvous", {"status": FAIL, "summary": "MASTER_ADDR/MASTER_PORT missing or invalid",
                                          "evidence": {**evidence, "probe": {"cause": "address" if not addr else "port",
                                                                            "detail": evidence["error"]}}})
            return False
        try:
            store = dist.TCPStore(addr, port, self.world_size, is_master=self.rank == 0 and not agent_store,
                                  timeout=td, wait_for_workers=False)
            stage = "wait for every rank"
            store.set(f"{KEY_PREFIX}/joined/{self.rank}", socket.gethostname())
            keys = [f"{KEY_PREFIX}/joined/{r}" for r in range(self.world_size)]
            try:
                store.wait(keys, td)
            except Exception:
                evidence["missing_ranks"] = [r for r in range(self.world_size) if not store.check([keys[r]])]
                raise
            stage = "init_process_group"
            if backend == "nccl":
                torch.cuda.set_device(self.local_rank)
                self.device = torch.device("cuda", self.local_rank)
            else:
                self.device = torch.device("cpu")
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=td)
        except Exception as exc:
            evidence.update(stage=stage, error=str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__)
            if "missing_ranks" not in evidence:
                evidence["probe"] = probe_tcp(addr, port, timeout=min(5.0, self.timeout)).to_json()
            self.set_check("rendezvous", {"status": FAIL, "summary": f"failed at: {stage}", "evidence": evidence},
                           time.monotonic() - started)
            return False
        evidence["backend"] = backend
        self.set_check("rendezvous", {"status": "pass", "summary": f"joined in {time.monotonic() - started:.2f} s",
                                      "evidence": evidence}, time.monotonic() - started)
        return True

    # -- checks over the process group ----------------------------------------------------------------

    def pg_checks(self) -> None:
        o = self.opts
        dev = self.device
        self.guarded("collectives", lambda: collectives(dev))
        self.guarded("allreduce_latency", lambda: allreduce_latency(dev, o.get("max_latency_us")))
        # nccl-tests' usual 256 MB top size on GPUs; 64 MB on CPU, where gloo moves ~0.5 GB/s and 256 MB costs seconds.
        max_size = o.get("max_size") or ((256 << 20) if dev.type == "cuda" else (64 << 20))
        self.guarded("allreduce_bandwidth", lambda: bandwidth_sweep(dev, int(max_size)))
        self.guarded("compute", lambda: compute(dev))
        self.guarded("clock_skew", lambda: clock_skew(dev))

    def gather(self) -> None:
        import torch.distributed as dist

        if self.broken is not None:
            return
        self.record["finished"] = True
        records: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(records, self.record)
        except Exception:
            return
        if self.rank == 0:
            write_json(self.run.root / "preflight.json", {"ranks": {str(r["rank"]): r for r in records if r}})


def main() -> int:
    from ddpdoctor.launch.proctree import die_with_parent

    die_with_parent()  # torchrun (or ddpdoctor) gone: the worker goes too, wherever it waits
    config = ProbeConfig.from_env()
    if config is None:
        print("ddpdoctor preflight worker: $DDPDOCTOR_CONFIG is not set (start it through `ddpdoctor preflight`)",
              file=sys.stderr)
        return 2
    worker = Worker(config)
    worker.save()
    worker.local_checks()
    timer = worker.watchdog("rendezvous")
    joined = worker.rendezvous()
    timer.cancel()
    if joined:
        import torch.distributed as dist

        worker.pg_checks()
        worker.gather()
        worker.record["finished"] = True
        worker.save()
        try:
            if worker.broken is None:
                dist.barrier()  # rank 0 may host the store: nobody leaves before everyone is done with it
            dist.destroy_process_group()
        except Exception:
            pass
    else:
        worker.record["finished"] = True
        worker.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
