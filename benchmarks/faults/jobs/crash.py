"""Crashes (FAULT=...): one rank (FAULT_RANK) at step FAULT_STEP
    signal-NAME           dies of signal NAME (SEGV is a real invalid read, FPE a real one where Python allows, the
                          others sent to itself)
    exception             raises ValueError; its peers then fail with "connection closed by peer"
    exception-timeout     raises ValueError but its process lingers (an exit handler that flushes slowly) while the
                          others time out in the collective (SCENARIO_GLOO_TIMEOUT): the culprit is the rank that
                          raised, not the ones that timed out
    oom                   the host's OOM killer kills it: it puts itself in a memory cgroup of 256 MiB
                          (/sys/fs/cgroup/memory, root only) and allocates past it. Where no cgroup can be made it
                          prints why and exits 3 (the runner marks the scenario not run)"""

import atexit
import ctypes
import os
import signal
import time

import torch
from _bench import FAULT, FAULT_STEP, STEPS, is_fault_rank, mark, setup, train_step

rank, world, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
me = is_fault_rank(rank)
CGROUP = "/sys/fs/cgroup/memory"


def oom_cgroup():
    """A memory cgroup of 256 MiB holding this process (cgroup v1), or None."""
    path = os.path.join(CGROUP, f"ddpbench_oom_{os.getpid()}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(256 << 20))
        swap = os.path.join(path, "memory.memsw.limit_in_bytes")
        if os.path.exists(swap):
            with open(swap, "w") as f:
                f.write(str(256 << 20))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return path
    except OSError as e:
        print(f"oom scenario: no memory cgroup ({e})", flush=True)
        return None


if me and FAULT == "oom" and not os.access(CGROUP, os.W_OK):
    print("oom scenario: /sys/fs/cgroup/memory is not writable", flush=True)
    os._exit(3)

for step in range(STEPS):
    if me and step == FAULT_STEP:
        if FAULT.startswith("signal-"):
            name = FAULT.split("-", 1)[1]
            mark(FAULT)
            if name == "SEGV":
                ctypes.string_at(0)  # a real invalid read
            if name == "PIPE":
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python starts with SIGPIPE ignored
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
            time.sleep(5)  # a handled signal (INT raises KeyboardInterrupt at once)
        elif FAULT == "exception":
            mark(FAULT)
            raise ValueError("corrupt sample in shard 7")
        elif FAULT == "exception-timeout":
            atexit.register(time.sleep, float(os.environ.get("LINGER_S", "60")))
            mark(FAULT)
            raise ValueError("corrupt sample in shard 7")
        elif FAULT == "oom":
            if oom_cgroup() is None:
                os._exit(3)
            mark(FAULT)
            hog = []
            while True:  # touched pages: the cgroup's limit is reached and the kernel's OOM killer ends us
                hog.append(torch.ones(16 << 20, dtype=torch.uint8))
    train_step(model, opt)
import torch.distributed as dist  # noqa: E402

dist.destroy_process_group()
