"""A job bent by environment variables: one rank pauses at one step (busy or stuck) or leaves early, while the
other waits for it in a collective; a marker file says when the job is under way (for tests that signal it).

PAUSE_RANK, PAUSE_STEP, PAUSE_KIND (checkpoint | eval | checkpoint+eval (eval 3 steps after the checkpoint) |
child | child-capture (the work done by a child process the rank waits for: subprocess.run, with its output
captured or not) | sleep | spin-sleep (asleep forever while another of its threads keeps burning CPU and doing I/O, as gloo's I/O
threads, NCCL's watchdog or a data-loader thread do) | lock | read | exit0 | return), PAUSE_S, STEPS, STEP_SLEEP, MARK_FILE (written by rank 0 at step 3), PAUSED_FILE (written by the pausing rank
as it pauses)."""

import os
import threading
import time

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
env = os.environ
pause_rank, pause_step = int(env.get("PAUSE_RANK", "-1")), int(env.get("PAUSE_STEP", "5"))
kind, pause_s = env.get("PAUSE_KIND", ""), float(env.get("PAUSE_S", "0"))
steps, step_sleep = int(env.get("STEPS", "10")), float(env.get("STEP_SLEEP", "0"))


def checkpoint(seconds):
    """Write a checkpoint slowly: CPU and I/O keep moving the whole time."""
    path = os.path.join(env.get("CKPT_DIR", "/tmp"), f"ckpt-{os.getpid()}.pt")
    end = time.time() + seconds
    while time.time() < end:
        torch.save({"w": torch.randn(256, 256)}, path)
        time.sleep(0.05)
    os.unlink(path)


def evaluate(seconds):
    """A long evaluation: pure compute, no collective."""
    end = time.time() + seconds
    a = torch.randn(128, 128)
    while time.time() < end:
        a = torch.tanh(a @ a)


def spin():
    """Another thread of the rank, never idle: CPU and I/O of the process keep moving."""
    r, w = os.pipe()
    while True:
        os.write(w, b"x" * 512)
        os.read(r, 512)
        sum(range(2000))


CHILD = ("import time, torch\nend = time.time() + float({s})\na = torch.randn(128, 128)\n"
         "while time.time() < end:\n    a = torch.tanh(a @ a)\n")


def pause(kind):
    if kind in ("child", "child-capture"):
        import subprocess
        import sys

        # An evaluation or uploader in a subprocess: the training thread sits in waitpid (or poll on its pipes).
        subprocess.run([sys.executable, "-c", CHILD.format(s=pause_s)], check=True,
                       capture_output=kind == "child-capture")
    elif kind == "checkpoint":
        checkpoint(pause_s)
    elif kind == "eval":
        evaluate(pause_s)
    elif kind == "sleep":
        time.sleep(3600)  # BUG: stuck
    elif kind == "spin-sleep":
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(3600)  # BUG: stuck, while the spinning thread keeps the process busy
    elif kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # BUG: a lock it already holds
    elif kind == "read":
        r, _ = os.pipe()
        os.read(r, 1)  # BUG: a read that never returns


for step in range(steps):
    if rank == 0 and step == 3 and env.get("MARK_FILE"):
        open(env["MARK_FILE"], "w").close()
    if rank == pause_rank and step == pause_step:
        if kind == "exit0":
            raise SystemExit(0)  # BUG: leaves early, cleanly, while the other rank waits for it
        if kind == "return":
            break  # BUG: leaves the loop early; the script then ends normally
        if env.get("PAUSED_FILE"):
            open(env["PAUSED_FILE"], "w").close()  # for tests that act once it pauses
        pause(kind.split("+")[0])
    if rank == pause_rank and step == pause_step + 3 and "+" in kind:
        pause(kind.split("+")[1])
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()  # the rank that did not pause waits here for the one that did
    opt.step()
    time.sleep(step_sleep)
if kind != "return" or rank != pause_rank:
    dist.barrier()
    dist.destroy_process_group()
