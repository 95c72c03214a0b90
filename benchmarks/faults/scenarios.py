"""The fault scenarios and their ground truth: which job (jobs/*.py) with which fault, on how many ranks and nodes,
the culprit rank(s), the cause class, and the step where the fault starts. The cause classes:

    collective-mismatch   a rank skipped a collective, called an extra one, or one of another op or shape
    left-early            a rank left the training loop (exit, a shorter data shard) while the others go on
    stuck                 a rank stuck outside any collective (I/O, a lock, a sample or worker that never loads,
                          a process that never exits)
    crash                 a rank died: a signal or an exception (its peers' errors are consequences)
    oom                   the host's OOM killer killed a rank
    straggler:PHASE       a rank persistently slower, losing its time in PHASE (forward, backward, data,
                          optimizer; ``straggler`` alone where any phase is a fair answer: host contention, GC)
    divergence:KIND       ranks that should agree do not: grads, params, buffers, data (sampler), nan
    lost-node             (simulated tier) a node stopped publishing: its ranks are the culprits
    healthy               nothing is wrong (the runner counts any fault the tool reports as a false alarm)
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIGNALS = ("KILL", "SEGV", "ABRT", "TERM", "BUS", "FPE", "ILL", "INT", "HUP", "QUIT", "USR1", "PIPE")


@dataclass(frozen=True)
class Scenario:
    name: str
    job: str  # jobs/<job>.py
    fault: str  # $FAULT for the job
    cause: str  # the true cause class
    culprits: tuple[int, ...] | None  # None: no single rank is to blame (every rank has the bug)
    nproc: int = 2  # ranks per node
    nnodes: int = 1
    fault_rank: int = 1
    fault_step: int = 5
    command: str = "run"  # ddpdoctor's command for it: run (the watch) or check-sync
    env: dict[str, str] = field(default_factory=dict)
    tiers: tuple[str, ...] = ("full",)
    accept: tuple[str, ...] = ()  # other cause classes that are right answers too
    timeout_s: float = 240.0

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def healthy(self) -> bool:
        return self.cause == "healthy"

    def right_class(self, predicted: str | None) -> bool:
        if predicted is None:
            return False
        if predicted == self.cause or predicted in self.accept:
            return True
        # "straggler" alone: any phase is right.
        return self.cause == "straggler" and predicted.startswith("straggler")



def _div(name: str, fault: str, cause: str, culprits: tuple[int, ...] | None, nproc: int = 2, nnodes: int = 1,
         fault_rank: int = 1, accept: tuple[str, ...] = ()) -> Scenario:
    """A divergence scenario: jobs/diverge.py under ddpdoctor's check-sync, the fault from step 2."""
    return Scenario(name, "diverge", fault, cause, culprits, nproc, nnodes, fault_rank=fault_rank, fault_step=2,
                    command="check-sync", accept=accept)


def _hang(name: str, fault: str, cause: str, rank: int = 1, nproc: int = 2, nnodes: int = 1,
          timeout_s: float = 240.0, tiers: tuple[str, ...] = ("full",)) -> Scenario:
    return Scenario(name, "hang", fault, cause, (rank,), nproc, nnodes, fault_rank=rank, timeout_s=timeout_s,
                    tiers=tiers)


