"""DDP's gradient bucketing and all_reduce queue, replayed (pure): the bucket limits a cap gives, how DDP assigns
gradients in ready order to buckets, one simulated step on as many communication lanes as the run showed, and how
many lanes that was (docs/whatif.md; analyses/whatif.py runs it for every candidate cap)."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from ddpdoctor.analyses.results import Bucket

MIB = 1024 * 1024
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (1 MiB). DDP caps the first bucket (the last layers' gradients)
# at this size ONLY when bucket_cap_mb is left at its default; an explicit bucket_cap_mb caps every bucket,
# the first included (torch 2.13 nn/parallel/distributed.py, _BucketCapacityConfig.create; checked by running it).
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
DEFAULT_BUCKET_CAP_MB = 25.0


@dataclass(frozen=True)
class Grad:
    """One parameter's gradient became ready at ``t_us`` (``bytes`` of gradient)."""

    t_us: float
    bytes: int


@dataclass
class SimBucket:
    index: int
    bytes: int
    params: int
    ready_us: float  # its last gradient is ready
    start_us: float  # its all_reduce starts (when launched and a communication lane is free)
    end_us: float


@dataclass
class StepSim:
    """One simulated step of one rank."""

    buckets: list[SimBucket]
    backward_end_us: float
    exposed_us: float  # communication still running after backward ended: max(0, last end - backward end)
    comm_us: float


def bucket_limits(bucket_cap_mb: float | None) -> list[int]:
    """DDP's size limits for (first bucket, every later bucket). ``None`` means the default (25 MiB, first 1 MiB)."""
    if bucket_cap_mb is None:
        return [DEFAULT_FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * MIB)]
    cap = int(bucket_cap_mb * MIB)
    return [cap, cap]


def assign_buckets(sizes: Sequence[int], limits: Sequence[int]) -> list[list[int]]:
    """Indices of ``sizes`` (gradients in ready order) per bucket, as DDP's compute_bucket_assignment_by_size
    does after its rebuild: add a gradient, close the bucket once it holds >= its limit (so one gradient larger
    than the cap is a bucket of its own, and a bucket may overshoot by its last gradient). ``limits[k]`` is the
    k-th bucket's limit; the last one repeats."""
    if not limits:
        raise ValueError("limits must not be empty")
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0
    limit = limits[0]  # the current bucket's; looked up again only when a bucket closes
    for i, s in enumerate(sizes):
        cur.append(i)
        size += s
        if size >= limit:
            out.append(cur)
            cur, size = [], 0
            limit = limits[min(len(out), len(limits) - 1)]
    if cur:
        out.append(cur)
    return out


_READY = attrgetter("t_us")


