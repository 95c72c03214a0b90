"""The one collective source inside a rank: what the training thread waits in, and which collectives the rank's
process groups have enqueued and completed, whoever issued them (docs/hangs.md#the-collective-source).

Two layers, each the lowest one that is cheap on the pinned torch (2.13):

- **Identity** (group, op, sequence number, sizes, dtypes, enqueue time): torch's Flight Recorder, which every
  backend records into at enqueue, below every caller (the public ``torch.distributed`` functions, DDP's reducer
  and its buffer broadcast through ``dist._broadcast_coalesced`` in C++, FSDP2's ``all_gather_into_tensor`` /
  ``all_gather_single``, functional collectives and DTensor redistributions, ``_coalescing_manager``). Its
  ``pg_status`` (per group: last enqueued, last completed sequence number) costs ~4 us to read
  (``_dump_fr_trace_json(includeCollectives=False)``), so the heartbeat thread reads it at a beat while the training
  thread waits; the entries (a whole ring, ~40 us an entry here) only when a wait has lasted NAME_AFTER_S, and at
  verdict time.
- **Blocking** (the training thread is inside a collective): no hook below Python exists on gloo
  (``_register_on_completion_hook`` is NCCL-only, ``Work._get_duration`` raises), so three class/module attributes
  that every Python-level wait passes through are wrapped: ``Work.wait`` (the pybind method: the public
  functions' own ``work.wait()``, FSDP2's, a user's ``async_op`` wait, ``_coalescing_manager``'s),
  ``torch.distributed._broadcast_coalesced`` (DDP's buffer and parameter broadcast, which waits in C++) and
  ``_functional_collectives.wait_tensor`` (functional collectives, DTensor). DDP's gradient all-reduce waits in
  C++ inside ``backward()``: probes/ledger.py's autograd final callback and the heartbeat's backward wrapper see it.
  Each wrapper costs a thread-id compare and two clock reads; it counts the wait on the StepTracker's phase clock
  as "collective" (the ledger's blocked time) and tells the heartbeat what kind of wait it is.

A rank is **in a collective** when its training thread is in one of those waits, or when a collective is enqueued
and not completed on one of its groups while its training thread sits in torch's distributed code (the verdict reads
that from the stack). A per-step fingerprint reads the same two layers: ``fr_status`` at a
step's end says how far each group's sequence number moved, the entries carry op, sizes and dtypes per number."""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from typing import Any, TypedDict, cast

import torch
import torch.distributed as dist

from ddpdoctor.probes.records import CollectiveState
from ddpdoctor.rundir.records import WAIT_OPS

# A wait is named from the ring's entries once it has lasted this long: a read of a full ring (2,000 entries) costs
# ~0.1 s holding the GIL here (benchmarks/collective_source_cost.py), which a slow but healthy collective must not
# pay; a hang's verdict names it from the rank's dump in any case.
NAME_AFTER_S = 10.0


class GroupStatus(TypedDict):
    """One group's counters in the Flight Recorder: the last sequence number enqueued and completed."""

    enqueued: int
    completed: int


class FrEntry(TypedDict, total=False):
    """The fields of a Flight Recorder entry this source reads (torch's JSON dump, version 2.10 on torch 2.13)."""

    process_group: list[str]  # [name, description]
    collective_seq_id: int
    profiling_name: str  # "gloo:all_reduce"
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    is_p2p: bool
    retired: bool


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def fr_status() -> dict[str, GroupStatus]:
    """Per group name: the Flight Recorder's last enqueued and completed collective (cheap: no entries). {} when the
    build has no generic recorder or no group exists."""
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=False)  # type: ignore[attr-defined]
        status = json.loads(raw).get("pg_status") or {}
    except Exception:  # noqa: BLE001 - no recorder in this build, or no group yet
        return {}
    return {str(g): {"enqueued": _int(s.get("last_enqueued_collective")),
                     "completed": _int(s.get("last_completed_collective"))}
            for g, s in status.items() if isinstance(s, dict)}


def fr_entries() -> list[FrEntry]:
    """Every entry the Flight Recorder holds (the whole ring: costly, read only when needed)."""
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace_json()  # type: ignore[attr-defined]
        entries = json.loads(raw).get("entries") or []
    except Exception:  # noqa: BLE001
        return []
    return [cast(FrEntry, e) for e in entries if isinstance(e, dict)]  # torch's JSON, passed through as read


def op_name(profiling_name: Any) -> str:
    """``gloo:all_reduce`` -> ``all_reduce`` (the backend prefix says nothing the group does not)."""
    name = str(profiling_name or "?")
    return name.split(":", 1)[1] if ":" in name else name


