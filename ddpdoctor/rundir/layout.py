"""Where each artefact lives inside a run directory (the serialisable middle of the pipeline).

    RUN/
      manifest.json                    the job: command line, world, versions, env, schedule, DDP modules
      traces/rankR.<ts>.pt.trace.json.gz   profiler traces (a TensorBoard profiler-plugin run named "traces")
      ranks/rankR/info.json            what rank R saw: host, pid, versions, env, its DDP modules and buckets
      ranks/rankR/status.json          how rank R ended: exit code or exception + traceback
      ranks/rankR/summary.json         rank R's own summary of its trace (analyze merges these)
      ranks/rankR/stdout.log|stderr.log    rank R's output
      torchrun/                        torchrun's own log dir
      scalars/rankR/                   TensorBoard scalars per rank
      report.json / report.txt / report.html
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.rundir import artefacts

TRACE_GLOB = "*.pt.trace.json*"
_RANK_DIR = re.compile(r"^rank(\d+)$")


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def torchrun_logs(self) -> Path:
        return self.root / "torchrun"

    @property
    def scalars(self) -> Path:
        return self.root / "scalars"

    def rank_dir(self, rank: int) -> Path:
        return self.root / "ranks" / f"rank{rank}"

    def rank_file(self, rank: int, name: str) -> Path:
        return self.rank_dir(rank) / name

    def ranks_present(self) -> list[int]:
        base = self.root / "ranks"
        if not base.is_dir():
            return []
        found = [int(m.group(1)) for p in base.iterdir() if (m := _RANK_DIR.match(p.name))]
        return sorted(found)

    def trace_files(self) -> list[Path]:
        if not self.traces.is_dir():
            return []
        return sorted(self.traces.glob(TRACE_GLOB))

    def is_run_dir(self) -> bool:
        return self.manifest.is_file()

    # What a launch writes; --overwrite removes exactly these, never anything else a user put there.
    OWNED = ("manifest.json", "traces", "ranks", "torchrun", "scalars", "report.json", "report.txt", "report.html",
             "hang.json", "hang.txt", "live", "captures")

    def clear_rank(self, rank: int) -> None:
        """Remove one rank's files from an earlier run (its rank directory and its traces)."""
        import shutil

        shutil.rmtree(self.rank_dir(rank), ignore_errors=True)
        for old in self.traces.glob(f"rank{rank}.*"):
            old.unlink(missing_ok=True)

    def ensure_writable(self, overwrite: bool = False, keep_existing: bool = False) -> None:
        """Create the directory tree, or raise BadInput naming the directory that cannot be written.

        A directory that already holds a run is refused (its traces would mix with the new ones) unless
        ``overwrite``, which first removes what the earlier launch wrote."""
        from ddpdoctor.rundir.private import claim_run_root, private_dir

        claim_run_root(self.root)  # never a link, never another user's or a folder others may write (docs/trust.md)
        if self.manifest.exists() and not keep_existing:
            if not overwrite:
                raise BadInput("already holds a run; choose another --out/--name, or pass --overwrite", self.root)
            import shutil

            for name in self.OWNED:
                target = self.root / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target, ignore_errors=True)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        try:
            for d in (self.traces, self.root / "ranks", self.scalars):
                private_dir(d)
            # One probe file per launcher: the launchers of a multi-node job share this directory, and with one
            # name a launcher's unlink found the file already gone (ENOENT, "cannot write the run directory").
            probe = self.root / f".write-test.{os.uname().nodename}.{os.getpid()}"  # = gethostname(), no socket import
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            probe.unlink(missing_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot write the run directory ({exc.strerror or exc})", self.root) from exc


def write_json(path: Path, data: Any, compact: bool = False) -> None:
    """Write a run-directory artefact atomically, owner-only, stamped with its schema_version (rundir/artefacts.py)."""
    artefacts.write_json(path, data, compact)


write_private_text = artefacts.write_private_text


def read_json(path: Path) -> Any:
    """Read a JSON file, bounded in size and depth, or raise BadInput naming the file and the problem.
    Artefacts with a schema are better read with rundir.artefacts.load (typed and validated)."""
    return artefacts.decode_json(path)
