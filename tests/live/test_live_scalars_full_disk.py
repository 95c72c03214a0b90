"""The live TensorBoard scalars on a full disk (issue 26, item 11): the writer's own thread printed an ENOSPC
traceback over the job's output; now the scalars stop with a reason and the watch goes on. Needs root to mount a
small tmpfs (else skipped)."""

from __future__ import annotations

import time
from pathlib import Path

from ddpdoctor.live.export import TensorBoardExporter
from ddpdoctor.live.health import LiveHealth
from tests.smalldisk import small_disk


def test_live_scalars_stop_quietly_when_the_disk_fills(tmp_path: Path, capfd) -> None:
    with small_disk("40k") as disk:
        health = LiveHealth(tmp_path / "run", world_size=2)
        exporter = TensorBoardExporter(disk / "scalars" / "live")
        step = 0
        for _ in range(400):  # ~100 bytes a point, 3 tags per rank and step: well past 40 KiB
            for _ in range(5):
                step += 1
                for r in (0, 1):
                    health.ingest(r, [[step, 0.1, {"forward": 0.05, "backward": 0.05}]], "forward")
            health.tick(now=1000.0 + step, force=True)
            exporter.update(health)
            if getattr(exporter, "failed", None):
                break
        time.sleep(0.5)  # the writer thread's failure, had it printed anything
        exporter.close()
        exporter.update(health)  # after a failure: nothing more is tried
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    assert exporter.failed and "No space left on device" in exporter.failed
