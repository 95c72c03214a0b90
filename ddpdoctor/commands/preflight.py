"""`ddpdoctor preflight`: check the cluster and the job's environment on every rank before a big run.

Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 2 preflight could not run."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import (
    cli_errors,
    default_run_dir,
    emit,
    examples,
    fail_on_option,
    json_option,
    overwrite_option,
    run_dir_options,
)
from ddpdoctor.commands._torchrun_options import torchrun_options_without_script
from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import Finding
from ddpdoctor.launch.flags import pop_torchrun_values
from ddpdoctor.launch.launcher import LaunchSpec, RunningJob, launch
from ddpdoctor.preflight.checks import CHECKS, FAIL, SKIPPED, CheckResult, exit_code
from ddpdoctor.preflight.merge import (
    ADVICE,
    MergeOptions,
    load_records,
    merge,
    topology_input,
)
from ddpdoctor.preflight.netprobe import probe_tcp
from ddpdoctor.preflight.record import Records
from ddpdoctor.probes.config import ProbeOptions
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir

WORKER = Path(__file__).resolve().parents[1] / "preflight" / "worker.py"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M' -> 268435456 (K, M, G are powers of 1024, as in nccl-tests' -e)."""
    m = _SIZE.match(text)
    if not m:
        raise BadInput(f"--max-size must look like 64M, 256MB or 1G, not {text!r}")
    value = float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    if value < 1024:
        raise BadInput(f"--max-size must be at least 1K, not {text!r}")
    return int(value)


