"""The job-wide comparison of per-step fingerprints (job/divergence.py) and the rank-side record
(probes/divergence.py), without a launch; the real gloo launches are tests/e2e/test_divergence.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch

from ddpdoctor.findings.divergence import divergence_findings
from ddpdoctor.job.divergence import DivergenceJudge, DivergenceWatch, record_key
from ddpdoctor.probes.divergence import DivergenceStopped, StepFingerprint


def rec(step: int, colls: int = 1, ops: int = 0, opt: int = 1, loss: int = 1, graphs: int = -1, epoch: int = -1,
        dry: int = 0, batches: int = -1, left: int = -1, why: str | None = None) -> list[Any]:
    out: list[Any] = [step, record_key(colls, ops, opt, loss, graphs, epoch, dry), colls, ops, opt, loss, graphs,
                      epoch, dry, batches, left, 0, 0]
    return out + [{"why": why}] if why is not None else out


def test_agreeing_ranks_are_quiet_and_a_minority_is_named() -> None:
    judge = DivergenceJudge(4)
    for step in (1, 2):
        for r in range(4):
            assert judge.add([r], rec(step)) is None
    assert judge.agreed_step == 2 and not judge.steps
    for r in (0, 1, 3):
        assert judge.add([r], rec(3)) is None
    verdict = judge.add([2], rec(3, loss=0))
    assert verdict is not None
    assert verdict["step"] == 3 and verdict["ranks"] == [2] and verdict["others_count"] == 3
    assert verdict["items"][0]["field"] == "loss" and "non-finite" in verdict["reason"]


@pytest.mark.parametrize(("theirs", "field", "words"), [
    (rec(5, loss=0), "loss", "non-finite"),
    (rec(5, colls=2), "colls", "skipped an optimizer step"),
    (rec(5, ops=123), "ops", "reduce op"),
    (rec(5, graphs=3), "graphs", "recompiled"),
])
def test_one_against_one_the_side_that_changed_is_named(theirs: list[int], field: str, words: str) -> None:
    judge = DivergenceJudge(2)
    for step in range(1, 5):
        judge.add([0], rec(step, graphs=2 if field == "graphs" else -1))
        judge.add([1], rec(step, graphs=2 if field == "graphs" else -1))
    judge.add([0], rec(5, graphs=2 if field == "graphs" else -1))
    verdict = judge.add([1], theirs)
    assert verdict is not None and verdict["ranks"] == [1], verdict
    assert verdict["items"][0]["field"] == field and words in verdict["reason"], verdict
    (finding,) = divergence_findings(verdict)
    assert finding.id == "divergence" and finding.severity.value == "error" and finding.ranks == [1]
    assert "step 5" in finding.title


def test_first_step_tie_without_history_names_the_non_finite_side() -> None:
    judge = DivergenceJudge(2)
    judge.add([1], rec(1, loss=0))
    verdict = judge.add([0], rec(1))
    assert verdict is not None and verdict["ranks"] == [1]


def test_steps_never_completed_are_bounded() -> None:
    judge = DivergenceJudge(2)
    for step in range(1, 2000):
        judge.add([0], rec(step))  # rank 1 never reports
    assert len(judge.steps) <= 512 and judge.verdict is None


@pytest.mark.parametrize("world", [1024, 32768])
def test_job_wide_comparison_is_linear_at_scale(world: int) -> None:
    """Every rank's record of 3 steps, one rank off at step 3: work per record is O(1) (a dict and a list append),
    so 32,768 ranks x 3 steps are ~100k appends; the bound below is 100x what this machine needs."""
    judge = DivergenceJudge(world)
    t0 = time.perf_counter()
    for step in (1, 2, 3):
        for r in range(world):
            verdict = judge.add([r], rec(step, loss=0) if (step, r) == (3, world - 7) else rec(step))
    elapsed = time.perf_counter() - t0
    assert verdict is not None and verdict["ranks"] == [world - 7] and verdict["others_count"] == world - 1
    assert elapsed < 30.0, elapsed  # ~0.1 s for 32,768; quadratic would be hours


class _Monitor:
    world_size = 2
    writes_run_files = True
    decider = None

    def __init__(self, root: Any) -> None:
        self.run_root = root
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.said: list[str] = []

    def rank_ids(self) -> list[int]:
        return [0, 1]

    def send(self, rank: int, msg: dict[str, Any]) -> bool:
        self.sent.append((rank, msg))
        return True

    def say(self, line: str) -> None:
        self.said.append(line)


def test_watch_writes_the_verdict_and_in_stop_mode_releases_or_stops_the_ranks(tmp_path: Any) -> None:
    mon = _Monitor(tmp_path)
    watch = DivergenceWatch("stop")
    assert watch.rank_env() == {"DDPDOCTOR_ON_DIVERGENCE": "stop"}
    watch.on_start(mon)
    watch.on_message(mon, 0, {"type": "fp", "fp": [rec(1), "junk", [1, 2]]})
    watch.on_message(mon, 1, {"type": "fp", "fp": [rec(1)]})
    assert mon.sent == [(0, {"type": "fp-ok", "step": 1}), (1, {"type": "fp-ok", "step": 1})]
    watch.on_message(mon, 0, {"type": "fp", "fp": [rec(2)]})
    watch.on_message(mon, 1, {"type": "fp", "fp": [rec(2, loss=0)]})
    assert [m["type"] for _, m in mon.sent[2:]] == ["divergence-stop", "divergence-stop"]
    assert (tmp_path / "divergence.json").is_file() and "step 2" in mon.said[0]


def test_rank_side_record_and_stop(monkeypatch: Any) -> None:
    class Tracker:
        step = 0
        listeners: list[Any] = []

        def add_listener(self, fn: Any) -> None:
            self.listeners.append(fn)

    fp = StepFingerprint(Tracker(), stop=False)
    fp.install()
    try:
        p = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.1)
        fp.saw_backward(torch.tensor(float("nan")))
        fp.saw_collective("all_reduce", [[2]], (torch.ones(2),), {})
        opt.step()  # the pre-hook takes the record
        (r,) = fp.take()
        assert r[0] == 1 and r[4] == 1 and r[5] == 0 and r[3] != 0
        fp.stopped("test")
        with pytest.raises(DivergenceStopped):
            opt.step()
        assert torch.equal(p.detach(), torch.ones(2))  # nothing applied
    finally:
        fp.finish({})


def test_a_different_reduce_op_changes_the_record() -> None:
    class Tracker:
        step = 0

    a, b = StepFingerprint(Tracker(), stop=False), StepFingerprint(Tracker(), stop=False)
    t = torch.ones(2)
    a.saw_collective("all_reduce", [[2]], (t,), {"op": torch.distributed.ReduceOp.SUM})
    b.saw_collective("all_reduce", [[2]], (t,), {"op": torch.distributed.ReduceOp.MAX})
    assert a._ops != b._ops
    c = StepFingerprint(Tracker(), stop=False)
    c.saw_collective("all_reduce", [[2]], (t,), {"op": torch.distributed.ReduceOp.SUM})
    assert c._ops == a._ops  # deterministic across processes (a CRC, not Python's salted hash)


def test_stop_is_refused_on_a_job_of_several_nodes(tmp_path: Any) -> None:
    mon = _Monitor(tmp_path)
    mon.decider = object()  # type: ignore[assignment]
    watch = DivergenceWatch("stop")
    watch.on_start(mon)
    assert watch.rank_env() == {"DDPDOCTOR_ON_DIVERGENCE": "warn"} and "several nodes" in mon.said[0]


def test_a_recompile_shows_in_the_record() -> None:
    """torch.compile works on this CPU machine (gcc), but a compile costs ~80 s at this load: the record's source,
    torch._dynamo's counter of compiled graphs, is moved by hand as a recompile moves it."""
    from torch._dynamo.utils import counters

    class Tracker:
        step = 0

    fp = StepFingerprint(Tracker(), stop=False)
    before = fp._record(1, opt=1)
    counters["stats"]["unique_graphs"] += 1
    try:
        after = fp._record(2, opt=1)
    finally:
        counters["stats"]["unique_graphs"] -= 1
    assert after[6] == before[6] + 1 and after[1] != before[1]


