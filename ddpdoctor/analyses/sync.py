"""Compares the ranks' gradient, parameter and buffer fingerprints (ranks/rankR/sync.json) step by step: a pure analysis.

A fingerprint is [numel, sum, sum of squares, v_0..v_3] in float64 (docs/check-sync.md). Two ranks agree on
a tensor when their fingerprints are bitwise equal: DDP's all-reduce hands every rank the same bytes, so the
same optimizer on the same values gives the same bytes too. A difference whose relative size is at most
``RTOL`` is reported as "within tolerance" (info); anything larger is a divergence. Sums are accumulated in
the tensor's precision (float32 for most models), so two ranks that sum the same values in another order
(other thread counts, other hardware) differ by float32 rounding, far below RTOL."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ddpdoctor.rundir.schema import Equivalence, Fingerprint, SyncModule, SyncRecord, SyncRow

RTOL = 1e-5  # relative: float32 rounding of another summation order stays well below this
EQUIVALENCE_RTOL = 1e-3  # float32 gradients summed in another order differ by ~1e-6..1e-5; 100x margin


@dataclass
class TensorDiff:
    """One tensor that differs between ``reference_rank`` and ``ranks`` at ``step``."""

    kind: str  # "grad", "param", "buffer"
    step: int
    module: int
    name: str
    reference_rank: int
    ranks: list[int]
    max_abs_diff: float  # largest |a - b| over the sum and the sampled values (inf: present on one rank only)
    max_rel_diff: float  # largest |a - b| / max(|a|, |b|) over every fingerprint component
    over: list[str] | None = None  # the mesh dims the tensor must be equal over (a DTensor Replicate()); None: every rank


@dataclass
class TensorCheck:
    kind: str
    comparisons: int = 0  # tensor x step x rank comparisons made
    steps: list[int] = field(default_factory=list)
    diverged: list[TensorDiff] = field(default_factory=list)  # beyond RTOL, in step then parameter order
    within_tolerance: list[TensorDiff] = field(default_factory=list)

    @property
    def first_step(self) -> int | None:
        return self.diverged[0].step if self.diverged else None


@dataclass
class UnsyncedStep:
    step: int
    module: int
    ranks: list[int]
    unsynced_forwards: int


@dataclass
class ParamOutsideDDP:
    """A parameter one rank's optimizer updates that belongs to no DDP module."""

    rank: int
    name: str
    shape: list[int]


@dataclass
class LayoutCheck:
    """Every rank must agree on each DTensor parameter's layout (global shape, mesh, placements)."""

    comparisons: int = 0
    differ: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (name, reference layout, ranks)


@dataclass
class NonFinite:
    """The first checked step at which some rank's gradients (or parameters) held NaN or inf. Ranks compare equal
    then (DDP all-reduces one rank's NaN into every rank), so the divergence checks cannot see it."""

    kind: str  # "grad", "param"
    step: int
    module: int
    names: list[str]  # the non-finite tensors, on any rank
    ranks: list[int]  # the ranks holding them
    local_ranks: list[int]  # grads: the ranks whose own gradient was non-finite before DDP's all-reduce
    steps: list[int]  # every checked step with a non-finite value


@dataclass
class SyncAnalysis:
    ranks: list[int]
    modules: list[SyncModule]  # rank 0's (lowest rank's) description of each DDP module
    grads: TensorCheck
    params: TensorCheck
    buffers: TensorCheck
    never_synced: list[UnsyncedStep]
    unused: dict[int, list[str]]  # module -> parameters with no gradient at any checked step on any rank
    outside_ddp: list[ParamOutsideDDP]
    equivalence: Equivalence | None
    steps_checked: int  # steps whose fingerprints were taken (the gradient-check window)
    buffer_sync_by_ddp: dict[int, bool]  # module -> DDP broadcast buffers before the checked forwards
    steps_run: int = 0  # steps every rank completed (the data recorder may run past the window)
    layouts: LayoutCheck = field(default_factory=LayoutCheck)  # DTensor parameters' layouts across ranks
    nonfinite: list[NonFinite] = field(default_factory=list)  # grads, then params: where NaN/inf first appeared
    # every optimizer's step count, which must be equal on every rank (optimizer_steps)
    optimizer_steps: TensorCheck = field(default_factory=lambda: TensorCheck(kind="optimizer"))
    optimizers: list[str] = field(default_factory=list)  # the lowest rank's optimizer classes, by index
    # at the first step where the counts differ: rank -> [step() calls, min, max state['step']] of that optimizer
    optimizer_step_values: dict[int, list[float | None]] = field(default_factory=dict)


