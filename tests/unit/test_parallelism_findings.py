"""What the job built, said in the job's findings (findings/parallelism.py): FSDP2 and HSDP described, never `no-ddp`,
an older torch in one line, ranks that built other units."""

from __future__ import annotations

from ddpdoctor.findings.job import job_findings
from ddpdoctor.rundir.schema import FSDPUnit, Manifest, MeshInfo, Parallelism


def _manifest(torch: str = "2.13.0+cpu", differs: list[int] | None = None) -> Manifest:
    mesh = MeshInfo(device_type="cpu", dim_names=["replicate", "shard"], shape=[2, 2], ranks=[0, 1, 2, 3])
    units = [FSDPUnit(fqn=f"layers.{i}", kind="hsdp", mesh=0, shard_dim="shard", replicate_dim="replicate",
                      bytes=500_000, numel=125_000) for i in range(2)]
    return Manifest(world_size=4, backend="gloo", parallelism_differs=differs or [],
                    parallelism=Parallelism(kinds=["hsdp"], fsdp2_units=units, meshes=[mesh], torch=torch))


def _statuses() -> dict:
    return {r: {"exit_code": 0, "steps_completed": 5, "ddp_modules": 0, "parallelism": ["hsdp"]} for r in range(4)}


def test_an_hsdp_job_is_described_and_never_told_no_ddp():
    found = {f.id: f for f in job_findings(_manifest(), _statuses())}
    assert "no-ddp" not in found
    f = found["parallelism"]
    assert f.title == ("The job built HSDP (FSDP2 on a 2-D mesh): 2 fully_shard unit(s), 1.00 MB of parameters, "
                       "mesh (replicate=2, shard=2) sharded over 'shard', replicated over 'replicate'")
    assert "predates" not in f.advice


def test_an_older_torch_gets_one_line():
    f = next(f for f in job_findings(_manifest(torch="2.5.1"), _statuses()) if f.id == "parallelism")
    assert "This torch (2.5.1) predates the FSDP2 ddpdoctor reads (torch >= 2.6; tested on 2.13.0)" in f.advice


def test_ranks_that_built_other_units():
    f = next(f for f in job_findings(_manifest(differs=[3]), _statuses()) if f.id == "parallelism-differs")
    assert f.ranks == [3] and f.severity.value == "warning"


def test_a_job_without_any_parallelism_is_still_no_ddp():
    statuses = {r: {"exit_code": 0, "steps_completed": 5, "ddp_modules": 0} for r in range(2)}
    assert [f.id for f in job_findings(Manifest(world_size=2), statuses)] == ["no-ddp"]
