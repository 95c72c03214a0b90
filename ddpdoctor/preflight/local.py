"""What one rank can check alone: its launcher variables, versions, devices, GPU health and the checkpoint dir."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ddpdoctor.preflight.checks import FAIL, PASS, SKIPPED, WARN
from ddpdoctor.preflight.record import CheckOutcome, DeviceFacts, IbPort

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DIST_ENV_PREFIXES = ("NCCL_", "TORCH_")

# nvidia-smi clocks_throttle_reasons bits that mean the GPU is being slowed down (not idle / app clocks).
THROTTLE_SLOWDOWN_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                          0x80: "hw_power_brake"}
GPU_MEMORY_FREE_WARN = 0.8  # below 80 % free at start, another process is probably on the GPU


def launcher_env(environ: dict[str, str] | None = None) -> dict[str, str | None]:
    env = environ if environ is not None else os.environ
    return {k: env.get(k) for k in LAUNCHER_VARS}


def dist_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """NCCL_* and TORCH_* variables (TORCHELASTIC_* are per-rank by design and not compared)."""
    env = environ if environ is not None else os.environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(DIST_ENV_PREFIXES)}


def versions() -> dict[str, str | None]:
    import torch

    nccl: str | None = None
    try:
        v = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else (str(v) if v else None)
    except Exception:  # NCCL absent from the build: report None, the comparison still works
        nccl = None
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "driver": _driver_version(),
    }


def _nvidia_smi(args: list[str], timeout: float = 10.0) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _driver_version() -> str | None:
    out = _nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def devices(local_rank: int) -> DeviceFacts:
    """How many GPUs this rank sees and which one is its own (LOCAL_RANK's), by UUID."""
    import torch

    info: DeviceFacts = {"cuda_available": torch.cuda.is_available(), "count": 0,
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "uuid": None, "name": None}
    if not info["cuda_available"]:
        return info
    info["count"] = torch.cuda.device_count()
    if 0 <= local_rank < info["count"]:
        props = torch.cuda.get_device_properties(local_rank)
        info["name"] = props.name
        raw = getattr(props, "uuid", None)
        info["uuid"] = None if raw is None else ("GPU-" + str(raw) if not str(raw).startswith("GPU-") else str(raw))
        info["pci_bus_id"] = getattr(props, "pci_bus_id", None)
    return info


def gpu_health(device_uuid: str | None) -> CheckOutcome:
    """Free memory, uncorrected ECC errors and active slowdown reasons of this rank's GPU (nvidia-smi)."""
    if device_uuid is None:
        return {"status": SKIPPED, "summary": "no GPU", "evidence": {}}
    fields = "uuid,name,memory.free,memory.total,ecc.errors.uncorrected.volatile.total,clocks_throttle_reasons.active,temperature.gpu"
    out = _nvidia_smi([f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"status": SKIPPED, "summary": "nvidia-smi not available", "evidence": {"uuid": device_uuid}}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7 or parts[0] != device_uuid:
            continue
        return judge_gpu(parts)
    return {"status": SKIPPED, "summary": f"{device_uuid} not in nvidia-smi's list", "evidence": {"uuid": device_uuid}}


def _int(text: str) -> int | None:
    try:
        return int(text, 16) if text.startswith("0x") else int(float(text))
    except ValueError:
        return None  # "[N/A]" (ECC disabled, field unsupported)


def judge_gpu(parts: list[str]) -> CheckOutcome:
    """Status of one nvidia-smi csv row: uuid, name, free MiB, total MiB, uncorrected ECC, throttle bitmask, temp."""
    free, total, ecc, throttle, temp = (_int(p) for p in parts[2:7])
    slowdowns = [name for bit, name in THROTTLE_SLOWDOWN_BITS.items() if throttle is not None and throttle & bit]
    evidence = {"uuid": parts[0], "name": parts[1], "memory_free_mib": free, "memory_total_mib": total,
                "ecc_uncorrected_volatile": ecc, "throttle_reasons": slowdowns, "temperature_c": temp}
    if ecc:
        return {"status": FAIL, "summary": f"{ecc} uncorrected ECC errors", "evidence": evidence}
    if slowdowns:
        return {"status": WARN, "summary": "clocks slowed: " + ", ".join(slowdowns), "evidence": evidence}
    if free is not None and total and free < GPU_MEMORY_FREE_WARN * total:
        return {"status": WARN, "summary": f"only {free} of {total} MiB free before the job", "evidence": evidence}
    return {"status": PASS, "summary": f"{free} MiB free, no ECC errors, no throttling", "evidence": evidence}


def checkpoint_dir(path: str | None, min_free_gb: float, rank: int) -> CheckOutcome:
    """Can this rank create, write, fsync and delete a file in the checkpoint directory, and is there room?

    A missing directory is created the way a training job would, then removed again."""
    if not path:
        return {"status": SKIPPED, "summary": "no --checkpoint-dir given", "evidence": {}}
    target = Path(path)
    created: list[Path] = []
    # an evidence map (free-form per check: shown and copied into the finding)
    evidence: dict[str, Any] = {"path": str(target), "host": socket.gethostname()}
    try:
        missing = [p for p in [target, *target.parents] if not p.exists()]
        for p in reversed(missing):
            try:
                p.mkdir()
            except FileExistsError:
                continue  # another rank of this host created it a moment ago: not ours to remove
            created.append(p)
        probe = target / f".ddpdoctor-preflight-{socket.gethostname()}-{rank}-{uuid.uuid4().hex[:8]}"
        with os.fdopen(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
        usage = shutil.disk_usage(target)
    except OSError as exc:
        evidence["error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
        return {"status": FAIL, "summary": f"cannot write: {exc.strerror or exc}", "evidence": evidence}
    finally:
        for p in reversed(created):
            # Other ranks of this host may still be writing their probe into the directory we created.
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    p.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
    free_gb = usage.free / 1e9
    evidence.update(free_gb=round(free_gb, 2), total_gb=round(usage.total / 1e9, 2), min_free_gb=min_free_gb,
                    created_for_test=[str(p) for p in created])
    if free_gb < min_free_gb:
        return {"status": FAIL, "summary": f"{free_gb:.1f} GB free < {min_free_gb:g} GB", "evidence": evidence}
    return {"status": PASS, "summary": f"writable, {free_gb:.1f} GB free", "evidence": evidence}


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_ib_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0 (Gbit/s), as /sys/class/infiniband/*/ports/*/rate says it."""
    m = _RATE.match(text)
    return float(m.group(1)) if m else None


def ib_ports(root: Path = Path("/sys/class/infiniband")) -> list[IbPort]:
    """This host's InfiniBand/RoCE ports: device, port, state and rate (what NCCL's IB transport would use)."""
    ports: list[IbPort] = []
    if not root.is_dir():
        return ports
    for port_dir in sorted(root.glob("*/ports/*")):
        try:
            state = (port_dir / "state").read_text().strip()  # e.g. "4: ACTIVE"
            rate = parse_ib_rate((port_dir / "rate").read_text())
        except OSError:
            continue
        ports.append({"device": port_dir.parent.parent.name, "port": port_dir.name,
                      "active": state.endswith("ACTIVE"), "rate_gbit": rate})
    return ports