def _num(v: float | str) -> float:
    return float(v)  # non-finite values arrive as the strings "nan", "inf", "-inf"


def compare_fingerprints(a: Fingerprint, b: Fingerprint) -> tuple[bool, float, float]:
    """(bitwise equal, max abs diff over sum and samples, max relative diff over all components)."""
    if a is None and b is None:
        return True, 0.0, 0.0
    if a is None or b is None:
        return False, math.inf, math.inf
    fa, fb = [_num(x) for x in a], [_num(x) for x in b]
    if len(fa) != len(fb) or fa[0] != fb[0]:
        return False, math.inf, math.inf
    equal = all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(fa, fb, strict=True))
    if equal:
        return True, 0.0, 0.0
    abs_diff = 0.0
    rel_diff = 0.0
    # The sum can cancel to ~0, so its scale is sqrt(n * sum of squares) >= sum |x|, the size rounding works on.
    sum_scale = math.sqrt(fa[0] * max(abs(fa[2]), abs(fb[2])))
    for i, (x, y) in enumerate(zip(fa, fb, strict=True)):
        if math.isnan(x) or math.isnan(y):
            return False, math.inf, math.inf
        d = abs(x - y) if x != y else 0.0
        if i != 2:  # the sum of squares has other units
            abs_diff = max(abs_diff, d)
        scale = max(abs(x), abs(y), sum_scale if i == 1 else 0.0)
        if d and scale:
            rel_diff = max(rel_diff, d / scale)
    return False, abs_diff, rel_diff


Kind = Literal["grads", "params", "buffers", "optimizer_steps"]
_LABEL = {"grads": "grad", "params": "param", "buffers": "buffer", "optimizer_steps": "optimizer"}


def _rows(rec: SyncRecord, kind: Kind) -> list[SyncRow]:
    return {"grads": rec.grads, "params": rec.params, "buffers": rec.buffers,
            "optimizer_steps": rec.optimizer_steps}[kind]


def _rows_by_key(records: dict[int, SyncRecord], kind: Kind) -> dict[tuple[int, int], dict[int, SyncRow]]:
    out: dict[tuple[int, int], dict[int, SyncRow]] = {}
    for rank, rec in records.items():
        for row in _rows(rec, kind):
            out.setdefault((row.step, row.module), {})[rank] = row
    return out


# Which ranks must hold tensor j of a module equal: None every rank, () none (sharded), else (ranks, mesh dims).
EqualOver = tuple[tuple[int, ...], tuple[str, ...]] | tuple[()] | None


def equal_over(module: SyncModule | None, j: int, kind: Kind = "params") -> EqualOver:
    """check-sync's one "must be equal across which ranks" map, as one rank recorded it for its tensor ``j``
    (probes/fingerprints.placement_map): a plain tensor, every rank (DDP's replicas, the optimizer's parameters);
    a DTensor sharded on every mesh dim, no rank (only its layout must agree: check_layouts); a DTensor
    ``Replicate()`` over some mesh dims, the ranks that differ from this one only along those dims. ``kind``:
    the module's parameters or its buffers (the same map covers both)."""
    groups = module.buffer_equal_group if module is not None and kind == "buffers" else (
        module.param_equal_group if module is not None else [])
    if module is None or j >= len(groups):
        return None
    g = groups[j]
    if g is None:
        return None
    if g < 0 or g >= len(module.equal_groups):
        return ()
    group = module.equal_groups[g]
    return tuple(group.ranks), tuple(group.over)


def _partition(by_rank: dict[int, SyncRow], modules: dict[int, SyncModule | None], j: int, kind: Kind
               ) -> list[tuple[list[int], list[str] | None]]:
    """The present ranks split into the groups that must agree on tensor ``j`` (each with its mesh dims)."""
    ranks = sorted(by_rank)
    parts: dict[tuple[int, ...], tuple[list[int], list[str] | None]] = {}
    for rank in ranks:
        over = equal_over(modules.get(rank), j, kind)
        if over is None:
            parts.setdefault((), (ranks, None))
        elif over:
            members, dims = over
            key = tuple(r for r in members if r in by_rank)
            parts.setdefault(key, (list(key), list(dims)))
    return [p for p in parts.values() if len(p[0]) >= 2]


