"""What parallelism the job built, said in every launch's report (`parallelism`), and ranks that built different
FSDP units (`parallelism-differs`), from the manifest's record (probes/parallelism.py)."""

from __future__ import annotations

from collections import Counter

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.schema import Manifest, MeshInfo, Parallelism

# FSDP2 (`fully_shard`) is supported from the torch that made it public; the pinned one is tested.
FSDP2_MIN_TORCH = (2, 6)
FSDP2_TESTED_TORCH = "2.13.0"


def mesh_words(mesh: MeshInfo) -> str:
    """``(replicate=2, shard=2)``: each dim's name (or dimN) and size."""
    names = mesh.dim_names or [f"dim{i}" for i in range(len(mesh.shape))]
    return "(" + ", ".join(f"{n}={s}" for n, s in zip(names, mesh.shape, strict=False)) + ")"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def describe(p: Parallelism) -> str:
    """One sentence per kind: what the rank built, in its users' words."""
    parts: list[str] = []
    if p.ddp_modules:
        parts.append(f"DDP: {p.ddp_modules} DistributedDataParallel module(s)")
    units = p.fsdp2_units
    if units:
        meshes = sorted({u.mesh for u in units if u.mesh is not None})
        where = ", ".join(_unit_mesh_words(p, units, m) for m in meshes)
        kinds = Counter(u.kind for u in units)
        label = "HSDP (FSDP2 on a 2-D mesh)" if kinds.get("hsdp") else "FSDP2"
        total = sum(u.bytes for u in units)
        parts.append(f"{label}: {len(units)} fully_shard unit(s), {_mb(total)} of parameters, {where}")
    if p.fsdp1_modules:
        strategies = sorted({m.sharding_strategy or "?" for m in p.fsdp1_modules})
        parts.append(f"FSDP1 (deprecated): {len(p.fsdp1_modules)} FullyShardedDataParallel module(s), "
                     f"{'/'.join(strategies)}")
    if p.dtensor_param_count:
        placements = Counter(pl for d in p.dtensor_params for pl in [",".join(d.placements)])
        on = sorted({d.mesh for d in p.dtensor_params if d.mesh is not None})
        mesh_text = ", ".join(f"mesh {mesh_words(p.meshes[m])}" for m in on if m < len(p.meshes))
        top = ", ".join(f"{k}: {v}" for k, v in placements.most_common(3))
        parts.append(f"tensor parallel (DTensor): {p.dtensor_param_count} parameter(s) on {mesh_text} ({top})")
    return "; ".join(parts) if parts else "no DDP, FSDP or DTensor"


def _unit_mesh_words(p: Parallelism, units: list, m: int) -> str:  # type: ignore[type-arg]
    mesh = p.meshes[m] if m < len(p.meshes) else MeshInfo()
    u = next(u for u in units if u.mesh == m)
    how = f"sharded over '{u.shard_dim}'" if u.shard_dim else ""
    if u.replicate_dim:
        how += f"{', ' if how else ''}replicated over '{u.replicate_dim}'"
    return f"mesh {mesh_words(mesh)}{' ' + how if how else ''}"


def fsdp2_supported(torch_version: str | None) -> bool | None:
    """Whether this torch's FSDP2 is one ddpdoctor reads (None: unknown version)."""
    if not torch_version:
        return None
    try:
        major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return (major, minor) >= FSDP2_MIN_TORCH


def analysis_parallelism(p: Parallelism | None) -> list[Finding]:
    """`analyze` of a run directory: the run's record, said as the launch's report said it."""
    if p is None or not [k for k in p.kinds if k != "ddp"]:
        return []
    return parallelism_findings(Manifest(parallelism=p), set())


def parallelism_findings(manifest: Manifest, kinds_seen: set[str]) -> list[Finding]:
    """``kinds_seen``: the kinds the ranks' status.json name (when the manifest has no record: a crash)."""
    p = manifest.parallelism
    findings: list[Finding] = []
    if p is None and not kinds_seen:
        return findings
    kinds = list(p.kinds) if p is not None else sorted(kinds_seen)
    if p is not None:
        text = describe(p)
        advice = ("The DDP bucket analyses, DDP option advice and `tune`'s DDP knobs do not apply to FSDP units "
                  "or DTensor parameters and are not run on them.") if "ddp" not in kinds else (
                  "DDP's bucket analyses cover the DDP module(s) only.")
        if ("fsdp2" in kinds or "hsdp" in kinds) and fsdp2_supported(p.torch) is False:
            advice += (f" This torch ({p.torch}) predates the FSDP2 ddpdoctor reads (torch >= "
                       f"{'.'.join(map(str, FSDP2_MIN_TORCH))}; tested on {FSDP2_TESTED_TORCH}): the unit record "
                       "may be incomplete.")
        findings.append(Finding(
            "parallelism", Severity.INFO, f"The job built {text}",
            evidence={"kinds": kinds, "fsdp2_units": len(p.fsdp2_units), "fsdp1_modules": len(p.fsdp1_modules),
                      "dtensor_params": p.dtensor_param_count, "ddp_modules": p.ddp_modules,
                      "meshes": [mesh_words(m) for m in p.meshes], "torch": p.torch},
            advice=advice,
        ))
    else:
        findings.append(Finding(
            "parallelism", Severity.INFO, f"The job built {', '.join(kinds)} (no rank wrote its full record)",
            evidence={"kinds": kinds}, advice="The ranks ended before recording their units.",
        ))
    if manifest.parallelism_differs:
        ranks = sorted(manifest.parallelism_differs)
        findings.append(Finding(
            "parallelism-differs", Severity.WARNING,
            f"Rank(s) {ranks} built other FSDP units or parallelism than the lowest rank",
            ranks=ranks, evidence={"ranks": ranks},
            advice="Every rank must wrap the same modules with fully_shard in the same order on the same mesh; "
                   "otherwise their all-gathers and reduce-scatters do not match and the job hangs or computes "
                   "wrong. Build the model the same way on every rank (no rank-dependent branches around "
                   "fully_shard).",
        ))
    return findings
