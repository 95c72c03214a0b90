"""The verdict rules on hand-made findings and numbers: intervals, failure first, incomplete runs, one advice per root
cause, and the window finding."""

from __future__ import annotations

import math
import random
import statistics

from ddpdoctor.analyses.intervals import (
    RESAMPLES,
    SEED,
    Interval,
    bootstrap,
    randbelow_many,
    suggested_active,
)
from ddpdoctor.findings.model import Finding, Severity, ordered
from ddpdoctor.findings.perf_verdict import (
    apply_outcome,
    cost,
    failure_outcome,
    group_root_causes,
    run_status_of,
)
from ddpdoctor.findings.window import fitting_flags, window_finding
from ddpdoctor.probes.config import Schedule
from ddpdoctor.rundir.schema import Manifest, RunEnded


def test_bootstrap_is_deterministic_and_brackets_the_value():
    vals = [10.0, 12.0, 11.0, 30.0, 9.0, 10.5]
    a, b = bootstrap(vals), bootstrap(vals)
    assert a == b and a is not None
    assert a.lo <= a.value == sum(vals) / 6 <= a.hi and a.n == 6
    assert bootstrap([5.0, 5.0, 5.0]) == Interval(5.0, 5.0, 5.0, 3)
    one = bootstrap([7.0])
    assert one is not None and not one.measurable and one.undecided(5.0) and not one.above(5.0)
    assert bootstrap([]) is None


def test_bulk_draws_are_the_draws_of_randrange():
    """The bootstrap draws its indices in bulk (intervals.randbelow_many): the very values random.randrange gives one
    at a time, so every interval is what the per-value loop computed (the recorded verdicts were checked against it)."""
    for n in (2, 3, 5, 17, 24, 64, 100, 255, 257, 1000, 2**31 + 5, 2**32 - 1):
        for seed in (0, 7):
            one = random.Random(seed)
            assert randbelow_many(random.Random(seed), n, 3000).tolist() == [one.randrange(n) for _ in range(3000)]
    # The interval itself, against the per-value loop written out.
    vals = [10.0, 12.0, 11.0, 30.0, 9.0, 10.5, 14.0]
    for stat in (statistics.fmean, statistics.median, lambda v: max(v) - min(v)):
        rng = random.Random(SEED)
        stats = sorted(float(stat([vals[rng.randrange(7)] for _ in range(7)])) for _ in range(RESAMPLES))
        iv = bootstrap(vals, stat)
        assert iv is not None
        assert (iv.lo, iv.hi) == (min(stats[int(0.05 * (RESAMPLES - 1))], iv.value),
                                  max(stats[math.ceil(0.95 * (RESAMPLES - 1))], iv.value))


def test_a_figure_over_its_threshold_with_a_wide_interval_is_undecided():
    iv = Interval(value=25.0, lo=15.0, hi=35.0, n=3)
    assert iv.undecided(20.0) and not iv.above(20.0)
    # Half-width 10 over a gap of 5: 4x the steps (x1.2 margin) -> 15.
    assert suggested_active(iv, 20.0, 3) == 15
    assert Interval(25.0, 21.0, 29.0, 10).above(20.0)


def test_cost_is_ms_and_a_share_never_over_100():
    assert cost(2500.0, 10000.0) == {"cost_ms_per_step": 2.5, "cost_pct_of_step": 25.0}
    assert cost(45400.0, 10000.0)["cost_pct_of_step"] == 100.0
    assert cost(None, 10.0) == {"cost_ms_per_step": None, "cost_pct_of_step": None}


def _f(fid: str, sev: Severity = Severity.WARNING, advice: str = "", **ev) -> Finding:
    return Finding(fid, sev, fid, evidence=dict(ev), advice=advice)


def test_failure_first_and_perf_findings_of_an_incomplete_run_are_marked():
    found = [_f("exposed-comm-high"), _f("straggler-rank"), _f("rank-crashed", Severity.ERROR),
             _f("grad-divergence", Severity.ERROR)]
    out = ordered(apply_outcome(found))
    assert [f.id for f in out] == ["rank-crashed", "grad-divergence", "exposed-comm-high", "straggler-rank"]
    perf = {f.id: f for f in out}
    assert perf["exposed-comm-high"].severity is Severity.INFO
    assert perf["exposed-comm-high"].evidence["incomplete_run"] == "crashed"
    assert perf["exposed-comm-high"].title.endswith("(from an incomplete run: crashed)")
    assert perf["grad-divergence"].severity is Severity.ERROR  # not a performance finding: untouched


