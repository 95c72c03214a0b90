"""Runs in every rank before the user's script: installs the probes, runs the script with runpy, records how it ended.

torchrun starts this file instead of the script; the script's path, arguments and the probe settings
arrive in $DDPDOCTOR_CONFIG. The script sees the usual ``__main__``, ``sys.argv`` and tracebacks."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Started as a file by torchrun: make the package importable the way the launcher saw it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ddpdoctor.probes import rank_info  # noqa: E402
from ddpdoctor.probes.config import ProbeConfig, rank_from_env  # noqa: E402
from ddpdoctor.probes.ddp_recorder import DDPRecorder  # noqa: E402
from ddpdoctor.probes.parallelism import ParallelismRecorder  # noqa: E402
from ddpdoctor.probes.records import RankInfoDoc, RankStatusDoc  # noqa: E402
from ddpdoctor.probes.steps import StepTracker  # noqa: E402
from ddpdoctor.rundir.layout import RunDir, write_json  # noqa: E402


class RankSession:
    """Every probe of one rank, installed before the script and finished after it, whatever happened."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.rank, self.world_size, self.local_rank = rank_from_env()
        self.run = RunDir(Path(config.run_dir))
        self.tracker = StepTracker()
        self.ddp = DDPRecorder()
        self.parallelism = ParallelismRecorder(lambda: self.ddp.count)
        self.profiler: Any = None
        self.collectives: Any = None  # probes/collectives.CollectiveSource, installed first
        self.tune: Any = None  # `ddpdoctor tune`'s probe (probes/tune.py) in a trial launch
        self.extra: list[Any] = []  # other probes: finish(status: dict) -> None, and annotate(status) if they add to it
        self.started = time.time()
        if config.probe_options().get("nccl_debug"):
            from ddpdoctor.topo.capture import rank_env

            # Before the script can initialise NCCL: this rank's own topology dump path and debug settings.
            os.environ.update(rank_env(self.run.root, self.rank))
        self.info: RankInfoDoc = rank_info.basic(self.rank, self.world_size, self.local_rank)
        self._finished = False

    def install(self) -> None:
        self.tracker.install()
        from ddpdoctor.probes.collectives import CollectiveSource

        # The waits no torch.distributed call wraps count as "collective" on the phase clock (the ledger's blocked
        # time) in every mode; the heartbeat names them.
        self.collectives = CollectiveSource(self.tracker)
        self.collectives.install()
        tune = self.config.probe_options().get("tune")
        if tune:
            from ddpdoctor.probes.tune import TuneProbe

            # Before the recorder's own wrapper, so that the layout it records is the variant's (h31).
            self.tune = TuneProbe(tune["setting"], int(tune["stop_after"]), self.tracker,
                                  self.run.rank_file(self.rank, "tune.json"), self.parallelism.fsdp2_states)
            self.tune.install()
            self.extra.append(self.tune)
        self.ddp.install()
        self.parallelism.install()
        from ddpdoctor.probes.ledger import LedgerProbe

        # First, so that its backward wrapper is the innermost and is restored last; finished after the others.
        ledger = LedgerProbe(self.tracker, self.rank, self.run.rank_file(self.rank, "ledger.json"))
        ledger.install()
        self.tracker.add_listener(self._record_layout_once)
        if self.config.mode == "profile":
            from ddpdoctor.probes.profiler import ProfilerProbe

            self.profiler = ProfilerProbe(
                self.run.traces, self.rank, self.config.schedule, self.config.record_shapes, self.config.with_stack,
                stop_after_window=not self.config.probe_options().get("run_to_completion", True),
            )
            self.tracker.add_listener(self.profiler.on_step)
            self.profiler.start()
        if self.config.monitor:
            from ddpdoctor.probes.heartbeat import HeartbeatProbe

            heartbeat = HeartbeatProbe(self.config.monitor, self.rank, self.world_size, self.tracker,
                                       self.run.rank_file(self.rank, "stacks.txt"), source=self.collectives)
            heartbeat.install()
            from ddpdoctor.probes.divergence import StepFingerprint

            # Per-step records the monitor compares (issue 38), with the DDP and FSDP2 parameters' grad set.
            fingerprint = StepFingerprint(self.tracker, managed=lambda: [*self.ddp.live_modules(),
                                                                         *self.parallelism.fsdp2_states()])
            fingerprint.install()
            heartbeat.fingerprint = fingerprint
            fingerprint.send = lambda recs: heartbeat._send({"type": "fp", "rank": self.rank, "fp": recs})
            self.extra.append(fingerprint)
            ledger.summary = heartbeat.summary  # the last step's blocked time rides in the job's rank record
            self.extra.append(heartbeat)
            from ddpdoctor.probes import live  # phase times for the live watch, captures on demand (h18)

            live.install(self.run.root, self.rank, self.world_size, self.tracker, {**self.config.probe_options(), "mode": self.config.mode},
                         self.ddp.live_modules)
            self.extra.append(live)
        if self.config.mode == "check-sync":
            from ddpdoctor.probes.sync import install_check_sync

            self.extra.append(install_check_sync(self.run, self.rank, self.world_size, self.config.probe_options(), self.tracker))
        self.extra.append(ledger)
        self.extra.append(self.collectives)
        if self.tune is not None:
            self.tracker.add_listener(self.tune.on_step)  # last: it ends the trial once the others have run
        _write_quietly(self.run.rank_file(self.rank, "info.json"), self.info)

    def _record_layout_once(self, step: int) -> None:
        # DDP rebuilds its buckets after iteration 1; step 3 sees the layout the job keeps.
        if step == 3:
            self._write_info()

    def _write_info(self) -> None:
        try:
            self.info["process_group"] = rank_info.process_group_info() or self.info.get("process_group")
            self.info["ddp_modules"] = self.ddp.describe()
            if self.parallelism.built_anything:
                self.info["parallelism"] = self.parallelism.describe()
            write_json(self.run.rank_file(self.rank, "info.json"), self.info)
        except Exception:  # noqa: BLE001 - a probe never changes how the user's job ends
            pass

    def finish(self, status: RankStatusDoc) -> None:
        if self._finished:
            return
        self._finished = True
        status.update({
            "rank": self.rank,
            "steps_completed": self.tracker.step,
            "step_times_s": [round(t, 6) for t in self.tracker.step_times[-1000:]],
            "duration_s": round(time.time() - self.started, 3),
            "ddp_modules": self.ddp.count,
        })
        if self.parallelism.built_anything:
            status["parallelism"] = self.parallelism.describe()["kinds"]
        for probe in self.extra:  # what the probes know of how the rank ended, in the first write already
            try:
                getattr(probe, "annotate", lambda status: None)(status)
            except Exception:  # noqa: BLE001
                pass
        _write_quietly(self.run.rank_file(self.rank, "status.json"), status, FULL_DISK_WAIT_S)
        if self.profiler is not None:
            self.profiler.finish()
            status["traces"] = [p.name for p in self.profiler.written]
        for probe in self.extra:
            try:
                probe.finish(status)
            except Exception:  # noqa: BLE001
                pass
        self._write_info()
        self._summarise_traces()
        _write_quietly(self.run.rank_file(self.rank, "status.json"), status)
        self.tracker.uninstall()
        self.ddp.uninstall()
        self.parallelism.uninstall()

    def _summarise_traces(self) -> None:
        """Each rank reduces its own trace, so `analyze` of a 1,000-rank job merges small summaries."""
        if self.profiler is None or not self.profiler.written:
            return
        try:
            from ddpdoctor.analyses.summary import summarize_trace_files

            summary = summarize_trace_files(self.profiler.written, rank=self.rank)
            write_json(self.run.rank_file(self.rank, "summary.json"), summary)
        except Exception as exc:  # noqa: BLE001 - analyze can still read the trace itself
            _write_quietly(self.run.rank_file(self.rank, "summary-error.json"), {"error": repr(exc)})


