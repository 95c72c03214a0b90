"""The TensorBoard scalars of `ddpdoctor tune`: one run per setting (RUN/scalars/tune-<setting>), the job's time
of each measured iteration, launches in order, so that TensorBoard draws the settings on one chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ddpdoctor.analyses.tune import Trial
from ddpdoctor.renderers.tensorboard import _EVENTS_GLOB, _add, _writer
from ddpdoctor.rundir.private import make_private_tree

TAG = "ddpdoctor/tune_step_time_ms"
DESCRIPTION = ("The job's time of each measured iteration (mean over ranks, warm-up left out), ms; a setting's "
               "launches one after another (docs/tune.md).")


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in label)[:80]


def write_tune_scalars(trials: Sequence[Trial], scalars_dir: Path, wall_time: float | None = None) -> list[Path]:
    import time

    wall = time.time() if wall_time is None else wall_time
    by_label: dict[str, list[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.order):
        by_label.setdefault(t.label, []).append(t)
    written = []
    for label, ts in by_label.items():
        logdir = scalars_dir / f"tune-{_safe(label)}"
        logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for old in logdir.glob(_EVENTS_GLOB):
            old.unlink()
        writer = _writer(logdir)
        try:
            i = 0
            for t in ts:
                for ms in t.step_ms:
                    _add(writer, TAG, float(ms), i, wall, DESCRIPTION if i == 0 else None)
                    i += 1
        finally:
            writer.close()
        make_private_tree(logdir)  # TensorBoard writes with the user's umask; the figures are private (0600)
        written.append(logdir)
    return written