class Deadline:
    """A JobWatcher that kills the whole job when the preflight outlives its overall deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def start(self, spec: LaunchSpec) -> str | None:
        self.started = time.monotonic()
        return None

    def check(self, job: RunningJob) -> None:
        if time.monotonic() - self.started > self.seconds and job.killed_by is None:
            job.kill(f"preflight deadline of {self.seconds:g} s")

    def stop(self, job: RunningJob) -> None:
        return None


def _expected_world(torchrun: Mapping[str, object], launcher: str) -> int | None:
    if launcher == "none":
        ws = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
        return int(ws) if ws and ws.isdigit() else None
    nproc, nnodes = str(torchrun.get("--nproc-per-node", "1")), str(torchrun.get("--nnodes", "1"))
    return int(nproc) * int(nnodes) if nproc.isdigit() and nnodes.isdigit() else None


def _topology(run: RunDir, records: Records) -> list[Finding] | str:
    if not any(rec.get("backend") == "nccl" for rec in records.values()):
        return "NCCL not used (gloo)"
    try:
        from ddpdoctor.topo.capture import analyze_run_dir  # type: ignore[import-not-found]
    except ImportError:
        return "ddpdoctor.topo.capture not available"
    try:
        result = analyze_run_dir(run.root, "nccl")
    except Exception as exc:  # the topo analysis must not take the preflight down with it
        return f"topology analysis failed: {type(exc).__name__}: {exc}"
    return topology_input(result)


def _nccl_env(run: RunDir) -> dict[str, str]:
    """NCCL INFO logging (and the topology dump) for the topology row, when this host has NVIDIA GPUs."""
    if not os.path.exists("/dev/nvidiactl") or "NCCL_DEBUG" in os.environ:
        return {}
    try:
        from ddpdoctor.topo.capture import job_env  # type: ignore[import-not-found]

        return dict(job_env(run.root))
    except (ImportError, OSError):  # no topo module, or the run dir cannot be made (launch reports that)
        return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,GRAPH"}


def render_checks(report: Report, out: Any, verbose: bool) -> None:
    """Moved to ddpdoctor/renderers/console_preflight.py; kept for callers that have not moved yet."""
    from ddpdoctor.renderers.console_preflight import render_checks as render

    render(report, out, verbose)


@click.command(help=__doc__, context_settings={"ignore_unknown_options": False}, epilog=examples(
    "ddpdoctor preflight --nproc-per-node 2",
    "ddpdoctor preflight --nnodes 4 --node-rank $NODE_RANK --rdzv-endpoint head:29500 --nproc-per-node 8 "
    "--min-busbw 40 --checkpoint-dir /ckpt",
    "srun --ntasks-per-node 8 ddpdoctor preflight --launcher none",
))
@torchrun_options_without_script
@run_dir_options
@overwrite_option
@click.option("--launcher", type=click.Choice(["torchrun", "none"]), default="torchrun", show_default=True,
              help="none: the scheduler (srun, mpirun) already started one process per rank.")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
              help="auto: nccl when the rank has a GPU, else gloo.")
@click.option("--min-busbw", type=float, default=None, help="Fail when the all_reduce busbw plateau is below this many GB/s.")
@click.option("--max-size", default=None, help="Largest all_reduce of the sweep [default: 256M on GPU, 64M on CPU].")
@click.option("--max-latency-us", type=float, default=None, help="Fail when a 4-byte all_reduce takes longer.")
@click.option("--checkpoint-dir", default=None, help="Check that every rank can write here, with free space.")
@click.option("--min-free-gb", type=float, default=1.0, show_default=True, help="Free space --checkpoint-dir needs.")
@click.option("--slow-rank-share", type=float, default=0.2, show_default=True,
              help="A rank whose matmul GFLOP/s is this share below the median fails.")
@click.option("--check-timeout", type=float, default=20.0, show_default=True,
              help="Seconds for the rendezvous and for each collective (process-group timeout).")
@click.option("--deadline", type=float, default=90.0, show_default=True, help="Kill the whole job after this many s.")
@click.option("--verbose", "-v", is_flag=True, help="Show the ranks' output and full evidence.")
@json_option
@fail_on_option
@cli_errors
def command(out: Path | None, name: str | None, overwrite: bool, launcher: str, backend: str, min_busbw: float | None,
            max_size: str | None, max_latency_us: float | None, checkpoint_dir: str | None, min_free_gb: float,
            slow_rank_share: float, check_timeout: float, deadline: float, verbose: bool, as_json: bool, fail_on: str,
            **kwargs: Any) -> None:
    if not 0 < slow_rank_share < 1:
        raise BadInput(f"--slow-rank-share must be between 0 and 1, not {slow_rank_share}")
    if check_timeout <= 0 or deadline <= 0:
        raise BadInput("--check-timeout and --deadline must be positive")
    if min_busbw is not None and min_busbw < 0:
        raise BadInput("--min-busbw must be >= 0")
    port = os.environ.get("MASTER_PORT")
    if launcher == "none" and port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise BadInput(f"MASTER_PORT must be a port number 1-65535, not {port!r}")
    torchrun = pop_torchrun_values(kwargs)
    if launcher == "torchrun" and str(torchrun.get("--nnodes", "1")) != "1" and "--rdzv-conf" not in torchrun:
        # torchrun's own node rendezvous waits 10-15 min by default: bound it so a missing node is reported in time.
        t = int(max(check_timeout * 3, 5))
        torchrun["--rdzv-conf"] = f"join_timeout={t},timeout={t}"
    options: ProbeOptions = {"backend": backend, "max_size": parse_size(max_size) if max_size else None,
               "max_latency_us": max_latency_us, "checkpoint_dir": checkpoint_dir, "min_free_gb": min_free_gb,
               "check_timeout": check_timeout}
    run = RunDir(out or default_run_dir(name or f"preflight-{time.strftime('%Y%m%d-%H%M%S')}"))
    env = _nccl_env(run)
    spec = LaunchSpec(mode="preflight", script=str(WORKER), script_args=[], run_dir=run, torchrun=torchrun,
                      launcher=launcher, options=options, env=env, quiet=not verbose, output_to_stderr=as_json,
                      program=WORKER, overwrite=overwrite)
    result = launch(spec, Deadline(deadline))
    records = load_records(run.root)
    if not records and launcher == "torchrun" and not list(run.torchrun_logs.glob("*/attempt_*")):
        # torchrun never started a worker: its own node rendezvous failed. That is a failed check, not bad input.
        checks = [torchrun_rendezvous_failure(torchrun, result.exit_code, result.killed_by, check_timeout)]
        checks += [CheckResult(cid, SKIPPED, "no rank started", {}) for cid in CHECKS if cid != "rendezvous"]
        emit(build_report(checks, run, result.duration_s, result.killed_by), as_json=as_json, verbose=verbose,
             exit_code=exit_code(checks), fail_on=fail_on)
    if not records:
        raise BadInput(f"no rank wrote a preflight result (job exit code {result.exit_code}"
                       f"{', ' + result.killed_by if result.killed_by else ''}); see ranks/*/stderr.log", run.root)
    # Only the node that hosts rank 0 sees every rank (rank 0 gathers the records); others judge their own ranks.
    if launcher == "none":
        local_view = str(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != "0"
    else:
        local_view = str(torchrun.get("--node-rank", "0")) != "0"
    opts = MergeOptions(expected_world_size=None if local_view else _expected_world(torchrun, launcher),
                        min_busbw_gbps=min_busbw, slow_rank_share=slow_rank_share, killed_by=result.killed_by,
                        local_view=local_view)
    checks = merge(records, opts, _topology(run, records))
    emit(build_report(checks, run, result.duration_s, result.killed_by), as_json=as_json, verbose=verbose,
         exit_code=exit_code(checks), fail_on=fail_on)


def torchrun_rendezvous_failure(torchrun: Mapping[str, object], code: int | None, killed_by: str | None,
                                timeout: float) -> CheckResult:
    """The rendezvous row when torchrun's agents never formed a group: probe the endpoint from here."""
    endpoint = torchrun.get("--rdzv-endpoint")
    if endpoint:
        host, _, port = str(endpoint).rpartition(":")
    else:
        host, port = str(torchrun.get("--master-addr", "")), str(torchrun.get("--master-port", ""))
    # an evidence map (shown and copied into the finding as it is)
    evidence: dict[str, Any] = {"stage": "torchrun node rendezvous", "torchrun_exit_code": code, "killed_by": killed_by,
                                "endpoint": f"{host}:{port}" if host else None}
    cause = "unknown"
    if host and port.isdigit():
        probe = probe_tcp(host, int(port), timeout=min(5.0, timeout))
        evidence["probe"] = {**probe.to_json(), "when": "after torchrun gave up"}
        cause = probe.cause
    evidence["likely_cause"] = cause
    summary = f"torchrun started no rank: its node rendezvous failed; likely cause: {cause}"
    if "probe" in evidence:
        summary += f" ({evidence['probe']['detail']})"
    return CheckResult("rendezvous", FAIL, summary, evidence, [], ADVICE.get(cause, ""))


def build_report(checks: list[CheckResult], run: RunDir, duration_s: float, killed_by: str | None) -> Report:
    """Moved to ddpdoctor/reports/preflight.py (``assemble``); kept for callers that have not moved yet."""
    from ddpdoctor.reports.preflight import assemble

    return assemble(checks, run, duration_s, killed_by)