class _Steps:
    """A stand-in step tracker: ``step`` completed iterations, listeners called by ``end``."""

    def __init__(self) -> None:
        self.step = 0
        self.listeners: list[Any] = []

    def add_listener(self, fn: Any) -> None:
        self.listeners.append(fn)

    def end(self) -> None:
        self.step += 1
        for fn in self.listeners:
            fn(self.step)


def _train(fp: StepFingerprint, loaders: list[Any], peek: bool = False, evaluate: Any = None) -> list[list[int]]:
    """Epochs over ``loaders`` (one per epoch) with an SGD step per batch; ``evaluate`` runs to its end after each
    step; the records taken."""
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    if peek:
        next(iter(loaders[0]))  # a peek at a batch's shape: never fed a step
    for loader in loaders:
        for _ in loader:
            opt.step()
            fp.tracker.end()
            for _ in evaluate or []:
                pass
    return fp.take()


def test_data_position_counts_epochs_batches_left_and_the_loader_running_dry() -> None:
    from torch.utils.data import DataLoader

    fp = StepFingerprint(_Steps(), stop=False)
    fp.install()
    try:
        loader = DataLoader(list(range(6)), batch_size=2)  # 3 batches an epoch
        recs = _train(fp, [loader, loader], peek=True, evaluate=DataLoader(list(range(4)), batch_size=2))
    finally:
        fp.finish({})
    # [step, key, colls, ops, opt, loss, graphs, epoch, dry, batches, left]
    assert [r[7:11] for r in recs] == [[0, 0, 1, 2], [0, 0, 2, 1], [0, 0, 3, 0],
                                     [1, 1, 1, 2], [1, 0, 2, 1], [1, 0, 3, 0]]
    assert recs[3][1] != recs[4][1] and recs[4][1] == recs[5][1]  # the epoch's end is in the key; batches are not
    assert fp.data.dry_step == 6  # ran dry after the 6th step and drew no batch since (the hang verdict reads it)


