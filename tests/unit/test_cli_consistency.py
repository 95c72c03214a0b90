"""One CLI: every command has the same --fail-on, an example in --help, and only the flags it acts on; the
public Python API is visible to dir()/help() and typed."""

from __future__ import annotations

import inspect
from pathlib import Path

import click
from click.testing import CliRunner

import ddpdoctor
from ddpdoctor.cli import COMMANDS, main


def _command(name: str) -> click.Command:
    cmd = main.get_command(click.Context(main), name)
    assert cmd is not None
    return cmd


def test_every_command_has_the_same_fail_on():
    for name in COMMANDS:
        opt = next(p for p in _command(name).params if p.name == "fail_on")
        assert isinstance(opt.type, click.Choice)
        assert list(opt.type.choices) == ["error", "warning", "none"] and opt.default == "error", name


def test_every_help_has_an_example():
    runner = CliRunner()
    for args in [[]] + [[name] for name in COMMANDS]:
        res = runner.invoke(main, [*args, "--help"])
        assert res.exit_code == 0, (args, res.output)
        assert "Examples:\n  " in res.output and "ddpdoctor " in res.output.split("Examples:")[1], args


def test_preflight_flags_match_what_it_does(tmp_path):
    res = CliRunner().invoke(main, ["preflight", "--help"])
    assert "--overwrite" in res.output
    for script_flag in ("--module", "--no-python", "--run-path"):
        assert script_flag not in res.output
    # It says "pass --overwrite" for a used run directory: the flag it names is accepted.
    params = _command("preflight").make_context("preflight", ["--overwrite", "--out", str(tmp_path)]).params
    assert params["overwrite"] is True


def test_analyze_never_writes_into_a_run_dir(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "analyze" / "gloo_2rank_mlp", run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    res = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    assert res.exit_code in (0, 1), res.output
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    doc = (Path(__file__).resolve().parents[2] / "docs" / "views.md").read_text()
    assert "never writes into a run directory" in doc


def test_public_api_is_visible_and_typed():
    for name in ("check_sync", "step", "iteration", "Report"):
        assert name in dir(ddpdoctor)
    sig = inspect.signature(ddpdoctor.check_sync)
    assert sig.parameters["nproc_per_node"].annotation in (int, "int")
    assert (Path(ddpdoctor.__file__).parent / "py.typed").exists()
