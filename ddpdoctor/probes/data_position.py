"""Where this rank's training DataLoader stands, for the per-step fingerprint (probes/divergence.py) and the hang
verdict (findings/hang.py): the epoch it reads, the batches it consumed and has left, and whether it ran dry
(StopIteration) since the last record. Seen through ``_BaseDataLoaderIter.__next__``, no user code changed.

The training loader is the one whose batch fed the step being recorded (the last to yield before the optimizer
step): an evaluation loader that rank 0 alone runs dry between two steps is not it. A pass (one ``iter()``) counts
as an epoch only once it fed a step, so a ``next(iter(loader))`` peek on one rank changes nothing. Loaders are told
apart by their index sampler (the same object for every pass of one loader; kept by id, at most MAX_LOADERS).

The dry event (``dry_event``): a rank whose training loader ran dry and that draws no batch from it for DRY_SETTLE_S
tells the job at once (the heartbeat sends ``["dry", step, time]`` among its "fp" records, job/divergence.py), so a
rank that leaves its loop on a shorter shard is named while the others wait for it, not after the hang timeout. A
loader started again at once (the next epoch) sends nothing; a loader that runs dry inside ``Join`` (a last uneven
batch, handled by design) never does."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

MAX_LOADERS = 64
DRY_SETTLE_S = 0.25  # a loader started again within this (the next epoch) sends no dry event


class DataPosition:
    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.dry = 0  # the training loader raised StopIteration since the last record
        # Completed steps when the training loader ran dry; None again once it yields a batch. The hang verdict
        # reads it (heartbeat "data_dry"): positive evidence that a rank left its loop because its data ended.
        self.dry_step: int | None = None
        self._train: int | None = None  # the training loader's key
        self._last: int | None = None  # the key of the loader that yielded last
        self._last_it: Any = None  # weakref to that iterator (a strong one could keep its workers alive)
        self._passes: dict[int, int] = {}  # key -> passes started (iter() that yielded a batch)
        self._fed: dict[int, tuple[int, int]] = {}  # key -> (pass that last fed a step, epochs that fed steps)
        self._saved: Any = None
        self._join_saved: Any = None
        self._joins = 0  # Join contexts the main thread is inside
        self._dry_at = 0.0  # time.time() of the training loader's StopIteration
        self._dry_joined = False  # it ran dry inside Join: uneven inputs handled by design
        self._dry_sent: int | None = None  # the dry step whose event was sent
        self._on = True
        self._main = threading.main_thread().ident

    def install(self) -> None:
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter
        except ImportError:
            return
        orig = _BaseDataLoaderIter.__next__
        pos = self

        def __next__(it: Any) -> Any:
            if not pos._on or threading.get_ident() != pos._main:
                return orig(it)
            try:
                out = orig(it)
            except StopIteration:
                pos._ran_dry(it)
                raise
            pos._yielded(it)
            return out

        self._saved = (orig, __next__)
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign,assignment]
        self._install_join()

    def _install_join(self) -> None:
        """Counts the Join contexts the main thread is in (``__enter__``/``__exit__`` wrapped, behaviour kept)."""
        try:
            from torch.distributed.algorithms.join import Join
        except ImportError:
            return
        enter, exit_ = Join.__enter__, Join.__exit__
        pos = self

        def __enter__(join: Any) -> Any:
            if threading.get_ident() == pos._main:
                pos._joins += 1
            return enter(join)

        def __exit__(join: Any, *exc: Any) -> Any:
            try:
                return exit_(join, *exc)
            finally:
                if threading.get_ident() == pos._main:
                    pos._joins = max(0, pos._joins - 1)

        self._join_saved = (enter, exit_, __enter__, __exit__)
        Join.__enter__, Join.__exit__ = __enter__, __exit__  # type: ignore[method-assign]

    def uninstall(self) -> None:
        self._on = False
        if self._saved is None:
            return
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        orig, mine = self._saved
        if _BaseDataLoaderIter.__next__ is mine:  # another probe wrapped it since: left in place, switched off
            _BaseDataLoaderIter.__next__ = orig  # type: ignore[method-assign]
        self._saved = None
        if self._join_saved is not None:
            from torch.distributed.algorithms.join import Join

            enter, exit_, my_enter, my_exit = self._join_saved
            if Join.__enter__ is my_enter and Join.__exit__ is my_exit:
                Join.__enter__, Join.__exit__ = enter, exit_  # type: ignore[method-assign]
            self._join_saved = None

    @staticmethod
    def _key(it: Any) -> int:
        return id(getattr(it, "_index_sampler", it))

    def _yielded(self, it: Any) -> None:
        key = self._key(it)
        if getattr(it, "_num_yielded", 0) == 1:  # the first batch of a pass
            if key not in self._passes and len(self._passes) >= MAX_LOADERS:
                self._passes.clear()
                self._fed.clear()
            self._passes[key] = self._passes.get(key, 0) + 1
        if key != self._last or self._last_it is None or self._last_it() is not it:
            self._last = key
            self._last_it = weakref.ref(it)
        if key == self._train:
            self.dry_step = None

    def _ran_dry(self, it: Any) -> None:
        if self._key(it) == self._train:
            self.dry = 1
            self.dry_step = self.tracker.step
            self._dry_at = time.time()
            self._dry_joined = self._joins > 0

    def dry_event(self, now: float | None = None, force: bool = False) -> list[int | str] | None:
        """The heartbeat thread: ``["dry", step, ms]`` once per dry step, when the training loader ran dry after
        ``step`` completed steps (at ``ms``, epoch milliseconds) and no batch was drawn from it for DRY_SETTLE_S
        (``force``: the rank is ending, no wait); None otherwise, and always inside ``Join``."""
        step, at = self.dry_step, self._dry_at
        if step is None or self._dry_joined or step == self._dry_sent:
            return None
        if not force and (time.time() if now is None else now) - at < DRY_SETTLE_S:
            return None
        self._dry_sent = step
        return ["dry", step, int(at * 1000)]

    def take(self) -> tuple[int, int, int, int]:
        """(epoch, dry, batches, left) at a step's record: the epoch (0-based) and batches consumed in it of the
        loader that fed this step, whether the training loader ran dry since the last record, the batches it has
        left (-1: no length, or no DataLoader at all: then epoch and batches are -1 too)."""
        dry, self.dry = self.dry, 0
        key = self._last
        it = self._last_it() if self._last_it is not None else None
        if key is None or it is None:
            return -1, dry, -1, -1
        self._train = key
        passes = self._passes.get(key, 0)
        fed_pass, epochs = self._fed.get(key, (-1, 0))
        if passes != fed_pass:
            epochs += 1
            self._fed[key] = (passes, epochs)
        batches = int(getattr(it, "_num_yielded", -1))
        try:
            left = max(-1, len(it) - batches)
        except Exception:  # noqa: BLE001 - an iterable dataset without a length
            left = -1
        return epochs - 1, dry, batches, left
