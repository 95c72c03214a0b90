"""Whether a script starts its own ranks (torch.multiprocessing.spawn / start_processes, as pytorch/examples'
multigpu.py does): read from its source, before anything is launched."""

from __future__ import annotations

import ast
from pathlib import Path

_MP_MODULES = ("torch.multiprocessing", "torch.multiprocessing.spawn")
_STARTERS = ("spawn", "start_processes")
_MAX_SOURCE = 4 << 20  # a script larger than this is not read (no ranks are guessed from it)


def spawn_call(path: Path) -> tuple[int, str] | None:
    """(line, 'mp.spawn') of the first call that starts processes through torch.multiprocessing, else None."""
    try:
        if path.stat().st_size > _MAX_SOURCE:
            return None
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None
    modules: set[str] = set()  # names bound to torch.multiprocessing ("mp", "torch.multiprocessing")
    functions: set[str] = set()  # names bound to spawn / start_processes themselves
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in _MP_MODULES:
                    modules.add(a.asname or a.name)
                elif a.name == "torch":
                    modules.add(f"{a.asname or 'torch'}.multiprocessing")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if node.module == "torch" and a.name == "multiprocessing":
                    modules.add(a.asname or a.name)
                elif node.module in _MP_MODULES and a.name in _STARTERS:
                    functions.add(a.asname or a.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in functions:
            return node.lineno, f.id
        if isinstance(f, ast.Attribute) and f.attr in _STARTERS:
            owner = ast.unparse(f.value)
            if owner in modules:
                return node.lineno, f"{owner}.{f.attr}"
    return None


def spawn_problem(path: Path) -> str | None:
    """One line saying what happens to a script that starts its own ranks, and how to run it instead."""
    found = spawn_call(path)
    if found is None:
        return None
    line, call = found
    return (f"line {line} starts the ranks itself ({call}): ddpdoctor starts the ranks, so each would start a job of "
            "its own that ddpdoctor never sees; run the script's torchrun form instead (each rank reads RANK, "
            "LOCAL_RANK and WORLD_SIZE from the environment and calls init_process_group() without rank or "
            "world_size, as pytorch/examples' multigpu_torchrun.py does)")