def default_group_name() -> str | None:
    try:
        return str(dist.distributed_c10d._get_default_group().group_name)
    except Exception:  # noqa: BLE001 - no default group (yet)
        return None


def group_label(name: str, default: str | None = None) -> str:
    """The group as the heartbeat's wrappers name it (heartbeat_lines.group_info): ``default_pg`` for the default
    group, else its name, so that every source's records of one group compare equal."""
    return "default_pg" if name == (default if default is not None else default_group_name()) else name


def pending(status: dict[str, GroupStatus]) -> dict[str, int]:
    """group -> the first sequence number enqueued and not completed, for groups with one."""
    return {g: s["completed"] + 1 for g, s in status.items() if s["enqueued"] > s["completed"] >= -1}


# FSDP2's per-unit collectives run inside a method of the unit's FSDPParamGroup (torch 2.6+ path; 2.4-2.5 the
# composable one): its frame on the training thread's stack names the unit and its mesh dim.
_FSDP_GROUP_FILE = "_fsdp_param_group.py"
_FSDP_STEPS = {"pre_forward": "forward all-gather", "unshard": "all-gather", "wait_for_unshard": "all-gather",
               "pre_backward": "backward all-gather", "post_backward": "reduce-scatter",
               "finalize_backward": "reduce-scatter", "_wait_for_post_backward": "reduce-scatter"}


def fsdp_unit(max_frames: int = 60) -> str | None:
    """The FSDP2 unit whose collective the training thread is in (``'layers.1' (TransformerBlock), forward all-gather
    on mesh dim 'dp_shard'``), read from its stack by the heartbeat thread while it waits; None outside FSDP2."""
    frame: Any = sys._current_frames().get(threading.main_thread().ident or -1)
    found: tuple[Any, str] | None = None
    step = None
    for _ in range(max_frames):
        if frame is None:
            break
        code = frame.f_code
        if code.co_filename.endswith(_FSDP_GROUP_FILE):
            group = frame.f_locals.get("self")
            if found is None:
                fqn = getattr(group, "_module_fqn", None)
                if isinstance(fqn, str):
                    found = (group, fqn)
            if found is not None and group is found[0]:
                step = _FSDP_STEPS.get(code.co_name, step)  # the unit's outermost step: forward or backward
        frame = frame.f_back
    return _describe_unit(found[0], found[1], step) if found is not None else None


def _describe_unit(group: Any, fqn: str, step: str | None) -> str:
    modules = getattr(group, "modules", None) or ()
    cls = None
    if modules:
        kind = type(modules[0])  # fully_shard's class is FSDP<Cls>(FSDPModule, Cls): the user's is the last base
        cls = kind.__bases__[-1].__name__ if kind.__name__.startswith("FSDP") and len(kind.__bases__) > 1 \
            else kind.__name__
    text = f"FSDP unit '{fqn}'" if fqn else "FSDP root unit"
    if cls:
        text += f" ({cls})"
    if step:
        text += f", {step}"
    try:
        info = group.mesh_info
        names = info.mesh.mesh_dim_names
        dim = info.replicate_mesh_dim if step == "reduce-scatter" and info.shard_mesh_dim is None \
            else info.shard_mesh_dim
        if names and dim is not None:
            text += f" on mesh dim '{names[dim]}'"
    except Exception:  # noqa: BLE001 - another torch's layout: the unit alone
        pass
    return text