def test_a_signal_to_ddpdoctor_is_interrupted_or_stopped_never_a_crash():
    assert failure_outcome([_f("job-stopped", signal="SIGINT")]) == "interrupted"
    assert failure_outcome([_f("job-stopped", signal="SIGTERM")]) == "stopped"
    assert run_status_of(Manifest(ended=RunEnded(how="signal", signal="SIGINT", signum=2))) == "interrupted"
    assert run_status_of(Manifest(ended=RunEnded(how="signal", signal="SIGTERM", signum=15))) == "stopped"
    assert run_status_of(Manifest(ended=RunEnded(how="exited", exit_code=0))) is None
    assert apply_outcome([_f("straggler-rank")]) == [_f("straggler-rank")]  # a finished run: nothing marked
    out = apply_outcome([_f("straggler-rank")], "interrupted")
    assert out[0].evidence["incomplete_run"] == "interrupted"


def test_one_root_cause_says_its_advice_once():
    cap = "`DDP(model, bucket_cap_mb=5)`: the bucket what-if predicts 1 ms less exposed communication per step."
    found = [_f("exposed-comm-high", advice=cap), _f("comm-tail-after-backward", advice=cap),
             _f("first-bucket-late", advice="reorder the last layers"),
             _f("bucket-cap-whatif", Severity.INFO, advice="`DDP(model, bucket_cap_mb=5)`, then profile again."),
             _f("data-loading-wait", advice="num_workers")]
    out = {f.id: f for f in group_root_causes(found)}
    assert out["exposed-comm-high"].advice == cap
    assert out["exposed-comm-high"].evidence["related"] == ["comm-tail-after-backward", "first-bucket-late",
                                                           "bucket-cap-whatif"]
    assert out["comm-tail-after-backward"].advice == "See exposed-comm-high."
    assert out["bucket-cap-whatif"].advice == "See exposed-comm-high."  # the same cap, said once
    assert out["first-bucket-late"].advice == "reorder the last layers"  # a different advice stays
    assert out["first-bucket-late"].evidence["root_cause"] == "exposed-comm-high"
    assert out["data-loading-wait"].advice == "num_workers"


def test_window_finding_names_what_the_script_ran_and_flags_that_fit():
    sched = Schedule(wait=2, warmup=1, active=3)
    f = window_finding(1, sched, [0, 1], traced=False)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["iterations_seen"] == 1 and f.evidence["needed"] == 6
    assert "`--wait 0 --warmup 0 --active 1`" in f.advice
    assert fitting_flags(5) == "--wait 1 --warmup 0 --active 4"
    assert window_finding(6, sched, [0], traced=True) is None
    assert window_finding(0, sched, [0], traced=False) is None  # no iteration at all: no-steps-seen says it


def test_a_straggler_needs_a_clear_majority_not_luck():
    from ddpdoctor.findings.perf_balance import clear_majority

    assert not clear_majority(4, 5, 2)  # 6/32 = 19% by chance
    assert clear_majority(5, 5, 2)  # 1/32 = 3%
    assert clear_majority(15, 20, 2) and not clear_majority(13, 20, 2)
    assert not clear_majority(0, 0, 2)


def test_adaptive_window_converges_on_steady_steps_only():
    from ddpdoctor.probes.window import converged

    assert not converged([0.1] * 4, min_steps=5)  # too few
    assert converged([0.100, 0.102, 0.098, 0.101, 0.099], min_steps=5)
    # cv 0.5 over 6 steps: the 90% interval of the mean is ±34%, not within ±10%.
    assert not converged([0.05, 0.15, 0.05, 0.15, 0.05, 0.15], min_steps=5)
    assert Schedule.parse_active("auto").auto and Schedule.parse_active("auto").needed() == 2 + 1 + 5
    assert Schedule.parse_active("7") == Schedule(active=7)


