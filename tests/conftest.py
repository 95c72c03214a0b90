"""Shared test fixtures: paths, the ../shared reference material, and running the CLI for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests are the same on every run (derandomize: examples seeded from the test's name, no example
# database) and never fail on this loaded 2-core machine's timing (no deadline, no "too slow" health check):
# a test fails on behaviour only. A test's own @settings overrides only the fields it names.
settings.register_profile("ddpdoctor", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ddpdoctor")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
EXAMPLES = REPO / "examples"
SCENARIOS = REPO / "tests" / "scenarios"
SAMPLE_RUN = REPO / "sample_traces" / "mlp_gloo_2rank"


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when the reference material is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"../shared not present ({path})")
    return path


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m ddpdoctor ARGS` as a user would, capturing output."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout, input=input,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep `--dist loadgroup` grouping (CI's `pytest -n 2 --dist loadgroup`) on pytest >= 9.2.

    xdist 3.8 tags a test marked ``xdist_group(NAME)`` by appending ``@NAME`` to the legacy ``_nodeid`` field, and
    its scheduler groups by that suffix. pytest 9.2 keeps a structured ``_id`` instead and no longer reads
    ``_nodeid``, so the tag is lost and grouped tests are spread over both workers
    (pytest-dev/pytest-xdist#1386): every module-scoped run a group shares is then made once per worker. Put the
    same tag on the id pytest reads, where xdist's did not take (a no-op once xdist sets it itself)."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers under --dist loadgroup
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        if not names:
            continue
        suffix = "@" + "_".join(sorted(names))  # xdist's own spelling of the tag
        node_id = getattr(item, "_id", None)
        if node_id is not None and not item.nodeid.endswith(suffix):
            item._id = type(node_id).parse(item.nodeid + suffix)
