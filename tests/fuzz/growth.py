"""The fuzz suite's growth harness: does a parser or rule stay linear (or n log n) in its input? Measured on
deterministic counts, never on wall time, so a loaded machine cannot make it fail or pass.

What is counted: every Python line and call executed inside ddpdoctor while ``run(input)`` runs (a tracer limited
to ddpdoctor's own files, so the standard library and the test's own generator do not count). The same input gives
the same count on any machine. A parser may also expose counters of its own (events visited, rule evaluations):
``Work.add(n)`` from a test hook adds them to the count.

    work = count_work(run, make(n))                   # one figure
    assert_near_linear(make, run, n, label="...")     # run at n, 2n, 4n: each doubling may cost at most
                                                      # GROWTH_LIMIT times the work (2.0 linear, ~2.2 n log n, 4 n^2)

A budget stops a run that never ends (a loop that stops advancing) deterministically: past ``budget`` counted
lines, ``WorkBudgetExceeded`` is raised inside the parser, and the test fails instead of hanging.

Limits, said plainly: work inside one C call (a regular expression that backtracks, ``str.replace``) is one call
here, whatever it costs; such a parser needs an exposed counter or a look at its regexes (tests/fuzz/README.md).

Sizes: small by default (CI, seconds); ``DDPDOCTOR_FUZZ_SCALE=full`` runs the sizes of issue 26 (200,000 steps, a
108 KB line, 2M lines, 1,024 ranks), ``DDPDOCTOR_FUZZ_SCALE=<number>`` multiplies the small sizes."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = str(Path(__file__).resolve().parents[2] / "ddpdoctor") + os.sep
GROWTH_LIMIT = 2.6  # per doubling: n log n at these sizes is <= 2.25; quadratic is 4


def scale() -> float:
    """1.0 in CI; DDPDOCTOR_FUZZ_SCALE=full (the issue's sizes: callers pass them) or a factor."""
    raw = os.environ.get("DDPDOCTOR_FUZZ_SCALE", "")
    if raw == "full":
        return 0.0
    try:
        return max(float(raw), 0.01) if raw else 1.0
    except ValueError:
        return 1.0


def size(small: int, full: int) -> int:
    """``small`` in CI, ``full`` under DDPDOCTOR_FUZZ_SCALE=full, ``small * factor`` for a number."""
    s = scale()
    return full if s == 0.0 else max(1, int(small * s))


class WorkBudgetExceeded(BaseException):  # not an Exception: a parser's `except Exception` must not swallow it
    """Raised inside the code under test once it has run more than its budget of lines."""


@dataclass
class Work:
    lines: int = 0
    calls: int = 0
    exposed: int = 0  # counters the code under test reported through ``add``
    budget: int | None = None
    by_file: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.lines + self.calls + self.exposed

    def add(self, n: int = 1) -> None:
        self.exposed += n


_current: list[Work] = []


def add(n: int = 1) -> None:
    """A hook for parsers' own counters (events visited, rule evaluations); a no-op outside ``count_work``."""
    if _current:
        _current[-1].add(n)


def count_work(run: Callable[[Any], Any], arg: Any, budget: int | None = None) -> Work:
    """Run ``run(arg)`` and count the ddpdoctor lines and calls it executed (see the module's doc)."""
    work = Work(budget=budget)
    files: dict[str, bool] = {}
    by_file = work.by_file

    def ours(frame: FrameType) -> bool:
        name = frame.f_code.co_filename
        hit = files.get(name)
        if hit is None:
            hit = files[name] = name.startswith(PACKAGE)
        return hit

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "line":
            work.lines += 1
            if work.budget is not None and work.lines > work.budget:
                raise WorkBudgetExceeded(f"more than {work.budget:,} lines of ddpdoctor for one input")
        return local

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        if event != "call" or not ours(frame):
            return None
        work.calls += 1
        key = Path(frame.f_code.co_filename).name
        by_file[key] = by_file.get(key, 0) + 1
        return local

    _current.append(work)
    old = sys.gettrace()
    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        run(arg)
    finally:
        sys.settrace(old)
        threading.settrace(old)  # type: ignore[arg-type]
        _current.pop()
    return work


@dataclass(frozen=True)
class Growth:
    label: str
    sizes: tuple[int, ...]
    work: tuple[int, ...]

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(b / max(a, 1) for a, b in zip(self.work, self.work[1:], strict=False))

    def __str__(self) -> str:
        steps = ", ".join(f"{n:,}: {w:,}" for n, w in zip(self.sizes, self.work, strict=True))
        return f"{self.label}: work at size {steps}; per doubling x{', x'.join(f'{r:.2f}' for r in self.ratios)}"


def growth(make: Callable[[int], Any], run: Callable[[Any], Any], n: int, label: str = "",
           doublings: int = 2, budget_per_unit: int | None = None) -> Growth:
    """Work of ``run(make(m))`` for m = n, 2n, ... (``doublings`` times)."""
    sizes = tuple(n * 2**i for i in range(doublings + 1))
    work = []
    for m in sizes:
        arg = make(m)  # built outside the count: the generator is not the code under test
        budget = None if budget_per_unit is None else budget_per_unit * m + 1_000_000
        work.append(count_work(run, arg, budget).total)
    return Growth(label, sizes, tuple(work))


def assert_near_linear(make: Callable[[int], Any], run: Callable[[Any], Any], n: int, label: str = "",
                       doublings: int = 2, limit: float = GROWTH_LIMIT,
                       budget_per_unit: int | None = None) -> Growth:
    """Fail when any doubling of the input costs more than ``limit`` times the work (the figures in the message)."""
    g = growth(make, run, n, label, doublings, budget_per_unit)
    assert max(g.ratios) <= limit, f"grows faster than n log n: {g}"
    print(g)  # the figures, with -s (the report of issue 26 quotes them)
    return g