def test_a_loader_that_runs_dry_first_is_named_with_its_step() -> None:
    judge = DivergenceJudge(2)
    for step in (1, 2, 3):
        judge.add([0], rec(step, epoch=0, batches=step, left=3 - step))
        judge.add([1], rec(step, epoch=0, batches=step, left=5 - step))
    judge.add([1], rec(4, epoch=0, batches=4, left=1))
    verdict = judge.add([0], rec(4, epoch=1, dry=1, batches=1, left=2))  # rank 0's shorter shard, read again
    assert verdict is not None and verdict["ranks"] == [0] and verdict["step"] == 4
    item = verdict["items"][0]
    assert item["field"] == "dry" and "ran dry" in item["text"] and "epoch 1, batch 1, 2 left" in item["text"]
    assert "epoch 0, batch 4, 1 left" in item["text"]


def test_ranks_whose_shards_differ_in_length_agree_while_they_read_the_same_epoch() -> None:
    judge = DivergenceJudge(2)
    for step in (1, 2, 3):
        judge.add([0], rec(step, epoch=0, batches=step, left=3 - step))
        assert judge.add([1], rec(step, epoch=0, batches=step, left=4 - step)) is None
    assert judge.agreed_step == 3


class _Store:
    """The job store's put/get/get_many over a dict (job/store.py seals the values; not what is tested here)."""

    def __init__(self) -> None:
        self.kv: dict[str, Any] = {}
        self.puts = 0

    def put(self, name: str, obj: Any) -> int:
        self.puts += 1
        self.kv[name] = obj
        return 0

    def get(self, name: str) -> Any:
        return self.kv.get(name)

    def get_many(self, names: list[str]) -> dict[str, Any]:
        return {n: self.kv[n] for n in names if n in self.kv}


class _Node(_Monitor):
    def __init__(self, root: Any, ranks: list[int]) -> None:
        super().__init__(root)
        self.ranks = ranks
        self.watch: DivergenceWatch | None = None

    def rank_ids(self) -> list[int]:
        return self.ranks

    def replay(self, rank: int, msg: dict[str, Any]) -> None:
        assert self.watch is not None
        self.watch.on_message(self, rank, msg)


def _two_nodes_in_stop_mode(tmp_path: Any) -> tuple[Any, Any, Any, dict[int, Any]]:
    """A head (ranks 0, 1) and another node (ranks 2, 3), each watching in stop mode and joined by its relay."""
    from ddpdoctor.job.divergence_relay import DivergenceRelay

    store = _Store()
    head, node = _Node(tmp_path, [0, 1]), _Node(None, [2, 3])
    head.world_size = node.world_size = 4  # type: ignore[misc]
    head.decider = node.decider = object()  # type: ignore[assignment]
    node.writes_run_files = False  # type: ignore[misc]
    relays = {0: DivergenceRelay(0, True), 1: DivergenceRelay(1, False)}
    for mon, n in ((head, 0), (node, 1)):
        mon.watch = DivergenceWatch("stop")
        mon.watch.join_job(relays[n])
        mon.watch.on_start(mon)
    return store, head, node, relays


