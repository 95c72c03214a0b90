"""torchrun's flags as click options of every launching command (launch/flags.py reads them from torch's parser)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ddpdoctor.launch.flags import NOT_PASSED, torchrun_flags


def torchrun_options(fn: Callable[..., Any], *, script: bool = True) -> Callable[..., Any]:
    """Decorate a click command with every torchrun flag (dashed and underscore spellings); a flag whose name or
    short form ddpdoctor already uses for itself is left out, so ddpdoctor's own flags keep their meaning.
    ``script=False``: the command runs its own worker, so the flags about how to run a script are left out."""
    taken = {opt for p in getattr(fn, "__click_params__", []) for opt in getattr(p, "opts", [])}
    for flag in reversed(torchrun_flags()):
        if not script and flag.name in NOT_PASSED:
            continue
        underscored = "--" + flag.name[2:].replace("-", "_")
        decls = [flag.name] + ([underscored] if flag.underscored and underscored != flag.name else [])
        if flag.short:
            decls.insert(0, flag.short)
        decls = [d for d in decls if d not in taken]
        if flag.name not in decls:
            continue
        decls.append(flag.dest)
        if flag.takes_value:
            fn = click.option(*decls, default=None, help=flag.help, show_default=False)(fn)
        else:
            fn = click.option(*decls, is_flag=True, default=False, help=flag.help)(fn)
    return fn


def torchrun_options_without_script(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torchrun_options(fn, script=False)
