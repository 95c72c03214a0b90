"""check-sync's "must be equal across which ranks" map (analyses/sync.equal_over), worked by hand on an HSDP mesh."""

from __future__ import annotations

from ddpdoctor.analyses.sync import analyze_sync
from ddpdoctor.rundir.schema import SyncModule, SyncRecord, SyncRow
from ddpdoctor.rundir.schema_sync import EqualGroup

# A 2x2 mesh (replicate, shard) = [[0, 1], [2, 3]]: ranks 0 and 2 hold the same shard, so do 1 and 3.
GROUP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


def _fp(x: float) -> list[float]:
    return [4.0, x, x * x, x, x, x, x]


def _record(rank: int, b: float, c: float) -> SyncRecord:
    module = SyncModule(
        index=0, ddp=False, module_class="optimizer parameters", params=["a", "b", "c"],
        equal_groups=[EqualGroup(ranks=GROUP[rank], over=["replicate"])],
        param_equal_group=[None, 0, -1],  # a: plain (every rank), b: Replicate() over 'replicate', c: sharded
        param_layouts=[None, "[8] on (replicate=2, shard=2) Replicate(), Shard(dim=0)",
                       "[8] on (replicate=2, shard=2) Shard(dim=0), Shard(dim=0)"])
    return SyncRecord(rank=rank, world_size=4, stop_after=1, steps_completed=1, modules=[module],
                      params=[SyncRow(step=0, module=0, fp=[_fp(1.0), _fp(b), _fp(c)])])


def test_each_tensor_is_compared_only_across_the_ranks_that_must_agree():
    # b: the shard of ranks 1 and 3 differs (rank 3 drifted); ranks 0 and 2 agree with each other but not with 1
    # (another shard: never compared). c: sharded on every dim, different everywhere, never compared by value.
    records = {r: _record(r, b={0: 5.0, 1: 7.0, 2: 5.0, 3: 8.0}[r], c=float(r)) for r in range(4)}
    analysis = analyze_sync(records)
    # a: ranks 1, 2, 3 against 0 (3); b: 2 against 0 and 3 against 1 (2); c: none. 5 in all.
    assert analysis.params.comparisons == 5
    [diff] = analysis.params.diverged
    assert (diff.name, diff.reference_rank, diff.ranks, diff.over) == ("b", 1, [3], ["replicate"])
    # every rank's layout of b and c against rank 0's: 2 parameters x 3 ranks
    assert analysis.layouts.comparisons == 6 and analysis.layouts.differ == []


def test_a_layout_that_differs_is_named():
    records = {r: _record(r, 5.0, 0.0) for r in range(2)}
    records[1].modules[0].param_layouts[2] = "[8] on (replicate=2, shard=2) Replicate(), Replicate()"
    analysis = analyze_sync(records)
    assert analysis.layouts.differ == [("c", "[8] on (replicate=2, shard=2) Shard(dim=0), Shard(dim=0)", [1])]


def test_ranks_of_one_tensor_parallel_group_are_one_data_parallel_rank():
    from ddpdoctor.analyses.mesh_groups import data_groups
    from ddpdoctor.rundir.schema import DTensorParam, FSDPUnit, MeshInfo, Parallelism

    # FSDP over "dp", TP over "tp" on the mesh [[0, 1], [2, 3]]: ranks 0 and 1 (one TP group) read the same data
    mesh = MeshInfo(device_type="cpu", dim_names=["dp", "tp"], shape=[2, 2], ranks=[0, 1, 2, 3])
    p = Parallelism(kinds=["fsdp2", "tp"], meshes=[mesh], fsdp2_units=[FSDPUnit(fqn="0", mesh=0, shard_dim="dp")],
                    dtensor_params=[DTensorParam(name="norm.weight", mesh=0, placements=["Replicate()", "Replicate()"])],
                    dtensor_param_count=1)
    assert data_groups(p) == [[0, 1], [2, 3]]
    # FSDP or HSDP alone: every rank is its own data-parallel rank
    assert data_groups(Parallelism(kinds=["fsdp2"], meshes=[mesh], fsdp2_units=[FSDPUnit(fqn="0", mesh=0)])) is None


def test_sharded_parameters_are_named_as_not_compared():
    # c is sharded on every mesh dim: no peer holds its values, so the report names it as not compared (#37 item 3)
    from ddpdoctor.reports.check_sync import sharded_params

    records = {r: _record(r, b=5.0, c=float(r)) for r in range(4)}
    assert sharded_params(analyze_sync(records).modules) == [["c"]]
    plain = SyncModule(index=0, ddp=False, params=["w"], param_equal_group=[None])
    assert sharded_params([plain]) == []