def check_tensors(records: dict[int, SyncRecord], kind: Kind, names: dict[int, list[str]]) -> TensorCheck:
    """Compare, at every (step, module) at least two ranks recorded, each tensor of every rank with the lowest
    rank's among those that must hold it equal (``equal_over``; every rank unless a DTensor's placements say
    otherwise). Linear in ranks x tensors: each rank is compared with one reference per tensor."""
    label = _LABEL[kind]
    check = TensorCheck(kind=label)
    described = kind in ("params", "buffers")  # the placement map covers the parameters and buffers
    exact = kind == "optimizer_steps"  # counts: one step apart is a divergence however many steps were taken
    for (step, module), by_rank in sorted(_rows_by_key(records, kind).items()):
        if len(by_rank) < 2:
            continue
        check.steps.append(step)
        modules = {r: _module(records[r], module) if described else None for r in by_rank}
        module_names = names.get(module, [])
        width = len(by_rank[min(by_rank)].fp)  # the lowest rank's tensors, as ever
        for j in range(width):
            for members, over in _partition(by_rank, modules, j, kind):
                ref_rank = members[0]
                ref_row = by_rank[ref_rank]
                ref_fp = ref_row.fp[j] if j < len(ref_row.fp) else None
                bad: list[int] = []
                close: list[int] = []
                worst_abs = worst_rel = 0.0
                for rank in members[1:]:
                    row = by_rank[rank]
                    fp = row.fp[j] if j < len(row.fp) else None
                    check.comparisons += 1
                    equal, abs_d, rel_d = compare_fingerprints(ref_fp, fp)
                    if equal:
                        continue
                    worst_abs, worst_rel = max(worst_abs, abs_d), max(worst_rel, rel_d)
                    (close if rel_d <= RTOL and not exact else bad).append(rank)
                if not bad and not close:
                    continue
                name = module_names[j] if j < len(module_names) else f"#{j}"
                diff = TensorDiff(label, step, module, name, ref_rank, bad or close, worst_abs, worst_rel, over)
                (check.diverged if bad else check.within_tolerance).append(diff)
    return check


def _module(rec: SyncRecord, index: int) -> SyncModule | None:
    return next((m for m in rec.modules if m.index == index), None)


def check_layouts(records: dict[int, SyncRecord]) -> LayoutCheck:
    """Each rank's recorded layout of each DTensor parameter against the lowest rank's."""
    out = LayoutCheck()
    ranks = sorted(records)
    if len(ranks) < 2:
        return out
    ref = records[ranks[0]]
    for mod in ref.modules:
        for j, layout in enumerate(mod.param_layouts):
            if layout is None:
                continue
            bad: list[int] = []
            for rank in ranks[1:]:
                other = _module(records[rank], mod.index)
                theirs = other.param_layouts[j] if other is not None and j < len(other.param_layouts) else None
                out.comparisons += 1
                if theirs != layout:
                    bad.append(rank)
            if bad:
                name = mod.params[j] if j < len(mod.params) else f"#{j}"
                out.differ.append((name, layout, bad))
    return out


def never_synced(records: dict[int, SyncRecord]) -> list[UnsyncedStep]:
    """Steps whose optimizer applied gradients of a backward that DDP did not reduce (its forward ran under no_sync)."""
    out: list[UnsyncedStep] = []
    for (step, module), by_rank in sorted(_rows_by_key(records, "grads").items()):
        ranks = sorted(r for r, row in by_rank.items() if row.reduced is False)
        if ranks:
            forwards = max(int(by_rank[r].unsynced_forwards or 0) for r in ranks)
            out.append(UnsyncedStep(step, module, ranks, forwards))
    return out


def unused_parameters(records: dict[int, SyncRecord], names: dict[int, list[str]]) -> dict[int, list[str]]:
    """Parameters whose gradient was None at every checked optimizer step, on every rank."""
    seen: dict[int, set[int]] = {}
    has_rows: set[int] = set()
    for rec in records.values():
        for row in rec.grads:
            m = row.module
            has_rows.add(m)
            seen.setdefault(m, set()).update(j for j, fp in enumerate(row.fp) if fp is not None)
    return {
        m: [n for j, n in enumerate(names.get(m, [])) if j not in seen.get(m, set())]
        for m in sorted(has_rows)
        if any(j not in seen.get(m, set()) for j in range(len(names.get(m, []))))
    }


def _finite(fp: Fingerprint) -> bool:
    return fp is None or all(math.isfinite(_num(x)) for x in fp)


