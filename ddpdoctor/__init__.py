"""ddpdoctor: profiling and diagnostics for PyTorch DistributedDataParallel jobs.

In-script API: ``step()`` and ``iteration()`` mark training iterations and are no-ops when the script does
not run under ddpdoctor, so a script that calls them still runs under plain torchrun. ``check_sync()`` runs a
script under ``ddpdoctor check-sync`` from a test suite.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "check_sync", "iteration", "step"]


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): the in-script API needs torch, the CLI's analysis commands must not pay for importing it.
    if name in ("iteration", "step"):
        from ddpdoctor.probes import api

        return getattr(api, name)
    if name == "check_sync":
        from ddpdoctor.sync_api import check_sync

        return check_sync
    raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