def test_records_relayed_across_nodes_are_judged_on_the_head_and_its_word_reaches_the_other_node(
        tmp_path: Any) -> None:
    from ddpdoctor.job.divergence_relay import WORD

    store, head, node, relays = _two_nodes_in_stop_mode(tmp_path)
    assert not head.said and relays[1].stop_mode

    def step(k: int, bad: dict[str, Any] | None = None) -> None:
        for r in (0, 1):
            head.watch.on_message(head, r, {"type": "fp", "fp": [rec(k)]})  # type: ignore[union-attr]
        for r in (2, 3):
            relays[1].add(r, [rec(k, **(bad or {})) if r == 3 else rec(k)])  # the agent's on_message
            node.watch.on_message(node, r, {"type": "fp", "fp": [rec(k)]})  # type: ignore[union-attr]
        relays[1].publish(store)
        relays[0].take(store, [0, 1], head)
        relays[0].put_word(store)
        relays[1].deliver(store.get(WORD), node)

    step(1)
    assert node.watch is not None and node.watch.judge.judged == 0  # a node does not judge: the head does
    assert head.watch is not None and head.watch.judge.agreed_step == 1
    assert node.sent == [(2, {"type": "fp-ok", "step": 1}), (3, {"type": "fp-ok", "step": 1})]
    assert store.kv["fp-ack/1"] == 1
    relays[1].acked(store.kv["fp-ack/1"])
    puts = store.puts
    relays[1].publish(store, force=True)
    assert store.puts == puts  # acknowledged: nothing to repeat
    step(2, {"loss": 0})
    verdict = json.loads((tmp_path / "divergence.json").read_text())
    assert verdict["ranks"] == [3] and verdict["step"] == 2
    assert [m["type"] for _, m in node.sent[2:]] == ["divergence-stop", "divergence-stop"]
    relays[1].deliver(store.get(WORD), node)
    assert len(node.sent) == 4  # the word is handed over once


def test_a_recompile_on_one_rank_is_named_with_torch_dynamo_s_own_reason() -> None:
    """A real torch.compile (backend "eager": no code generation, ~1 s): a second shape makes it recompile, and
    the record of that step carries the guard that failed, as TORCH_LOGS=recompiles words it."""
    import torch._dynamo

    from ddpdoctor.job.divergence import valid

    torch._dynamo.reset()
    fp = StepFingerprint(_Steps(), stop=False)
    f = torch.compile(lambda x: (x * 2).sum(), backend="eager")
    f(torch.ones(4, 3))
    first = fp._record(1, opt=1)
    f(torch.ones(4, 3))
    same = fp._record(2, opt=1)
    f(torch.ones(6, 3))  # another shape: the guard on its size fails
    again = fp._record(3, opt=1)
    assert valid(first) and valid(again) and len(same) == 13 and same[1] == first[1]
    assert again[6] == first[6] + 1 and again[11] == first[11] + 1, (first, again)
    why = again[13]["why"]
    assert why.startswith("recompiled <lambda> (test_divergence.py:") and "size mismatch at index 0" in why, why
    judge = DivergenceJudge(2)
    for step, r0, r1 in ((2, same, same), (3, [3, *same[1:]], again)):
        judge.add([0], [step, *r0[1:]])
        verdict = judge.add([1], r1)
    assert verdict is not None and verdict["ranks"] == [1] and verdict["items"][0]["field"] == "graphs"
    assert "its torch.compile: recompiled <lambda>" in verdict["reason"], verdict["reason"]


def test_the_verdict_reaches_status_prometheus_and_the_live_scalars(tmp_path: Any) -> None:
    """The watch hands the verdict to the live watch (on_divergence): an alert that `status` lists, the Prometheus
    endpoint exports (first step, each rank with its item) and the live TensorBoard scalars hold."""
    import urllib.request

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from ddpdoctor.live.export import PrometheusExporter, TensorBoardExporter
    from ddpdoctor.live.health import LiveHealth
    from ddpdoctor.live.status import load_status, status_text

    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    health = LiveHealth(tmp_path, world_size=2)
    health.local_ranks = 2
    for s in range(1, 6):
        for r in range(2):
            health.ingest(r, [[s, 0.01, {"forward": 0.004, "backward": 0.006}]], "forward")
    health.tick(now=1000.0, force=True)
    tb = TensorBoardExporter(tmp_path / "scalars" / "live")
    tb.update(health)

    class Live:  # the live watch's hook, as live/watch.py has it, on this health
        exporters = [tb]
        from ddpdoctor.live.watch import LiveWatch
        on_divergence = LiveWatch.on_divergence

    live = Live()
    live.health = health  # type: ignore[attr-defined]
    mon = _Monitor(tmp_path)
    mon.plugins = [live]  # type: ignore[attr-defined]
    watch = DivergenceWatch("warn")
    watch.on_start(mon)
    for step in (1, 2):
        watch.on_message(mon, 0, {"type": "fp", "fp": [rec(step)]})
        watch.on_message(mon, 1, {"type": "fp", "fp": [rec(step, colls=2) if step == 2 else rec(step)]})
    health.tick(now=1001.0, force=True)
    (alert,) = [a for a in health.alerts if a["id"] == "divergence"]
    assert alert["ranks"] == [1] and alert["evidence"]["step"] == 2 and alert["evidence"]["field"] == "colls"
    assert "divergence: ranks diverged at step 2: rank 1: 2 collectives" in status_text(load_status(tmp_path, now=1001.0))
    exporter = PrometheusExporter("127.0.0.1", 0)
    try:
        exporter.update(health)
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    assert "ddpdoctor_divergence_step 2.0" in body and 'ddpdoctor_divergence_rank{item="colls",rank="1"} 1.0' in body
    assert 'ddpdoctor_alerts_total{id="divergence"} 1.0' in body
    tb.close()
    acc = EventAccumulator(str(tmp_path / "scalars" / "live"))
    acc.Reload()
    (point,) = acc.Tensors("live/divergence/step")
    assert point.step == 2 and float(tensor_util.make_ndarray(point.tensor_proto)) == 2.0
    assert [p.step for p in acc.Tensors("live/divergence/rank1")] == [2]