def find_nonfinite(records: dict[int, SyncRecord], kind: Kind, names: dict[int, list[str]]) -> NonFinite | None:
    """The first (step, module) at which any rank's fingerprint of ``kind`` holds NaN or inf."""
    label = _LABEL[kind]
    first: NonFinite | None = None
    steps: set[int] = set()
    for (step, module), by_rank in sorted(_rows_by_key(records, kind).items()):
        bad = {r: [j for j, fp in enumerate(row.fp) if not _finite(fp)] for r, row in by_rank.items()}
        bad = {r: js for r, js in bad.items() if js}
        if not bad:
            continue
        steps.add(step)
        if first is None:
            module_names = names.get(module, [])
            js = sorted({j for v in bad.values() for j in v})
            local = sorted(r for r, row in by_rank.items() if row.local_nonfinite)
            first = NonFinite(label, step, module, [module_names[j] if j < len(module_names) else f"#{j}" for j in js],
                              sorted(bad), local, [])
    if first is not None:
        first.steps = sorted(steps)
        if kind == "grads" and not first.local_ranks:
            # The rank whose own gradient went non-finite first, at any step up to this one (a later row may say it)
            for _key, by_rank in sorted(_rows_by_key(records, kind).items()):
                local = sorted(r for r, row in by_rank.items() if row.local_nonfinite)
                if local:
                    first.local_ranks = local
                    break
    return first


def optimizer_step_values(records: dict[int, SyncRecord], step: int, index: int) -> dict[int, list[float | None]]:
    """Each rank's [step() calls, min, max state['step']] of optimizer ``index`` at ``step``, read back from its
    fingerprints (a 1-element tensor's sum is its value; a 2-element one's first and last samples are its two)."""
    out: dict[int, list[float | None]] = {}
    for rank, rec in sorted(records.items()):
        row = next((r for r in rec.optimizer_steps if r.step == step and r.module == index), None)
        if row is None:
            continue
        calls = row.fp[0] if row.fp else None
        state = row.fp[1] if len(row.fp) > 1 else None
        out[rank] = [_num(calls[1]) if calls else None,
                     *([_num(state[3]), _num(state[6])] if state and _num(state[0]) == 2 else [None, None])]
    return out


def analyze_sync(records: dict[int, SyncRecord]) -> SyncAnalysis:
    """``records``: rank -> that rank's sync.json."""
    ranks = sorted(records)
    modules = list(records[ranks[0]].modules) if ranks else []
    names = {m.index: list(m.params) for m in modules}
    buffer_names = {m.index: list(m.buffers) for m in modules}
    buffers = check_tensors(records, "buffers", buffer_names)
    synced_by_ddp: dict[int, bool] = {}
    for rec in records.values():
        for row in rec.buffers:
            synced_by_ddp[row.module] = synced_by_ddp.get(row.module, True) and bool(row.synced_by_ddp)
    outside = [ParamOutsideDDP(rank, item.name, list(item.shape))
               for rank in ranks for item in records[rank].optimizer_params_outside_ddp]
    equivalence = next((rec.equivalence for rec in records.values()
                        if rec.equivalence is not None and rec.equivalence.relative_error is not None), None)
    if equivalence is None:
        equivalence = next((rec.equivalence for rec in records.values() if rec.equivalence is not None), None)
    steps = [int(rec.steps_completed or 0) for rec in records.values()]
    # Fingerprints stop after --steps (or after MAX_CHECKED_STEPS=200 with --steps 0).
    window = max(int(rec.stop_after or 0) for rec in records.values()) or 200
    optimizers = list(records[ranks[0]].optimizers) if ranks else []
    opt_names = {i: [f"{cls}.step() calls", f"{cls} state['step']"] for i, cls in enumerate(optimizers)}
    opt_check = check_tensors(records, "optimizer_steps", opt_names)
    first = opt_check.diverged[0] if opt_check.diverged else None
    return SyncAnalysis(
        ranks=ranks,
        modules=modules,
        grads=check_tensors(records, "grads", names),
        params=check_tensors(records, "params", names),
        buffers=buffers,
        never_synced=never_synced(records),
        unused=unused_parameters(records, names),
        outside_ddp=outside,
        equivalence=equivalence,
        steps_checked=min(steps + [window]) if steps else 0,
        steps_run=min(steps) if steps else 0,
        buffer_sync_by_ddp=synced_by_ddp,
        layouts=check_layouts(records),
        nonfinite=[nf for nf in (find_nonfinite(records, "grads", names), find_nonfinite(records, "params", names))
                   if nf is not None],
        optimizer_steps=opt_check,
        optimizers=optimizers,
        optimizer_step_values=optimizer_step_values(records, first.step, first.module) if first else {},
    )
