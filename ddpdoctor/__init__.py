"""ddpdoctor: profiling and diagnostics for PyTorch DistributedDataParallel jobs.

In-script API: ``step()`` and ``iteration()`` mark training iterations and are no-ops when the script does
not run under ddpdoctor, so a script that calls them still runs under plain torchrun. ``check_sync()`` runs a
script under ``ddpdoctor check-sync`` from a test suite and returns its ``Report``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpdoctor.version import __version__

__all__ = ["Report", "__version__", "check_sync", "iteration", "step"]

if TYPE_CHECKING:  # the real signatures, for mypy, IDEs and pyright (the package ships py.typed)
    from ddpdoctor.probes.api import iteration, step
    from ddpdoctor.report import Report
    from ddpdoctor.sync_api import check_sync

_LAZY = {"iteration": "ddpdoctor.probes.api", "step": "ddpdoctor.probes.api", "check_sync": "ddpdoctor.sync_api",
         "Report": "ddpdoctor.report"}


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): the in-script API imports torch, and the CLI's analysis commands must not pay for that.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups (and help()) find the real object
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