@functools.lru_cache(maxsize=64)
def _layout(sizes: tuple[int, ...], limits: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(gradients, bytes, index of its last gradient) of each bucket assign_buckets makes: every step of a run has
    the same sizes in the same order, and a run of 200,000 steps asked it once per step and candidate cap.
    A bucket is a run of consecutive gradients in ready order: its bytes a slice's sum, ready at its last."""
    return [(len(idx), sum(sizes[idx[0]:idx[-1] + 1]), idx[-1]) for idx in assign_buckets(sizes, limits)]


def simulate_step(grads: Sequence[Grad], limits: Sequence[int], latency_us: float, bytes_per_us: float,
                  backward_end_us: float | None = None, lanes: int = 1) -> StepSim:
    """Bucket ``grads`` (sorted here by ready time), launch each bucket when its last gradient is ready and the
    previous bucket was launched (DDP launches in bucket order), and run each all_reduce on the first free of
    ``lanes`` communication lanes (1: one NCCL stream, a serial queue; gloo runs 2 worker threads):
    start = max(launched, earliest lane free), dur = latency + bytes / bytes_per_us."""
    ordered = sorted(grads, key=_READY)
    if not ordered:
        return StepSim([], backward_end_us or 0.0, 0.0, 0.0)
    bw_end = max(backward_end_us if backward_end_us is not None else ordered[-1].t_us, ordered[-1].t_us)
    buckets: list[SimBucket] = []
    launched = float("-inf")
    lane_free = [float("-inf")] * max(1, lanes)
    one_lane = len(lane_free) == 1
    for b, (params, nbytes, last) in enumerate(_layout(tuple([g.bytes for g in ordered]), tuple(limits))):
        ready = ordered[last].t_us
        launched = max(launched, ready)
        lane = 0 if one_lane else min(range(len(lane_free)), key=lane_free.__getitem__)
        start = max(launched, lane_free[lane])
        end = start + latency_us + nbytes / bytes_per_us
        buckets.append(SimBucket(b, nbytes, params, ready, start, end))
        lane_free[lane] = end
    comm = sum(b.end_us - b.start_us for b in buckets)
    return StepSim(buckets, bw_end, max(0.0, max(b.end_us for b in buckets) - bw_end), comm)


@dataclass
class StepOutcomes:
    """What the candidate caps are compared on, per step (in the order the steps were given)."""

    buckets: list[int]
    exposed_us: list[float]
    comm_us: list[float]
    first_start_us: list[float | None]  # the first bucket's start; None for a step without gradients


class StepBatch:
    """Many steps to simulate under several limits (analyses/whatif.py: every step, every candidate cap): each
    step's gradients sorted once, and the steps whose gradients have the same sizes in the same order (every step
    of a run, usually) simulated together, one bucket at a time across all of them with numpy. The same floats as
    simulate_step on each step: the same operations in the same order, and Python's max(a, b) (b only when larger)
    as a where(); 200,000 steps x 8 caps of simulate_step were a third of `analyze`."""

    def __init__(self, steps: Sequence[tuple[Sequence[Grad], float | None]]) -> None:
        self.n = len(steps)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        ordered_of: list[list[Grad]] = []
        for i, (grads, _) in enumerate(steps):
            ordered = sorted(grads, key=_READY)
            ordered_of.append(ordered)
            groups[tuple([g.bytes for g in ordered])].append(i)
        self.groups: list[tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray]] = []
        for sizes, idx in groups.items():
            times = np.array([[g.t_us for g in ordered_of[i]] for i in idx], dtype=np.float64).reshape(len(idx), -1)
            bw = []
            for i in idx:
                last_t = ordered_of[i][-1].t_us if ordered_of[i] else 0.0
                given = steps[i][1]
                if not ordered_of[i]:
                    bw.append(given or 0.0)
                    continue
                a = given if given is not None else last_t
                bw.append(last_t if last_t > a else a)  # max(a, last_t)
            self.groups.append((sizes, np.array(idx, dtype=np.int64), times, np.array(bw, dtype=np.float64)))

    def simulate(self, limits: Sequence[int], latency_us: float, bytes_per_us: float, lanes: int = 1) -> StepOutcomes:
        n_buckets = [0] * self.n
        exposed = [0.0] * self.n
        comm = [0.0] * self.n
        first: list[float | None] = [None] * self.n
        for sizes, idx, times, bw_end in self.groups:
            if not sizes:
                continue  # no gradients: no bucket, nothing exposed
            layout = _layout(sizes, tuple(limits))
            m = len(idx)
            launched = np.full(m, -np.inf)
            lane_free = np.full((m, max(1, lanes)), -np.inf)
            rows = np.arange(m)
            total = np.zeros(m)
            last_end = np.full(m, -np.inf)
            first_start = np.zeros(m)
            for b, (_, nbytes, last) in enumerate(layout):
                ready = times[:, last]
                launched = np.where(ready > launched, ready, launched)
                lane = np.argmin(lane_free, axis=1)  # the first free lane, as min(range(lanes), key=...)
                free = lane_free[rows, lane]
                start = np.where(free > launched, free, launched)
                end = start + latency_us + nbytes / bytes_per_us
                lane_free[rows, lane] = end
                total = total + (end - start)
                last_end = np.where(end > last_end, end, last_end) if b else end
                if b == 0:
                    first_start = start
            over = last_end - bw_end
            over = np.where(over > 0.0, over, 0.0)  # max(0.0, over)
            for k, i in enumerate(idx.tolist()):
                n_buckets[i] = len(layout)
                exposed[i] = float(over[k])
                comm[i] = float(total[k])
                first[i] = float(first_start[k])
        return StepOutcomes(n_buckets, exposed, comm, first)


def observed_lanes(buckets: Sequence[Bucket]) -> int:
    """How many all_reduces ran at once in this run: the most bucket intervals overlapping at one instant, per
    (rank, step), median over them (at least 1). Durations measured while sharing the link are per-lane rates, so
    the simulation must run as many at once as the run did."""
    by_step: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for b in buckets:
        by_step[(b.rank, b.step)].append((b.start_us, b.end_us))
    peaks = []
    for spans in by_step.values():
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end before a start at a tie
        running = peak = 0
        for _, delta in events:
            running += delta
            peak = max(peak, running)
        peaks.append(peak)
    return max(1, int(statistics.median(peaks))) if peaks else 1
