"""ddpdoctor: profiling and diagnostics for PyTorch DistributedDataParallel jobs.

The names here are the whole in-script API; every one of them is a no-op when the script
does not run under ddpdoctor, so a script that calls them still runs under plain torchrun.
"""

from __future__ import annotations

from ddpdoctor.probes.api import iteration, step
from ddpdoctor.sync_api import check_sync

__version__ = "0.1.0"
__all__ = ["__version__", "check_sync", "iteration", "step"]
