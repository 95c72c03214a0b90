"""Every flag of the installed torch's torchrun passes through ddpdoctor's launching commands (both spellings),
and ddpdoctor's own flags keep their meaning."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from ddpdoctor.commands._common import pop_launch_spec
from ddpdoctor.launch.flags import flags_from_parser, torchrun_argv, torchrun_flags

run_mod = pytest.importorskip("torch.distributed.run")


def _parse(command: Any, argv: list[str]) -> dict[str, Any]:
    ctx = command.make_context("ddpdoctor", list(argv))
    return dict(ctx.params)


def _value_for(action: argparse.Action) -> str:
    return str(list(action.choices)[0]) if action.choices else "1"


def _actions() -> list[argparse.Action]:
    return [a for a in run_mod.get_args_parser()._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_flags_come_from_the_installed_parser():
    names = {f.name for f in torchrun_flags()}
    for action in _actions():
        assert "--" + action.option_strings[-1].lstrip("-").replace("_", "-") in names or any(
            s.replace("_", "-") in names for s in action.option_strings), action.option_strings
    # the four that a hand-written list missed in torch 2.13
    for name in ("--logs-specs", "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--virtual-local-rank"):
        if any(name in a.option_strings for a in _actions()):
            assert name in names


@pytest.mark.parametrize("underscore", [False, True])
def test_every_torchrun_flag_passes_through_profile(underscore):
    from ddpdoctor.commands.profile import command

    for action in _actions():
        spellings = [s for s in action.option_strings if s.startswith("--")]
        spelling = next((s for s in spellings if "_" in s), spellings[0]) if underscore else spellings[0]
        dashed = "--" + spellings[0][2:].replace("_", "-")
        argv = [spelling] + ([_value_for(action)] if action.nargs != 0 else []) + ["train.py", "--lr", "3"]
        params = _parse(command, argv)
        spec = pop_launch_spec("profile", params, as_json=False)
        assert spec.script == "train.py" and spec.script_args == ["--lr", "3"], (argv, spec.script)
        assert dashed in spec.torchrun, (argv, spec.torchrun)
        if dashed not in ("--module", "--run-path", "--no-python"):
            rendered = torchrun_argv(spec.torchrun)
            assert dashed in rendered, rendered
            # torchrun's own parser accepts what we pass on, with the same value
            ns = run_mod.get_args_parser().parse_args([*rendered, "train.py"])
            assert getattr(ns, action.dest) not in (None, False, [], ""), (dashed, ns)


def test_own_flags_stay_apart():
    from ddpdoctor.commands.profile import command

    params = _parse(command, ["--nproc-per-node", "2", "-v", "--json", "train.py", "-v", "--out", "x"])
    assert params["verbose"] and params["as_json"]
    spec = pop_launch_spec("profile", params, as_json=True)
    assert spec.torchrun == {"--nproc-per-node": "2"} and spec.script_args == ["-v", "--out", "x"]


def test_a_torchrun_flag_named_like_an_own_flag_is_left_out():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nnodes_x", type=str)
    flags = flags_from_parser(parser)
    assert [f.name for f in flags] == ["--json", "--nnodes-x"] and flags[1].takes_value and not flags[0].takes_value


def test_flags_are_cached_by_the_installed_torchrun(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("DDPDOCTOR_NO_CACHE", raising=False)
    parsed = torchrun_flags.__wrapped__()
    cache = tmp_path / "ddpdoctor" / "torchrun-flags.json"
    data = json.loads(cache.read_text())
    import importlib.metadata

    assert data["key"].startswith(importlib.metadata.version("torch") + "|")
    assert torchrun_flags.__wrapped__() == parsed  # read back from the cache
    data["flags"] = data["flags"][:1]
    data["key"] = "another torch"
    cache.write_text(json.dumps(data))
    assert torchrun_flags.__wrapped__() == parsed  # a stale key is parsed again