def test_a_collective_of_another_shape_is_named_with_both_sides_calls() -> None:
    """Same element count, another shape (gloo all-reduces it without a word): the step's calls ride in the record
    only when they changed from the previous step, and the verdict quotes the first that differs."""
    from ddpdoctor.job.divergence import valid

    a, b = StepFingerprint(_Steps(), stop=False), StepFingerprint(_Steps(), stop=False)
    for fp, shape in ((a, (8,)), (b, (2, 4))):
        fp.saw_collective("all_reduce", [[4]], (torch.ones(4),), {})
        fp._record(1, opt=1)
        fp.saw_collective("all_reduce", [[4]], (torch.ones(4),), {})
        assert len(fp._record(2, opt=1)) == 13  # the same calls as the step before: nothing extra on the wire
        fp.saw_collective("all_reduce", [[4]], (torch.ones(4),), {})
        fp.saw_collective("all_reduce", [list(shape)], (torch.ones(shape),), {})
    ra, rb = a._record(3, opt=1), b._record(3, opt=1)
    assert valid(ra) and ra[13]["calls"][1] == "all_reduce|[[8]]|torch.float32|None"
    judge = DivergenceJudge(3)
    for r, rec3 in ((0, ra), (1, ra), (2, rb)):
        verdict = judge.add([r], rec3)
    assert verdict is not None and verdict["ranks"] == [2] and verdict["items"][0]["field"] == "ops"
    assert verdict["items"][0]["text"].endswith(
        ": call 2 of step 3: all_reduce sizes [[2, 4]] torch.float32, the other ranks all_reduce sizes [[8]] "
        "torch.float32"), verdict["items"][0]["text"]


def test_a_rank_whose_loader_ran_dry_and_left_its_loop_is_named_by_its_dry_event() -> None:
    """The dry event (probes/data_position.dry_event) of rank 0 after step 3, while rank 1's record of step 3 has
    batches left: named at once (step 4, rank 0), whichever of the two the judge hears first."""
    for event_first in (False, True):
        judge = DivergenceJudge(2)
        for step in (1, 2, 3):
            judge.add([0], rec(step, epoch=0, batches=step, left=3 - step))
            if step < 3 or not event_first:
                judge.add([1], rec(step, epoch=0, batches=step, left=5 - step))
        t = int(time.time() * 1000)
        verdict = judge.add_dry(0, 3, t)
        if event_first:
            assert verdict is None
            verdict = judge.add([1], rec(3, epoch=0, batches=3, left=2))
        assert verdict is not None and verdict["ranks"] == [0] and verdict["step"] == 4, verdict
        (item,) = verdict["items"]
        assert item["field"] == "dry" and "ran dry (StopIteration) after step 3" in item["text"], item
        assert "rank 1 goes on to step 4 (2 batch(es) left" in item["text"], item
        assert 0 <= verdict["after_first_record_s"] < 60
    # A loader without a length (left -1): named once the other rank records step 4 with no StopIteration since.
    judge = DivergenceJudge(2)
    for step in (1, 2, 3):
        judge.add([0], rec(step, epoch=0))
        judge.add([1], rec(step, epoch=0))
    assert judge.add_dry(0, 3, int(time.time() * 1000)) is None
    verdict = judge.add([1], rec(4, epoch=0))
    assert verdict is not None and verdict["ranks"] == [0] and verdict["step"] == 4
    assert "it recorded that step without its loader ending" in verdict["reason"]