def _all() -> list[Scenario]:
    s: list[Scenario] = []
    # -- hangs -------------------------------------------------------------------------------------------
    s += [
        _hang("hang-skip-allreduce-2r", "skip-allreduce", "collective-mismatch"),
        _hang("hang-skip-allreduce-4r", "skip-allreduce", "collective-mismatch", rank=2, nproc=4),
        _hang("hang-extra-collective-2r", "extra-collective", "collective-mismatch"),
        _hang("hang-extra-collective-4r", "extra-collective", "collective-mismatch", rank=3, nproc=4),
        _hang("hang-shape-mismatch-2r", "shape-mismatch", "collective-mismatch"),
        _hang("hang-shape-mismatch-4r", "shape-mismatch", "collective-mismatch", rank=1, nproc=4),
        _hang("hang-op-mismatch-4r", "op-mismatch", "collective-mismatch", rank=2, nproc=4),
        _hang("hang-exit-early-2r", "exit-early", "left-early"),
        _hang("hang-exit-early-4r", "exit-early", "left-early", rank=3, nproc=4),
        _hang("hang-loader-exhausted-2r", "loader-exhausted", "left-early", rank=0),
        _hang("hang-stuck-io-2r", "stuck-io", "stuck", tiers=("quick", "full")),
        _hang("hang-stuck-io-4r", "stuck-io", "stuck", rank=2, nproc=4),
        _hang("hang-stuck-lock-2r", "stuck-lock", "stuck"),
        _hang("hang-stuck-loader-2r", "stuck-loader", "stuck"),
        _hang("hang-stuck-worker-2r", "stuck-worker", "stuck"),
        _hang("hang-teardown-2r", "teardown", "stuck", timeout_s=120.0),
        # two nodes of 2 ranks (two launchers), the culprit on the second node
        _hang("hang-stuck-io-2n", "stuck-io", "stuck", rank=3, nnodes=2),
        _hang("hang-exit-early-2n", "exit-early", "left-early", rank=2, nnodes=2),
        _hang("hang-skip-allreduce-2n", "skip-allreduce", "collective-mismatch", rank=3, nnodes=2),
    ]
    # -- crashes -----------------------------------------------------------------------------------------
    for sig in SIGNALS:
        s.append(Scenario(f"crash-signal-{sig.lower()}-2r", "crash", f"signal-{sig}", "crash", (1,),
                          tiers=("full",)))
    s += [
        Scenario("crash-signal-kill-4r", "crash", "signal-KILL", "crash", (2,), nproc=4, fault_rank=2),
        Scenario("crash-exception-2r", "crash", "exception", "crash", (1,)),
        Scenario("crash-exception-4r", "crash", "exception", "crash", (3,), nproc=4, fault_rank=3),
        Scenario("crash-exception-timeout-2r", "crash", "exception-timeout", "crash", (1,),
                 env={"SCENARIO_GLOO_TIMEOUT": "10", "LINGER_S": "40"}),
        Scenario("crash-exception-timeout-4r", "crash", "exception-timeout", "crash", (2,), nproc=4, fault_rank=2,
                 env={"SCENARIO_GLOO_TIMEOUT": "10", "LINGER_S": "40"}),
        Scenario("crash-oom-2r", "crash", "oom", "oom", (1,)),
        Scenario("crash-signal-segv-2n", "crash", "signal-SEGV", "crash", (3,), nnodes=2, fault_rank=3),
        Scenario("crash-exception-2n", "crash", "exception", "crash", (2,), nnodes=2, fault_rank=2),
    ]
    # -- stragglers --------------------------------------------------------------------------------------
    for phase in ("forward", "backward", "data", "optimizer"):
        s.append(Scenario(f"straggler-{phase}-2r", "straggler", phase, f"straggler:{phase}", (1,),
                          ))
    s += [
        Scenario("straggler-forward-4r", "straggler", "forward", "straggler:forward", (2,), nproc=4, fault_rank=2),
        Scenario("straggler-host-contention-2r", "straggler", "host-contention", "straggler", (1,)),
        Scenario("straggler-gc-2r", "straggler", "gc", "straggler", (1,)),
        Scenario("straggler-delayed-collective-2r", "straggler", "delayed-collective", "straggler", (1,)),
        Scenario("straggler-data-2n", "straggler", "data", "straggler:data", (3,), nnodes=2, fault_rank=3),
    ]
    # -- divergence (ddpdoctor's check-sync) ---------------------------------------------------------------
    s += [
        _div("diverge-nan-4r", "nan", "divergence:nan", (2,), nproc=4, fault_rank=2),
        _div("diverge-skip-step-4r", "skip-step", "divergence:params", (1,), nproc=4, accept=("divergence:skip-step",)),
        _div("diverge-param-edit-4r", "param-edit", "divergence:params", (3,), nproc=4, fault_rank=3),
        _div("diverge-grad-scale-4r", "grad-scale", "divergence:grads", (2,), nproc=4, fault_rank=2,
             accept=("divergence:params",)),
        _div("diverge-no-sync-4r", "no-sync", "collective-mismatch", (1,), nproc=4,
             accept=("divergence:grads", "stuck", "left-early")),
        _div("diverge-buffers-2r", "buffers", "divergence:buffers", None),
        _div("diverge-sampler-none-2r", "sampler-none", "divergence:data", None),
        _div("diverge-sampler-no-set-epoch-2r", "sampler-no-set-epoch", "divergence:data", None),
        _div("diverge-sampler-seeds-2r", "sampler-seeds", "divergence:data", None),
        _div("diverge-skip-step-2n", "skip-step", "divergence:params", (3,), nnodes=2, fault_rank=3, accept=("divergence:skip-step",)),
    ]
    # -- healthy jobs with traps -------------------------------------------------------------------------
    s += [
        Scenario("healthy-plain-2r", "healthy", "plain", "healthy", (), tiers=("quick", "full")),
        Scenario("healthy-plain-4r", "healthy", "plain", "healthy", (), nproc=4),
        Scenario("healthy-checkpoint-2r", "healthy", "checkpoint", "healthy", (), env={"CHECKPOINT_S": "20"}),
        Scenario("healthy-slow-first-step-2r", "healthy", "slow-first-step", "healthy", (), env={"FIRST_S": "15"}),
        Scenario("healthy-eval-rank0-2r", "healthy", "eval-rank0", "healthy", (), env={"EVAL_S": "20"}),
        Scenario("healthy-uneven-last-2r", "healthy", "uneven-last", "healthy", ()),
        Scenario("healthy-busy-in-c-2r", "healthy", "busy-in-c", "healthy", (), env={"BUSY_S": "20"}),
        Scenario("healthy-straggler-free-2r", "straggler", "none", "healthy", ()),
        Scenario("healthy-sync-clean-4r", "diverge", "none", "healthy", (), nproc=4, command="check-sync"),
        Scenario("healthy-plain-2n", "healthy", "plain", "healthy", (), nnodes=2),
        Scenario("healthy-checkpoint-2n", "healthy", "checkpoint", "healthy", (), nnodes=2,
                 env={"CHECKPOINT_S": "20"}),
    ]
    return s


