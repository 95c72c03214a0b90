"""No behaviour change (issue 25, point 6): the `--json` of every command on recorded run directories, logs and
traces, compared with the documents recorded from main before the report pipeline was reshaped.

The goldens live in tests/fixtures/golden/<case>.json ({"exit_code", "json"}). Only what is genuinely volatile is
normalised: the input and temporary paths (<IN>, <TMP>), ddpdoctor's version, and `status`'s age_s.
`analyze`, `logs`, `topo` and `status` run through the real command line (click, in process). The launching
commands (`profile`, `run`, `check-sync`, `capture`, `preflight`) cannot relaunch a recorded job, so their cases run
what the command does once the launch has ended (the report assembly) on a recorded run directory
(tests/fixtures/golden_runs, README inside).

When a change to the JSON is intended (a new key, a new finding), regenerate and read the diff before committing:
    DDPDOCTOR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_golden_json.py -q
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
GOLDEN = FIX / "golden"
RUNS = FIX / "golden_runs"
UPDATE = os.environ.get("DDPDOCTOR_UPDATE_GOLDEN") == "1"

Result = tuple[int, dict[str, Any]]


def _cli(*args: str) -> Result:
    from ddpdoctor.cli import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert res.stdout.strip(), f"no JSON on stdout (exit {res.exit_code}): {res.stderr[-2000:]}"
    return res.exit_code, json.loads(res.stdout)


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / src.name
    shutil.copytree(src, dst)
    return dst


# --- the launching commands, from the moment their launch has ended (each mirrors its command's code) -----------


def _emit_code(report: Any, fail_on: str = "error", job_exit: int | None = None) -> int:
    from ddpdoctor.findings.model import Severity

    code = 0 if fail_on == "none" else report.exit_code(Severity(fail_on))
    if job_exit:
        code = max(code, job_exit if job_exit in (1, 2) else 1)
    if report.stopped:
        code = int(report.stopped["exit_code"])
    return int(code)


def _profile(run_root: Path) -> Result:
    from ddpdoctor.probes.config import Schedule
    from ddpdoctor.reports.profile import assemble
    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(run_root)
    manifest = manifest_mod.load(run)
    report = assemble(run, Schedule(**manifest["schedule"]), locked=False,
                      nccl_debug=bool((manifest.get("options") or {}).get("nccl_debug")))
    return _emit_code(report, job_exit=manifest.get("exit_code")), report.to_json()


def _run(run_root: Path) -> Result:
    from ddpdoctor.reports.run import assemble
    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(run_root)
    manifest = manifest_mod.load(run)
    options = manifest.get("options") or {}
    report = assemble(run, locked=False, debug=bool(options.get("debug")), nccl_debug=bool(options.get("nccl_debug")))
    return _emit_code(report, job_exit=1 if manifest.get("exit_code") else None), report.to_json()


def _check_sync(run_root: Path) -> Result:
    from ddpdoctor.reports.check_sync import assemble
    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(run_root)
    exit_code = manifest_mod.load(run).get("exit_code")
    report = assemble(run, exit_code, locked=False)
    return _emit_code(report, job_exit=exit_code), report.to_json()


def _capture_profile(window: Path) -> Result:
    from ddpdoctor.reports.capture import assemble_profile
    from ddpdoctor.rundir.layout import RunDir

    report = assemble_profile(RunDir(window), None)
    return _emit_code(report), report.to_json()


def _capture_sync(window: Path) -> Result:
    from ddpdoctor.reports.capture import assemble_check_sync
    from ddpdoctor.rundir.layout import RunDir

    report = assemble_check_sync(RunDir(window), None)
    return _emit_code(report), report.to_json()


def _preflight(run_root: Path) -> Result:
    from ddpdoctor.commands.preflight import build_report
    from ddpdoctor.preflight.checks import exit_code
    from ddpdoctor.preflight.merge import MergeOptions, load_records, merge
    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(run_root)
    manifest = manifest_mod.load(run)
    records = load_records(run.root)
    checks = merge(records, MergeOptions(expected_world_size=manifest.get("world_size"), min_busbw_gbps=None,
                                         slow_rank_share=0.2, killed_by=manifest.get("killed_by"), local_view=False),
                   "NCCL not used (gloo)")
    report = build_report(checks, run, float(manifest.get("duration_s") or 0.0), manifest.get("killed_by"))
    return max(_emit_code(report), exit_code(checks)), report.to_json()


# --- the cases -----------------------------------------------------------------------------------------------------

DISCOVERED: set[str] = set()
RUN_DIRS = {"mlp": FIX / "analyze" / "gloo_2rank_mlp", "sample": REPO / "sample_traces" / "mlp_gloo_2rank",
            "healthy1": FIX / "verdicts" / "healthy_run1", "healthy4": FIX / "verdicts" / "healthy_run4"}


def _cases() -> dict[str, tuple[Path, Callable[[Path], Result], bool]]:
    """name -> (input, what to run on it, whether to run it on a private copy). The log and NCCL fixtures are found
    by listing their folders (DISCOVERED): one added later has no golden until it is recorded."""
    cases: dict[str, tuple[Path, Callable[[Path], Result], bool]] = {}
    for name, path in RUN_DIRS.items():
        cases[f"analyze-{name}"] = (path, lambda p: _cli("analyze", str(p), "--workers", "1", "--json"), False)
    cases["analyze-mlp-reread"] = (RUN_DIRS["mlp"], lambda p: _cli("analyze", str(p), "--reread", "--workers", "1",
                                                                    "--json"), False)
    cases["analyze-mlp-hta"] = (RUN_DIRS["mlp"], lambda p: _cli("analyze", str(p), "--window", "hta", "--workers",
                                                                 "1", "--json"), False)
    cases["analyze-traces"] = (FIX / "views" / "traces", lambda p: _cli("analyze", str(p), "--workers", "1", "--json"),
                               False)
    cases["analyze-trace-files-warn"] = (FIX / "views" / "traces", lambda p: _cli(
        "analyze", *sorted(str(t) for t in p.glob("*.gz")), "--workers", "1", "--json", "--fail-on", "warning"), False)
    logs = sorted(p for p in (FIX / "logs").rglob("*") if p.is_file() and p.suffix in (".log", ".json", ".pkl")
                  and "scripts" not in p.parts and "skip_logdir" not in p.parts)
    for p in logs:
        name = f"logs-{p.relative_to(FIX / 'logs').as_posix().replace('/', '-')}"
        cases[name] = (p, lambda q: _cli("logs", str(q), "--json"), False)
        DISCOVERED.add(name)
    cases["logs-skip_logdir"] = (FIX / "logs" / "skip_logdir", lambda q: _cli("logs", str(q), "--json"), False)
    cases["logs-fr-pair"] = (FIX / "logs", lambda q: _cli("logs", str(q / "fr_rank0.json"), str(q / "fr_rank1.json"),
                                                          str(q / "raise.log"), "--json"), False)
    nccl = sorted(p for p in (FIX / "nccl").rglob("*") if p.is_file() and p.suffix in (".log", ".xml"))
    for p in nccl:
        name = f"topo-{p.relative_to(FIX / 'nccl').as_posix().replace('/', '-')}"
        cases[name] = (p, lambda q: _cli("topo", str(q), "--json"), False)
        DISCOVERED.add(name)
    cases["topo-log-and-xml"] = (FIX / "nccl", lambda q: _cli("topo", str(q / "torchrun_2node_ib_gdr.log"),
                                                              "--topo-xml", str(q / "topo_numa_mismatch_gdr_off.xml"),
                                                              "--json"), False)
    cases["topo-run-dir"] = (RUN_DIRS["sample"], lambda q: _cli("topo", str(q), "--json"), False)
    for name in ("sample", "mlp", "healthy1", "healthy4"):
        cases[f"profile-{name}"] = (RUN_DIRS[name], _profile, True)
    cases["profile-one-step"] = (RUNS / "profile_one_step", _profile, True)
    cases["profile-nccl-debug"] = (RUNS / "profile_nccl_debug", _profile, True)
    cases["run-debug-shape"] = (RUNS / "run_debug_shape", _run, True)
    for name in ("run_hang", "run_raise"):
        cases[f"run-{name[4:]}"] = (RUNS / name, _run, True)
        cases[f"status-{name[4:]}"] = (RUNS / name, lambda q: _cli("status", str(q), "--json"), True)
    cases["run-sample"] = (RUN_DIRS["sample"], _run, True)
    cases["check-sync-ok"] = (RUNS / "sync_ok", _check_sync, True)
    cases["check-sync-set-epoch"] = (RUNS / "sync_set_epoch", _check_sync, True)
    cases["capture-profile"] = (RUN_DIRS["mlp"], _capture_profile, True)
    cases["capture-check-sync"] = (RUNS / "sync_ok", _capture_sync, True)
    cases["preflight"] = (RUNS / "preflight", _preflight, True)
    # diff: two recorded runs of the same world size (paths under the repository, so <IN> in any checkout)
    cases["diff-sample-mlp"] = (REPO, lambda q: _cli("diff", str(q / "sample_traces" / "mlp_gloo_2rank"),
                                                     str(q / "tests" / "fixtures" / "analyze" / "gloo_2rank_mlp"),
                                                     "--json"), False)
    return cases


CASES = _cases()


def normalise(value: Any, subst: list[tuple[str, str]]) -> Any:
    """The document with what differs between two runs of the same input replaced (see the module docstring)."""
    if isinstance(value, dict):
        # Keys too: a log's path can be a key (the places a finding was seen in).
        return {normalise(k, subst): (None if k == "age_s" else normalise(v, subst)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, subst) for v in value]
    if isinstance(value, str):
        for old, new in subst:
            value = value.replace(old, new)
        return value
    return value


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_is_unchanged(case: str, tmp_path: Path) -> None:
    src, produce, copy = CASES[case]
    if not src.exists():
        pytest.skip(f"{src} is not in this checkout")
    path = _copy(src, tmp_path) if copy else src
    code, doc = produce(path)
    doc = json.loads(json.dumps(doc, default=str))  # as the commands print it (rank keys become strings)
    assert doc.get("tool", "ddpdoctor") == "ddpdoctor"
    if "version" in doc and "schema_version" in doc:
        doc["version"] = "<VERSION>"
    # The input first: a private copy lies inside tmp_path. Paths recorded inside the fixtures stay as recorded.
    subst = [(str(path), "<IN>"), (str(tmp_path), "<TMP>")]
    got = {"exit_code": code, "json": normalise(doc, subst)}
    golden = GOLDEN / f"{case}.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    if not golden.exists() and case in DISCOVERED:
        pytest.skip(f"{src.name} was added after the goldens were recorded: DDPDOCTOR_UPDATE_GOLDEN=1 records it")
    assert golden.exists(), f"no golden for {case}: record it with DDPDOCTOR_UPDATE_GOLDEN=1"
    want = json.loads(golden.read_text())
    assert got["exit_code"] == want["exit_code"]
    # Keys in the same order matter to nobody, values do: compare as data, with a readable first difference.
    assert got["json"] == want["json"], _first_difference(want["json"], got["json"])


def test_every_golden_has_its_case() -> None:
    """A golden whose input was renamed or removed would otherwise guard nothing, silently."""
    assert sorted(p.stem for p in GOLDEN.glob("*.json") if p.stem not in CASES) == []


def _first_difference(want: Any, got: Any, where: str = "$") -> str:
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got:
                return f"{where}.{k}: missing now (was {json.dumps(want[k])[:300]})"
            if k not in want:
                return f"{where}.{k}: new key ({json.dumps(got[k])[:300]})"
            if want[k] != got[k]:
                return _first_difference(want[k], got[k], f"{where}.{k}")
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} items before, {len(got)} now"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where}: was {json.dumps(want)[:300]}, now {json.dumps(got)[:300]}"