def test_every_rank_running_dry_at_the_same_step_is_quiet() -> None:
    """The end of an epoch (or of training): both loaders end after step 3, both dry events come, the next epoch's
    records say so (dry 1): no verdict."""
    judge = DivergenceJudge(2)
    for step in (1, 2, 3):
        for r in (0, 1):
            assert judge.add([r], rec(step, epoch=0, batches=step, left=3 - step)) is None
    assert judge.add_dry(0, 3, 0) is None and judge.add_dry(1, 3, 0) is None
    for r in (0, 1):
        assert judge.add([r], rec(4, epoch=1, dry=1, batches=1, left=2)) is None
    assert judge.verdict is None and judge.agreed_step == 4


def test_the_dry_event_waits_for_a_restart_and_never_comes_inside_join() -> None:
    from types import SimpleNamespace

    from torch.distributed.algorithms.join import Join
    from torch.utils.data import DataLoader

    original = Join.__enter__
    fp = StepFingerprint(_Steps(), stop=False)
    fp.install()
    try:
        loader = DataLoader(list(range(4)), batch_size=2)
        _train(fp, [loader])
        ran_dry = fp.data._dry_at
        assert fp.data.dry_step == 2
        assert fp.data.dry_event(now=ran_dry + 0.01) is None  # a restart may still come (the next epoch)
        assert fp.data.dry_event(now=ran_dry + 1.0) == ["dry", 2, int(ran_dry * 1000)]
        assert fp.data.dry_event(now=ran_dry + 2.0) is None  # once per dry step
        _train(fp, [loader])  # the next epoch at once: drew a batch, so no event for step 4 until it ran dry again
        assert fp.outgoing(ending=True)[-1] == ["dry", 4, int(fp.data._dry_at * 1000)]  # ending: no wait
        join = SimpleNamespace(_enable=False)  # what Join.__exit__ reads first (no process group needed)
        Join.__enter__(join)  # type: ignore[arg-type]
        _train(fp, [loader])  # a last uneven batch under Join: its loader's end is by design
        Join.__exit__(join, None, None, None)  # type: ignore[arg-type]
        assert fp.data.dry_step == 6 and fp.outgoing(ending=True) == []
    finally:
        fp.finish({})
    assert Join.__enter__ is original and fp.data._join_saved is None  # put back


def test_a_dry_event_on_the_other_node_is_relayed_and_named_on_the_head(tmp_path: Any) -> None:
    """Rank 3 (node 1) ran dry after step 2 and left its loop; rank 0 (the head's) has batches left: the relay
    carries the dry event among the records (job/divergence_relay.py) and the head names rank 3 at step 3."""
    from ddpdoctor.job.divergence_relay import WORD

    store, head, node, relays = _two_nodes_in_stop_mode(tmp_path)
    for k in (1, 2):
        for r in (0, 1):
            head.watch.on_message(head, r, {"type": "fp", "fp": [rec(k, epoch=0, left=4 - k)]})  # type: ignore[union-attr]
        for r in (2, 3):
            left = 2 - k if r == 3 else 4 - k
            relays[1].add(r, [rec(k, epoch=0, left=left)] + ([["dry", 2, 1000]] if r == 3 and k == 2 else []))
    relays[1].publish(store)
    relays[0].take(store, [0, 1], head)
    relays[0].put_word(store)
    relays[1].deliver(store.get(WORD), node)
    verdict = json.loads((tmp_path / "divergence.json").read_text())
    assert verdict["ranks"] == [3] and verdict["step"] == 3 and verdict["items"][0]["field"] == "dry", verdict
    assert "after step 2" in verdict["reason"] and "goes on to step 3" in verdict["reason"]
    assert [m["type"] for _, m in node.sent if m["type"] == "divergence-stop"] == ["divergence-stop"] * 2


