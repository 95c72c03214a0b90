"""`ddpdoctor tune`'s experiment: one profiled launch to plan the variants, then short trial launches of the
baseline and each variant, counterbalanced (A B … B A per pair of rounds), each read back as a typed Trial.

Launches go through launch/'s public ``launch``; every trial is a run directory of its own under RUN/trials."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from ddpdoctor.analyses.tune import (
    BASELINE,
    Preparation,
    Setting,
    Trial,
    fsdp_in_effect,
    in_effect,
    job_step_ms,
)
from ddpdoctor.analyses.whatif import CANDIDATE_CAPS_MB, bucket_whatif, ddp_config
from ddpdoctor.errors import BadInput
from ddpdoctor.probes.config import Schedule
from ddpdoctor.renderers import progress
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.schema import FSDPUnit, RankInfo, RankStatus, RankTune

# What a tune run directory holds besides report.json: replaced together by --overwrite.
OWNED = ("profile", "trials", "report.json", "report.html", "scalars")


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def prepare_root(root: Path, overwrite: bool) -> None:
    """The tune run directory: refused when it holds an earlier tune (or any run) unless --overwrite, which removes
    only what a tune writes (never following a link)."""
    from ddpdoctor.rundir.private import claim_run_root

    # Another user's folder, a link or a folder others may write is refused before anything is read, removed or
    # chmod'ed in it (it used to be chmod'ed first).
    claim_run_root(root)
    holds = [n for n in OWNED if (root / n).exists() or (root / n).is_symlink()] + (
        ["manifest.json"] if (root / "manifest.json").exists() else [])
    if holds and not overwrite:
        raise BadInput("already holds a run; choose another --out/--name, or pass --overwrite", root)
    if (root / "manifest.json").exists():
        raise BadInput("holds a run of another command (manifest.json); choose another --out/--name", root)
    for name in OWNED:
        target = root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists() or target.is_symlink():
            target.unlink()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
    except OSError as exc:
        raise BadInput(f"cannot write the run directory ({exc.strerror or exc})", root) from exc


class Experiment:
    """The launches of one tune: ``base`` is the LaunchSpec the command line gave (script, torchrun flags)."""

    def __init__(self, base: Any, root: Path, watch: tuple[float | None, float, str], warmup: int, steps: int,
                 show: bool, guard: Any = None) -> None:
        self.base = base
        self.guard = guard  # launch/user_files.FolderGuard: the user's folders put back after each launch
        self.root = root
        self.watch = watch
        self.warmup = warmup
        self.steps = steps
        self.show = show
        self.launched: list[str] = []

    def _launch(self, run_dir: Path, **fields: Any) -> Any:
        from ddpdoctor.launch.launcher import launch
        from ddpdoctor.launch.monitor import make_watcher

        spec = dataclasses.replace(self.base, run_dir=RunDir(run_dir), overwrite=True, **fields)
        self.launched.append(str(run_dir))
        started_ns = time.time_ns() - 2_000_000_000  # file times may lag the clock by a tick
        try:
            result = launch(spec, make_watcher(*self.watch))
        finally:
            if self.guard is not None:
                self._put_back(started_ns)
        if result.signum:
            # Ctrl-C or a scheduler's SIGTERM stopped the launch (launch/ stopped the job): no further launches.
            raise Stopped(result.signum)
        return result

    def _put_back(self, since_ns: int) -> None:
        from ddpdoctor.launch.user_files import FolderChanged

        try:
            changed = self.guard.restore(since_ns)
        except FolderChanged as exc:
            raise BadInput(f"{exc.why}: the script writes into its folder, so each trial would start from another "
                           f"state and change your files; run tune on a copy (cp -r {exc.path.parent} /tmp/copy, "
                           "then `ddpdoctor tune ... /tmp/copy/SCRIPT` from there)", exc.path) from None
        if changed and not getattr(self, "_said_restored", False):
            self._said_restored = True
            names = ", ".join(p.name for p in changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            progress.say(f"tune: the script changed {names} in its folder; put back after each launch, so every "
                         "trial starts from the state you left", self.show)

    # -- 1. the profiled launch: what can matter for this model -------------------------------------------------
    def profile(self, extra_caps: list[float]) -> Preparation:
        from ddpdoctor.analyses.pipeline import analyze_paths
        from ddpdoctor.findings.perf_ddp_flags import rule_ddp_flags
        from ddpdoctor.findings.tune import gradients_per_step

        run = RunDir(self.root / "profile")
        progress.say("tune: profiling the script's own settings to plan the variants", self.show)
        schedule = Schedule.parse_active("auto")
        result = self._launch(run.root, mode="profile", schedule=schedule, options={"run_to_completion": False})
        statuses = self._statuses(run)
        fsdp = not any(s.ddp_modules for s in statuses) and any(
            k in ("fsdp2", "hsdp") for st in statuses for k in st.parallelism)
        if not any(s.ddp_modules for s in statuses) and not fsdp:
            if result.exit_code:
                raise JobFailed(f"the script failed before building DistributedDataParallel (exit {result.exit_code}); "
                                f"see {run.root / 'ranks'}")
            built = sorted({k for st in statuses for k in st.parallelism})
            if built:  # FSDP1 or tensor parallel alone: one line saying what tune does not do (issue 37)
                raise BadInput(f"the script built {', '.join(built)}, not DistributedDataParallel or FSDP2: tune "
                               "measures DDP's options and FSDP2's knobs only; change a setting in the script and "
                               "compare two profiles with `ddpdoctor diff BASE NEW`", self.base.script)
            raise BadInput("the script never built torch.nn.parallel.DistributedDataParallel, so there are no DDP "
                           "options to tune (tune applies them when the script builds DDP)", self.base.script)
        if not any(s.steps_completed for s in statuses):
            raise BadInput("no training iteration was seen on any rank (no optimizer step and no ddpdoctor.step()); "
                           "call ddpdoctor.step() at the end of each iteration", self.base.script)
        done = max(s.steps_completed or 0 for s in statuses)
        if not run.trace_files() and not result.exit_code and done < schedule.needed():
            raise BadInput(f"the script ran only {done} iteration(s); tune needs {schedule.needed()} for its profiled "
                           f"launch and --warmup + --steps = {self.warmup + self.steps} for each trial: give the "
                           "script more iterations (an argument of the script, e.g. --steps-per-epoch)",
                           self.base.script)
        if not run.trace_files():
            raise JobFailed(f"the profiled launch wrote no trace (exit {result.exit_code}); see {run.root}")
        analysis = analyze_paths([run.root])
        if fsdp:
            units = self._fsdp_units(run)
            if not any(not u.is_root for u in units):
                raise BadInput("the script built FSDP2 with no unit besides the root: there is no prefetch or "
                               "resharding between units to tune (call fully_shard on each layer, then the root)",
                               self.base.script)
            return Preparation(analysis, None, bucket_whatif(analysis, list(CANDIDATE_CAPS_MB)), set(), [], units)
        caps = sorted(set(CANDIDATE_CAPS_MB) | {float(c) for c in extra_caps})
        whatif = bucket_whatif(analysis, caps)
        flags = {f.id for f in rule_ddp_flags(analysis, whatif)}
        return Preparation(analysis, ddp_config(analysis), whatif, flags, gradients_per_step(analysis))

    # -- 2. the trials ----------------------------------------------------------------------------------------
    @staticmethod
    def sequence(labels: list[str], rounds: int) -> list[tuple[int, str]]:
        """(round, label) in launch order: the baseline between every two variant launches, variants in reverse
        order in even rounds: A B A C A | C A B A. Each variant launch is compared with the baseline launches
        just before and after it, so a drift (or a burst of other load) is shared by the pair."""
        out = [(0, BASELINE)]
        for r in range(rounds):
            for label in (labels if r % 2 == 0 else labels[::-1]):
                out += [(r, label), (r, BASELINE)]
        return out

    def run(self, settings: dict[str, Setting], rounds: int) -> list[Trial]:
        stop_after = self.warmup + self.steps
        seq = self.sequence(list(settings), rounds)
        trials = []
        for i, (r, label) in enumerate(seq):
            progress.say(f"tune: launch {i + 1}/{len(seq)}: {label} (round {r + 1})", self.show)
            run = RunDir(self.root / "trials" / f"{i + 1:02d}-{_safe(label)}")
            setting = settings.get(label, {})
            result = self._launch(run.root, mode="tune", schedule=Schedule(),
                                  options={"tune": {"setting": setting, "stop_after": stop_after}}, quiet=True)
            trials.append(self.read_trial(run, label, r, i, setting, result.exit_code))
        return trials

    @staticmethod
    def _fsdp_units(run: RunDir) -> list[FSDPUnit]:
        rank0 = min(run.ranks_present(), default=None)
        info = artefacts.load_optional(run.rank_file(rank0, "info.json"), RankInfo) if rank0 is not None else None
        return list(info.parallelism.fsdp2_units) if info is not None and info.parallelism is not None else []

    def _statuses(self, run: RunDir) -> list[RankStatus]:
        out: list[RankStatus] = []
        for rank in run.ranks_present():
            st = artefacts.load_optional(run.rank_file(rank, "status.json"), RankStatus)
            if st is not None:
                out.append(st)
        return out

    def read_trial(self, run: RunDir, label: str, rnd: int, order: int, setting: Setting,
                   exit_code: int) -> Trial:
        statuses = self._statuses(run)
        times = [[None if t is None else float(t) for t in s.step_times_s] for s in statuses]
        last = self.warmup + self.steps
        step_ms = job_step_ms(times, self.warmup, last)
        rank0 = min(run.ranks_present(), default=None)
        info = artefacts.load_optional(run.rank_file(rank0, "info.json"), RankInfo) if rank0 is not None else None
        tune = artefacts.load_optional(run.rank_file(rank0, "tune.json"), RankTune) if rank0 is not None else None
        modules = info.ddp_modules if info else []
        errors: dict[str, None] = {}  # distinct texts, in rank order (1,024 ranks usually say the same thing)
        for rank in run.ranks_present():
            t = artefacts.load_optional(run.rank_file(rank, "tune.json"), RankTune)
            errors.update(dict.fromkeys(t.errors if t else []))
        units = list(info.parallelism.fsdp2_units) if info is not None and info.parallelism is not None else []
        if units and not modules:  # FSDP2: its knobs, read from the units the rank recorded
            ok, seen = fsdp_in_effect(setting, units, tune.applied if tune else [], list(errors)[:3])
            losses = tuple(_loss(x) for x in (tune.loss_per_iteration if tune else []))
            return Trial(label, rnd, order, tuple(step_ms), losses, ok if setting else True, seen, exit_code, None)
        ok, seen, buckets = in_effect(setting, modules, tune.applied if tune else [], list(errors)[:3])
        losses = tuple(_loss(x) for x in (tune.loss_per_iteration if tune else []))
        return Trial(label, rnd, order, tuple(step_ms), losses, ok if setting else bool(modules), seen, exit_code,
                     buckets)


class Stopped(Exception):
    """ddpdoctor was stopped by a signal during a launch: the command exits 128+signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class JobFailed(Exception):
    """A launch of the user's script failed: tune stops and says where its logs are (exit 1)."""


def _loss(x: Any) -> float | None:
    if x is None:
        return None
    return float(x) if not isinstance(x, str) else float("nan")


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in label)[:60]
