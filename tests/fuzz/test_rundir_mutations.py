"""The review's experiment, kept: run directories with one artefact mutated (a field of another type, a list where an
object is, a string rank, "0x" as a number ...) -> 0 tracebacks. The bulk goes through the loaders and analyses in
this process; a sample goes through the real CLI (`ddpdoctor analyze RUN`)."""

from __future__ import annotations

import json
import os
import random
import shutil
import traceback
from collections import Counter
from pathlib import Path

from ddpdoctor.errors import BadInput
from tests.conftest import run_cli
from tests.fuzz.mutate import damage, dumps, mutate
from tests.fuzz.rundirs import CASES, build, consume

RUN_DIRS = int(os.environ.get("DDPDOCTOR_FUZZ_RUNDIRS", "300"))
CLI_SAMPLE = int(os.environ.get("DDPDOCTOR_FUZZ_CLI", "6"))


def mutate_runs(base: Path, count: int, seed: int = 12) -> tuple[Counter[str], list[str], list[tuple[Path, str]]]:
    """(outcomes, tracebacks, (run, file) of the profile runs made) for ``count`` mutated run directories."""
    rnd = random.Random(seed)
    outcomes: Counter[str] = Counter()
    tracebacks: list[str] = []
    pristine = {kind: build(kind, base / f"pristine-{kind}") for kind in {k for k, _ in CASES}}
    profile_runs: list[tuple[Path, str]] = []
    for i in range(count):
        kind, name = CASES[i % len(CASES)]
        target = pristine[kind] / name
        original = target.read_bytes()
        data = dumps(mutate(json.loads(original), rnd))
        target.write_bytes(damage(data, rnd) if rnd.random() < 0.1 else data)
        try:
            consume(kind, pristine[kind])
            outcomes["result"] += 1
        except BadInput as exc:
            outcomes["bad input"] += 1
            assert "\n" not in str(exc), str(exc)
        except Exception:  # noqa: BLE001 - what this test counts
            outcomes["traceback"] += 1
            tracebacks.append(f"{kind}:{name}: {traceback.format_exc(limit=-3)}")
        if kind == "profile" and len(profile_runs) < CLI_SAMPLE:
            keep = base / f"cli-{i}"
            shutil.copytree(pristine[kind], keep)
            profile_runs.append((keep, name))
        target.write_bytes(original)
    return outcomes, tracebacks, profile_runs


def test_mutated_run_directories_never_give_a_traceback(tmp_path):
    outcomes, tracebacks, cli_runs = mutate_runs(tmp_path, RUN_DIRS)
    assert not tracebacks, f"{len(tracebacks)} tracebacks in {RUN_DIRS} run directories:\n" + "\n".join(tracebacks[:5])
    assert outcomes["result"] + outcomes["bad input"] == RUN_DIRS
    for run, name in cli_runs:
        r = run_cli("analyze", str(run))
        assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, (name, r.stderr[-2000:])
        if r.returncode == 2:
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