class CollectiveSource:
    """Installed by RankSession in every mode before the script runs; read by the heartbeat (``current``), the
    ledger (through the tracker's "collective" phase) and the verdict (the dump's Flight Recorder entries)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.kind: str | None = None  # the wait the training thread is in now (a WAIT_OPS key)
        self.since: float | None = None  # when it began (time.time())
        self.waits = 0  # waits seen on the training thread (tests, the benchmark)
        self.failed: CollectiveState | None = None  # the first wait that raised, named (status.json)
        self._depth = 0
        self._main = threading.main_thread().ident
        self._originals: list[tuple[Any, str, Any]] = []
        self._named: tuple[tuple[str, int], CollectiveState | None] | None = None  # (group, seq) -> its entry

    # -- install ----------------------------------------------------------------------------------------
    def install(self) -> None:
        work = getattr(torch._C._distributed_c10d, "Work", None)
        if work is not None and callable(getattr(work, "wait", None)):
            self._patch(work, "wait", "wait")
        if callable(getattr(dist, "_broadcast_coalesced", None)):
            self._patch(dist, "_broadcast_coalesced", "broadcast_coalesced")
        try:
            from torch.distributed import _functional_collectives as funcol
        except Exception:  # noqa: BLE001 - a build without them
            return
        if callable(getattr(funcol, "wait_tensor", None)):
            self._patch(funcol, "wait_tensor", "wait_tensor")

    def uninstall(self) -> None:
        for owner, name, orig in reversed(self._originals):
            setattr(owner, name, orig)
        self._originals.clear()

    def finish(self, status: Any) -> None:
        self.uninstall()

    def _patch(self, owner: Any, name: str, kind: str) -> None:
        orig = getattr(owner, name)
        self._originals.append((owner, name, orig))
        setattr(owner, name, self._wrap(orig, kind))

    def _wrap(self, fn: Any, kind: str) -> Any:
        source = self
        get_ident = threading.get_ident

        @functools.wraps(fn)
        def waiting(*args: Any, **kwargs: Any) -> Any:
            if get_ident() != source._main:
                return fn(*args, **kwargs)  # another thread's wait (a data-loader or a user thread)
            source._enter(kind)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                source._failed(kind, exc)
                raise
            finally:
                source._exit()

        return waiting

    # -- the training thread ------------------------------------------------------------------------------
    def _enter(self, kind: str) -> None:
        self._depth += 1
        if self._depth == 1:
            self.kind = kind
            self.since = time.time()
            self.waits += 1
            self.tracker.collective_started()

    def _failed(self, kind: str, exc: BaseException) -> None:
        """A wait that raised (a peer died, gloo's size check, a timeout): status.json's failed_collective, named by
        the Flight Recorder's first collective pending (the error path only: its cost does not matter)."""
        if self.failed is not None:
            return
        try:
            from ddpdoctor.probes.heartbeat_lines import user_call_site

            first = pending(fr_status())
            default = default_group_name()
            group = min(first, key=lambda g: (g != default, g)) if first else None
            state: CollectiveState = {
                "op": WAIT_OPS.get(kind, kind), "group": group_label(group, default) if group else None,
                "seq": first.get(group) if group else None, "sizes": [], "call_site": user_call_site(3),
                "since": self.since or time.time(), "step": self.tracker.step, "source": "flight-recorder",
                "error": f"{type(exc).__name__}: {exc}"[:2000]}
            if group is not None and state["seq"] is not None:
                named = self._name(group, int(state["seq"]), default)
                if named is not None:
                    state.update({"op": named["op"], "sizes": named["sizes"]})
            self.failed = state
        except Exception:  # noqa: BLE001 - the user's exception is what matters; this is only its label
            pass

    def _exit(self) -> None:
        self._depth -= 1
        if self._depth <= 0:
            self._depth = 0
            self.kind = None
            self.since = None
            self.tracker.collective_ended()

    # -- readers (the heartbeat thread) --------------------------------------------------------------------
    def current(self, call_site: str | None) -> CollectiveState | None:
        """What the training thread waits in now, named by the Flight Recorder (None when it waits in nothing these
        wrappers see). ``call_site``: the training thread's innermost user frame, read by the caller."""
        kind, since = self.kind, self.since
        if kind is None or since is None:
            return None
        status = fr_status()
        first = pending(status)
        default = default_group_name()
        group, seq = None, None
        if first:
            group = min(first, key=lambda g: (g != default, g))  # the default group first, where most waits are
            seq = first[group]
        state: CollectiveState = {"op": WAIT_OPS.get(kind, kind),
                                  "group": group_label(group, default) if group else None,
                                  "seq": seq, "sizes": [], "call_site": call_site, "since": since,
                                  "step": self.tracker.step, "source": "flight-recorder" if first else "wait"}
        unit = fsdp_unit()
        if unit is not None:
            state["unit"] = unit
        if group is not None and seq is not None and time.time() - since >= NAME_AFTER_S:
            named = self._name(group, seq, default)
            if named is not None:
                state.update({"op": named["op"], "sizes": named["sizes"], "group": named["group"]})
                if named.get("dtypes"):
                    state["dtypes"] = named["dtypes"]
        return state

    def _name(self, group: str, seq: int, default: str | None) -> CollectiveState | None:
        """The Flight Recorder's entry for (group, seq): one read of the ring per distinct stuck collective."""
        key = (group, seq)
        if self._named is not None and self._named[0] == key:
            return self._named[1]
        found: CollectiveState | None = None
        for e in reversed(fr_entries()):
            pg = e.get("process_group") or []
            name = str(pg[0]) if isinstance(pg, list) and pg else ""
            if name == group and _int(e.get("collective_seq_id")) == seq and not e.get("is_p2p"):
                found = {"op": op_name(e.get("profiling_name")), "group": group_label(name, default),
                         "seq": seq, "sizes": [list(s) for s in (e.get("input_sizes") or [])][:4],
                         "dtypes": [str(d) for d in (e.get("input_dtypes") or [])][:4], "call_site": None}
                break
        self._named = (key, found)
        return found