def test_adaptive_window_every_rank_acts_one_iteration_later_without_waiting(monkeypatch):
    """Rank 0 publishes its decision for iteration i; every rank acts on it at i+1. A rank that ends iteration i
    before rank 0 does must not wait for rank 0's i (it would start every step a store round trip late and arrive
    last at every collective: a straggler made by the probe). Real TCPStore, one process."""
    from datetime import timedelta

    import torch.distributed as dist

    from ddpdoctor.probes import window

    real = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    writes = []

    class Counted:  # the real store, its writes counted
        def set(self, key, value):
            writes.append(key)
            real.set(key, value)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(window, "_store", lambda: Counted())
    monkeypatch.setattr(window, "DECISION_TIMEOUT_S", 2.0)
    # Converged from the 4th recorded step on: deterministic, the protocol is what is tested here.
    monkeypatch.setattr(window, "converged", lambda durations, min_steps: len(durations) >= 4)
    r0, r1 = window.AdaptiveWindow(0, 3), window.AdaptiveWindow(1, 3)
    r0.tick()
    r1.tick()
    seen = []
    for it in range(4, 30):
        a = r0.should_stop(it)
        # rank 1 reads rank 0's decision of the previous iteration: present, so this returns at once
        b = r1.should_stop(it)
        seen.append((it, a, b))
        if a:
            break
    assert all(a == b for _, a, b in seen), seen
    # checks every CHECK_EVERY (5) recorded steps: the 5th duration ends at iteration 8, where rank 0 (converged
    # since the 4th) writes its decision, and every rank stops at iteration 9; one write, no other store traffic
    assert window.CHECK_EVERY == 5
    assert seen[-1] == (9, True, True) and not any(a for _, a, _ in seen[:-1])
    assert writes == ["ddpdoctor/window/8"]
    # a decision rank 0 never wrote (rank 0 gone): after the timeout the rank keeps recording, never stops alone
    late = window.AdaptiveWindow(1, 3)
    late._decided = (40, False)
    assert late.should_stop(41) is False