SCENARIOS: list[Scenario] = _all()
BY_NAME = {s.name: s for s in SCENARIOS}
assert len(BY_NAME) == len(SCENARIOS), "scenario names are unique"


def tier(name: str) -> list[Scenario]:
    """The scenarios of a tier (quick is a subset of full)."""
    return [s for s in SCENARIOS if name in s.tiers]


def _simulated() -> list[Scenario]:
    """The simulated tier's cases (simulated.py builds each one's job state): 8 nodes, the fault on one rank."""
    cases = [("stuck-data", "stuck"), ("exit-early", "left-early"), ("seq-behind", "collective-mismatch"),
             ("extra-collective", "collective-mismatch"), ("crash", "crash"), ("lost-node", "lost-node"),
             ("busy-checkpoint", "healthy"), ("all-moving", "healthy")]
    out = []
    for ranks, rank in ((1024, 517), (32768, 20000)):
        per = ranks // 8
        for fault, cause in cases:
            culprits: tuple[int, ...] | None = (rank,)
            if cause == "healthy":
                culprits = ()
            elif fault == "lost-node":
                node = rank // per
                culprits = tuple(range(node * per, (node + 1) * per))
            out.append(Scenario(f"sim-{fault}-{ranks}", "simulated", fault, cause, culprits, nproc=ranks // 8, nnodes=8,
                                fault_rank=rank, tiers=("simulated",)))
    return out


SIMULATED = _simulated()
BY_NAME.update({s.name: s for s in SIMULATED})