# A status that meets a full disk waits this long, a little at a time, for the launcher to give back the half of its
# reserve that is the ranks' (rundir/reserve.py: it checks the free space twice a second).
FULL_DISK_WAIT_S = 3.0


def _write_quietly(path: Any, data: Any, wait_s: float = 0.0) -> None:
    """A rank's own record: a full disk (OSError) must not change how the user's job ends; what fitted is kept.
    ``wait_s``: on a full disk, try again for that long (the rank's status: the one record a verdict needs)."""
    import errno

    from ddpdoctor.rundir.artefacts import DiskFull

    deadline = time.time() + wait_s
    while True:
        try:
            write_json(path, data)
            return
        except OSError as exc:
            full = isinstance(exc, DiskFull) or exc.errno in (errno.ENOSPC, errno.EDQUOT)
            if not full or time.time() >= deadline:
                return
            time.sleep(0.25)


def _run_script(config: ProbeConfig) -> None:
    if config.as_module:
        sys.argv = [config.script, *config.script_args]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(config.script, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(config.script)
        sys.argv = [config.script, *config.script_args]
        sys.path[0] = os.path.dirname(script)  # as `python script.py` would have it
        runpy.run_path(script, run_name="__main__")


def _user_site(tb: Any) -> str | None:
    """file:line of the innermost frame of the user's code in a traceback (where the script called sys.exit)."""
    site = None
    ours = str(Path(__file__).resolve().parents[1])
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if not fname.startswith((ours, "<")) and "/torch/" not in fname:
            site = f"{fname}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _on_sigterm(signum: int, frame: Any) -> None:
    # torchrun SIGTERMs the surviving ranks when one fails: unwind so the profiler writes what it has. A second
    # SIGTERM (torchrun and ddpdoctor both stopping the job) must not interrupt that unwinding or the exit handlers.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main() -> None:
    from ddpdoctor.launch.proctree import die_with_parent

    die_with_parent()
    config = ProbeConfig.from_env()
    if config is None:
        sys.stderr.write("ddpdoctor bootstrap: $DDPDOCTOR_CONFIG is not set; run the script through `ddpdoctor`.\n")
        raise SystemExit(2)
    session = RankSession(config)
    session.install()
    signal.signal(signal.SIGTERM, _on_sigterm)
    status: RankStatusDoc = {"exit_code": 0}
    try:
        _run_script(config)
    except SystemExit as exc:
        from ddpdoctor.probes.profiler import ProfileWindowDone

        if isinstance(exc, ProfileWindowDone):
            # The profiled steps are written: the rank stops here, cleanly (exit 0 means "profiled").
            status["stopped_after_window"] = exc.step
        code = exc.code
        status["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
        status["exit_site"] = _user_site(exc.__traceback__)
        if isinstance(code, int) and code > 128:
            status["signal"] = signal.Signals(code - 128).name if code - 128 in signal.Signals._value2member_map_ else None
        raise
    except BaseException as exc:
        status["exit_code"] = 1
        status["exception"] = f"{type(exc).__name__}: {exc}"
        status["exception_type"] = type(exc).__name__
        status["traceback"] = traceback.format_exc()
        raise
    finally:
        session.finish(status)


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    # record() writes the exception into torchrun's error file, so torchrun's failure table shows it.
    record(main)()