class _DDPLike:
    """What probes/divergence._named_params reads of a DistributedDataParallel: ``module`` and its reducer's list."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._module_parameters = list(module.parameters())
        self.parameters_to_ignore: set[str] = set()


def _backward_steps(fp: StepFingerprint, net: torch.nn.Module, steps: int, freeze_at: int | None) -> list[Any]:
    for step in range(1, steps + 1):
        if step == freeze_at:
            net[0].requires_grad_(False)
        loss = torch.tensor(0.5)
        fp.saw_backward(loss)
        fp.saw_backward(loss)  # a second backward in the step (gradient accumulation): one event a step
        fp.tracker.end()
    return [ev for ev in fp.take() if ev[0] == "grads"]


def test_the_grad_set_event_counts_the_managed_parameters_and_names_those_that_changed() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    ddp = _DDPLike(net)
    fp = StepFingerprint(_Steps(), stop=False, managed=lambda: [ddp])
    evs = _backward_steps(fp, net, 4, freeze_at=3)
    crc_all, crc_frozen = evs[0][4], evs[2][4]
    assert [ev[:4] for ev in evs] == [["grads", 1, 4, 4], ["grads", 2, 4, 4], ["grads", 3, 2, 4], ["grads", 4, 2, 4]]
    assert crc_all == evs[1][4] and crc_frozen == evs[3][4] and crc_all != crc_frozen
    assert evs[2][5] == {"off": ["0.weight", "0.bias"], "on": []}  # names only in the step it changed
    assert [len(ev) for ev in evs] == [5, 5, 6, 5]
    assert StepFingerprint(_Steps(), stop=False, managed=lambda: []).outgoing() == []  # no DDP/FSDP2: no event


def _grads(step: int, count: int, total: int = 4, crc: int | None = None, off: list[str] | None = None) -> list[Any]:
    ev: list[Any] = ["grads", step, count, total, crc if crc is not None else count]
    return ev + [{"off": off, "on": []}] if off else ev


def test_a_layer_frozen_on_one_rank_is_named_at_its_step_by_the_grad_set() -> None:
    mon = _Monitor(None)
    watch = DivergenceWatch("warn")
    watch.on_start(mon)
    for step in (1, 2):
        for rank in (0, 1):
            watch.on_message(mon, rank, {"type": "fp", "fp": [_grads(step, 4)]})
    watch.on_message(mon, 0, {"type": "fp", "fp": [_grads(3, 4)]})  # rank 0 then waits inside step 3's backward
    watch.on_message(mon, 1, {"type": "fp", "fp": [_grads(3, 2, off=["0.weight", "0.bias"]), rec(3)]})
    v = watch.judge.verdict
    assert v is not None and v["step"] == 3 and v["ranks"] == [1] and v["job"] == {"grads": 4, "params": 4}, v
    assert v["items"][0]["field"] == "grads" and v["items"][0]["rank_value"] == 2
    assert v["reason"].startswith("rank 1: builds gradients for 2 of the 4 parameters DDP/FSDP2 manage at step 3, "
                                  "the other ranks for 4 (it stopped building 0.weight, 0.bias)"), v["reason"]
    assert "the side named is the one that changed" in v["reason"]
    (f,) = divergence_findings(v)
    assert f.ranks == [1] and "requires_grad" in f.advice


def test_every_rank_freezing_or_unfreezing_at_the_same_step_and_pipeline_stages_are_quiet() -> None:
    judge = DivergenceJudge(4)
    for step, count in ((1, 4), (2, 4), (3, 2), (4, 2), (5, 4)):  # a fine-tuning schedule, on every rank alike
        for rank in range(4):
            assert judge.add_grads([rank], _grads(step, count)) is None
    for rank in range(4):  # two pipeline stages: other models, other parameter counts
        assert judge.add_grads([rank], _grads(6, 4 if rank < 2 else 6, total=4 if rank < 2 else 6)) is None
    assert judge.verdict is None and not judge.grad_steps


def test_stop_mode_ends_a_job_whose_ranks_all_wait_in_a_collective_after_the_verdict(tmp_path: Any) -> None:
    from ddpdoctor.job.divergence import STOP_END_S

    class Mon(_Monitor):
        ended: list[int] | None = None
        beats: dict[int, Any] = {0: {"collective": {"op": "barrier"}}, 1: {"backward": {"seq": 9}}}

        def snapshot(self) -> dict[int, Any]:
            return {r: {"beat": b, "exit": None} for r, b in self.beats.items()}

        def end_now(self, ranks: list[int]) -> bool:
            self.ended = ranks
            return True

    mon = Mon(tmp_path)
    watch = DivergenceWatch("stop")
    watch.on_start(mon)
    watch.on_tick(mon, time.time() + 60)  # no verdict yet: nothing
    watch.on_message(mon, 0, {"type": "fp", "fp": [rec(1)]})
    watch.on_message(mon, 1, {"type": "fp", "fp": [rec(1, loss=0)]})
    t = watch._stop_at
    assert t is not None
    mon.beats[1] = {"step": 1}  # rank 1 is doing something else (saving in a finally): left to end on its own
    watch.on_tick(mon, t + STOP_END_S + 1)
    assert mon.ended is None
    mon.beats[1] = {"backward": {"seq": 9}}
    watch.on_tick(mon, t + STOP_END_S / 2)  # too early
    assert mon.ended is None
    watch.on_tick(mon, t + STOP_END_S + 1)
    assert mon.ended == [0, 1] and "ending the job" in mon.said[-1]
    warn = DivergenceWatch("warn")  # warn mode never ends the job
    warn.on_start(mon)
    mon.ended = None
    warn.on_message(mon, 0, {"type": "fp", "fp": [rec(1)]})
    warn.on_message(mon, 1, {"type": "fp", "fp": [rec(1, loss=0)]})
    warn.on_tick(mon, time.time() + 60)
    assert mon.ended is None


def test_the_gradient_norm_the_script_computes_is_recorded_and_returned_unchanged() -> None:
    import torch.nn.utils.clip_grad as clip_grad

    originals = (torch.nn.utils.clip_grad_norm_, clip_grad.clip_grad_norm_, torch.nn.utils.get_total_norm)
    fp = StepFingerprint(_Steps(), stop=False)
    fp.install()
    try:
        from torch.nn.utils import clip_grad_norm_  # imported after the probe installed, as a script does

        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([p], lr=0.1)
        out = []
        for grad in (torch.ones(3), torch.tensor([1.0, float("inf"), 0.0])):
            p.grad = grad.clone()
            out.append(clip_grad_norm_([p], max_norm=1.0))  # the wrapper: the value the script gets is torch's
            torch.nn.utils.get_total_norm([p.grad])  # twice in a step: one event, finite only if both were
            opt.step()
            fp.tracker.end()
        assert float(out[0]) == pytest.approx(3 ** 0.5) and not torch.isfinite(out[1])
        evs = [ev for ev in fp.take() if ev[0] != "grads"]
        assert [ev for ev in evs if ev[0] == "gnorm"] == [["gnorm", 1, 1], ["gnorm", 2, 0]]
        assert evs[0] == ["gnorm", 1, 1] and evs[1][0] == 1  # the step's norm goes before its record
    finally:
        fp.finish({})
    assert (torch.nn.utils.clip_grad_norm_, clip_grad.clip_grad_norm_, torch.nn.utils.get_total_norm) == originals


def test_a_norm_still_being_copied_to_the_host_waits_and_goes_out_once() -> None:
    """The CUDA path's bookkeeping with a stand-in event (no GPU here): a step whose copy has not completed waits
    whole; the heartbeat's next tick sends it once."""

    class Event:
        done = False

        def query(self) -> bool:
            return self.done

    ev = Event()
    fp = StepFingerprint(_Steps(), stop=False)
    fp._norms = [("gnorm", 1, True, None), ("gnorm", 2, True, None), ("gnorm", 2, torch.tensor(float("nan")), ev),
                 ("loss", 2, torch.tensor(1.0), Event()), ("gnorm", 3, True, None)]
    fp._norms[3][3].done = True  # step 2's CUDA loss has reached the host: it goes alone
    fp._recorded = 2
    assert fp.outgoing() == [["gnorm", 1, 1], ["loss", 2, 1]]  # step 2's norm waits for its copy; 3 not recorded
    ev.done = True
    assert fp.outgoing() == [["gnorm", 2, 0]]
    assert fp.outgoing() == [] and fp._norms == [("gnorm", 3, True, None)]