def test_adaptive_window_never_stops_before_10_recorded_steps(monkeypatch):
    """Perfectly steady steps converge at the first check (5 recorded), but a window of 5-6 steps leaves the
    step-time rules undecided: the first check that may stop is the one at 10 recorded steps."""
    from ddpdoctor.probes import window

    clock = iter(i * 0.1 for i in range(1000))  # every step 0.1 s exactly
    monkeypatch.setattr(window.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(window, "_store", lambda: None)
    assert window.EARLY_STOP_MIN == 10
    w = window.AdaptiveWindow(0, 5)
    w.tick()
    stopped = next(it for it in range(1, 100) if w.should_stop(it))
    assert stopped == 11 and len(w.durations) == 11  # decided at 10 recorded steps, acted on one iteration later


def _matched(lates: list[tuple[int, float]]):
    from ddpdoctor.analyses.results import MatchedCollective

    return [MatchedCollective(key=f"g:seq{i}", op="all_reduce", group="g", seq=i, bytes=4, starts_us={0: 0.0, 1: 0.0},
                              ends_us={0: 1.0, 1: 1.0}, arrival_skew_us=late, last_rank=last,
                              lateness_us={last: late, 1 - last: 0.0}) for i, (last, late) in enumerate(lates)]


def _straggler_findings(lates: list[tuple[int, float]], host_cpus: dict | None = None, notes: list | None = None):
    from ddpdoctor.findings.perf_balance import rule_stragglers
    from tests.unit.analysis_builders import analysis, rank, step, stragglers

    steps = [step(n, dur=2000.0) for n in range(20)]  # 2 ms steps: 5% of a step is 100 us
    s = stragglers([0], skew=200.0, waited={0: sum(v for r, v in lates if r == 0)}, steps_by_rank={0: 2000.0, 1: 2000.0})
    s.last_arrival_count = {0: sum(1 for r, _ in lates if r == 0), 1: sum(1 for r, _ in lates if r == 1)}
    a = analysis([rank(0, steps), rank(1, steps)], stragglers=s, matched=_matched(lates), host_cpus=host_cpus or {})
    found = rule_stragglers(a, None)
    if notes is not None:
        notes.extend(a.notes)
    return found


def test_a_straggler_under_one_scheduler_slice_on_a_crowded_host_is_the_hosts():
    # Rank 0 late by 200 us at 31 of 40 (others 40 us at their turn): a straggler on a host with a core to spare...
    lates = [(0, 200.0)] * 31 + [(1, 40.0)] * 9
    assert [f.id for f in _straggler_findings(lates, host_cpus={0: (96, 8), 1: (96, 8)})] == ["straggler-rank"]
    # ... but 2 ranks on 2 cores (no core for the launcher): 0.20 ms is under the 0.75 ms slice, the OS's choice.
    notes: list = []
    assert _straggler_findings(lates, host_cpus={0: (2, 2), 1: (2, 2)}, notes=notes) == []
    assert len(notes) == 1 and "31 of 40" in notes[0] and "by 0.20 ms" in notes[0] and "2 ranks on 2 cores" in notes[0]
    # A late rank by more than a slice (1 ms of 2 ms steps) is named there too.
    [f] = _straggler_findings([(0, 1000.0)] * 31 + [(1, 40.0)] * 9, host_cpus={0: (2, 2), 1: (2, 2)})
    assert f.ranks == [0]


def test_a_straggler_must_be_later_than_the_others_are_when_they_are_last():
    # Rank 0 last at 31 of 40 collectives by 200 us (10% of a 2 ms step: over the 5% threshold on its own), but
    # rank 1, last at the other 9, is late by 240 us (12%): no rank is later than a shared host makes any rank.
    noisy = [(0, 200.0)] * 31 + [(1, 240.0)] * 9
    assert _straggler_findings(noisy) == []
    # The same rank 0 when the others are late by 40 us (2%) at their turn: a straggler, with both figures shown.
    [f] = _straggler_findings([(0, 200.0)] * 31 + [(1, 40.0)] * 9)
    assert f.id == "straggler-rank" and f.ranks == [0]
    assert f.evidence["skew_pct_of_step"]["value"] == 10.0 and f.evidence["background_skew_pct_of_step"] == 2.0
    # 31 x 200 us over 20 steps, waited by the one other rank: 310 us per step; the host's background skew (40 us,
    # the other rank's lateness at its turn) at those 31 collectives, 62 us per step, is removed (issue 39):
    # 248 us per step, 12.4% of the step, and the title says what was removed.
    assert (f.evidence["cost_ms_per_step"], f.evidence["cost_pct_of_step"]) == (0.248, 12.4)
    assert f.evidence["background_wait_removed_ms_per_step"] == 0.062
    assert "0.248 ms per step" in f.title and "beyond the host's background skew (0.062 ms per step)" in f.title
    # Last nearly everywhere (2 others' turns, fewer than BACKGROUND_MIN): the 5% threshold alone decides.
    [f] = _straggler_findings([(0, 200.0)] * 38 + [(1, 400.0)] * 2)
    assert f.evidence["background_skew_pct_of_step"] is None


# One rank's recorded step times (ms) from a healthy 2-rank gloo profile: the first two recorded steps still warm up.
WARMING = [3.98, 4.01, 2.36, 1.73, 2.37, 2.01, 2.20, 1.82, 1.77, 3.14, 2.15, 2.70, 1.97, 2.16, 2.29, 1.77, 2.44, 1.82,
           1.89, 2.45]


def test_warm_up_steps_at_the_window_start_are_not_step_time_variance():
    from ddpdoctor.findings.perf_balance import rule_step_variance, warmup_prefix
    from tests.unit.analysis_builders import analysis, rank, step

    # The fastest of 3.98, 4.01 is over 1.15 x the upper quartile of what follows (2.3675: 2.723); adding 2.36, the
    # fastest of the three is not (2.36 < 1.15 x 2.37 = 2.725). Longer prefixes hold faster steps still.
    assert warmup_prefix(WARMING) == 2
    assert warmup_prefix([2.0] * 9) == 0 and warmup_prefix([9.0] * 3 + [1.0] * 3) == 2  # at most a third
    assert warmup_prefix([2000.0, 1000.0] * 4) == 0  # slow steps that recur after it are no warm-up

    def ids(durs):
        steps = [step(n, dur=1000.0 * d) for n, d in enumerate(durs)]
        return [f.id for f in rule_step_variance(analysis([rank(0, steps), rank(1, steps)]), None)]

    assert ids(WARMING) == []  # counted, the two warm-up steps made it not-measurable here, a warning in the profile
    # The same two slow steps in the middle of the window are what the rule is for.
    periodic = WARMING[2:10] + WARMING[:2] + WARMING[10:]
    assert ids(periodic) == ["step-time-variance"]
