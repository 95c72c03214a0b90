"""Runs a benchmark job as torch's own tools ask a user to set a job up, for the peer runs (plain torchrun):

- torchrun's failure report: the entry point is wrapped in ``torch.distributed.elastic.multiprocessing.errors.record``
  (torchrun's docs: without it a worker's exception does not reach the error file nor the "Root Cause" table);
- the Flight Recorder: recording is on through the environment (``TORCH_FR_BUFFER_SIZE``, set by the runner), and
  a rank's buffer is written to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (the analyzer's file layout) when the rank fails
  (an exception: a gloo timeout included) or is told to stop (torchrun's SIGTERM to the survivors of a failure).
  On NCCL the watchdog dumps on a timeout by itself; gloo has no watchdog, so this is the nearest faithful
  configuration (the "on demand" dump of the Flight Recorder's tutorial, at the moments NCCL would dump).

Usage: python peer_entry.py JOB.py [ARGS...] (torchrun runs this file)."""

import os
import runpy
import signal
import sys

import torch
from torch.distributed.elastic.multiprocessing.errors import record

_dumped: list[bool] = []


def dump_flight_recorder() -> None:
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix or _dumped:
        return
    _dumped.append(True)
    try:
        data = torch._C._distributed_c10d._dump_fr_trace()  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - recorded, not raised: the dump is best effort, as on NCCL
        print(f"flight recorder dump failed: {e}", file=sys.stderr, flush=True)
        return
    path = f"{prefix}{os.environ.get('RANK', '0')}"
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _on_term(signum, frame):  # noqa: ARG001
    dump_flight_recorder()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@record
def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    signal.signal(signal.SIGTERM, _on_term)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        dump_flight_recorder()
        raise


if __name__ == "__main__":
    main()