def test_a_rank_whose_gradient_norm_goes_non_finite_alone_is_named_and_all_at_once_is_quiet() -> None:
    mon = _Monitor(None)
    watch = DivergenceWatch("stop")
    watch.on_start(mon)
    for rank in (0, 1):  # every rank non-finite at once (DDP averaged one rank's NaN): not a divergence of ranks
        watch.on_message(mon, rank, {"type": "fp", "fp": [["gnorm", 1, 0], rec(1)]})
    assert watch.judge.verdict is None
    watch.on_message(mon, 0, {"type": "fp", "fp": [["gnorm", 2, 1], rec(2)]})
    watch.on_message(mon, 1, {"type": "fp", "fp": [["gnorm", 2, 0], rec(2)]})
    v = watch.judge.verdict
    assert v is not None and v["step"] == 2 and v["ranks"] == [1] and v["items"][0]["field"] == "gnorm", v
    assert v["reason"].startswith("rank 1: its gradient norm (the value clip_grad_norm_ or get_total_norm returned) "
                                  "went non-finite (NaN/inf) at step 2 while the other ranks' was finite")
    assert [m["type"] for _, m in mon.sent if m["type"] != "fp-ok"] == ["divergence-stop"] * 2  # before step 2's ok
    assert {"type": "fp-ok", "step": 2} not in [m for _, m in mon.sent]
    judge = DivergenceJudge(2)  # a CUDA loss, read late: the same rule under its own kind
    assert judge.add_norm(0, 7, 1, "loss") is None and judge.add_norm(0, 7, 1, "gnorm") is None
    v = judge.add_norm(1, 7, 0, "loss")
    assert v is not None and v["ranks"] == [1] and v["items"][0]["field"] == "loss" and "a CUDA loss" in v["reason"]
