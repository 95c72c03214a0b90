"""`check-sync --equivalence`: for one step, DDP's averaged gradient vs the gradient one process computes on all batches.

At the chosen iteration each rank keeps a copy of the wrapped module (as the forward saw it), its inputs
and the gradient that reached the module's output (dL_r/d output_r, so no knowledge of the loss is needed).
At that iteration's optimizer step the ranks gather these on a gloo group of their own; rank 0 runs its
copy once on the concatenated inputs, backpropagates the concatenated output gradients, divides by the
world size and compares with the gradient DDP left in its parameters:

    g_one = (1/W) * d/dθ Σ_r <out(x_1..x_W)_r, dL_r/dout_r>      g_ddp = what DDP's all-reduce produced

For per-sample models these are equal up to float rounding (DDP's promise). BatchNorm in training mode
(statistics of the union batch differ from each rank's) and dropout (other masks) break the identity by
design; the result says when they are present.

A model that returns its loss (a 0-d tensor) or outputs without a batch dimension cannot be run on the
union batch: then each rank's batch runs on its own through the copy and the gradients are averaged
(``mode: "per-rank batches"``), which still checks what DDP's all-reduce delivered. Every failure here is
the probe's (see probes/guard.py): every rank still reaches the one exchange, so no rank waits alone."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, TypedDict

import torch

from ddpdoctor.probes.records import EquivalenceResult


def _cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


def _output_tensors(out: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a forward's output, in a fixed order: tensors, lists, tuples, dicts, dataclasses."""
    if isinstance(out, torch.Tensor):
        return [out]
    if depth > 8:
        return []
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _output_tensors(v, depth + 1)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _output_tensors(v, depth + 1)]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return [t for f in dataclasses.fields(out) for t in _output_tensors(getattr(out, f.name, None), depth + 1)]
    return []


def _concat(parts: list[Any]) -> Any:
    """Concatenate the ranks' values of one argument along the batch dimension (non-tensors: rank 0's)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0) if first.dim() > 0 else first
    if isinstance(first, (list, tuple)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    return first


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def relative_error(ddp_grad: torch.Tensor, one_grad: torch.Tensor) -> float:
    """max |g_ddp - g_one| / max |g_one| (the scale of the gradient, so tiny elements do not dominate)."""
    a, b = ddp_grad.detach().double(), one_grad.detach().double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


class _Captured(TypedDict):
    """Rank's module (a copy, before its step) and its inputs, on the CPU, at the step that is checked."""

    module: Any
    args: Any
    kwargs: Any


class _Payload(TypedDict):
    """What each rank sends rank 0 (pickled by all_gather_object): its batch and its outputs' gradients."""

    args: Any
    kwargs: Any
    out_grads: list[torch.Tensor]


class EquivalenceCheck:
    def __init__(self, probe: Any) -> None:
        from ddpdoctor.probes.guard import Guard

        self.probe = probe
        self.guard = Guard("equivalence", probe.notes, lambda: probe.tracker.step)
        self.target = 0 if probe.stop_after == 1 else 1  # iteration 1: DDP has rebuilt its buckets by then
        self.result: EquivalenceResult | None = None
        self._forwards = 0
        self._captured: _Captured | None = None
        self._out_grads: list[torch.Tensor | None] = []
        self._out_shapes: list[tuple[torch.Size, torch.dtype]] = []
        self._kept: list[int] = []  # which of the output tensors carry the loss's gradient (see _sinks)

    def on_forward(self, mod: Any, args: Any, kwargs: Any) -> None:
        self.guard.call("the module's forward", self._on_forward, mod, args, kwargs)

    def on_output(self, mod: Any, out: Any) -> None:
        self.guard.call("the module's output", self._on_output, mod, out)

    def _on_forward(self, mod: Any, args: Any, kwargs: Any) -> None:
        if mod.index != 0 or self.probe.tracker.step != self.target:
            return
        self._forwards += 1
        if self._forwards > 1:
            self._captured = None  # several forwards per step (accumulation): the identity needs one
            return
        self._captured = {"module": copy.deepcopy(mod.ddp.module), "args": _cpu(args), "kwargs": _cpu(kwargs)}

    def _on_output(self, mod: Any, out: Any) -> None:
        if mod.index != 0 or self.probe.tracker.step != self.target or self._captured is None:
            return
        grad_outputs = [t for t in _output_tensors(out) if t.requires_grad]
        self._kept = _sinks(grad_outputs)
        tensors = [grad_outputs[i] for i in self._kept]
        self._out_grads = [None] * len(tensors)
        self._out_shapes = [(t.shape, t.dtype) for t in tensors]
        for i, t in enumerate(tensors):
            t.register_hook(lambda g, i=i: self._keep(i, g))

    def _keep(self, i: int, grad: torch.Tensor) -> None:
        # Runs inside the user's backward: it may not raise. Past a failure it does nothing.
        if self.guard.enabled:
            self.guard.call("the output's gradient hook", self._store, i, grad)

    def _store(self, i: int, grad: torch.Tensor) -> None:
        self._out_grads[i] = grad.detach().cpu()

    def _payload(self) -> _Payload | None:
        cap = self._captured
        if cap is None or not self._out_grads or all(g is None for g in self._out_grads):
            return None
        # An output outside the loss gets no gradient: its gradient is zero.
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype)
                 for g, (shape, dtype) in zip(self._out_grads, self._out_shapes, strict=True)]
        return {"args": cap["args"], "kwargs": cap["kwargs"], "out_grads": grads}

    def on_optimizer_pre(self, step: int) -> None:
        if step != self.target or self.result is not None:
            return
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self.result = {"step": step, "skipped": "no process group"}
            return
        # Every rank reaches this exchange, whatever failed before it: a rank that skipped it would leave
        # the others waiting. A failed rank sends None, and the result says the check was skipped.
        payload = self.guard.call("preparing the batch to exchange", self._payload)
        try:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, payload, group=self.probe.group())
        except Exception as exc:  # noqa: BLE001
            self.guard.fail("exchanging the batches", exc)
            self.result = {"step": step, "skipped": f"the ranks could not exchange their batches ({type(exc).__name__})"}
            return
        if dist.get_rank() != 0:
            self.result = {"step": step, "computed_on": 0}
            return
        result = self.guard.call("the single-process recomputation", self._compare, step, gathered)
        self.result = result if result is not None else {
            "step": step, "skipped": "ddpdoctor could not recompute this model's gradient in one process (see notes)"}

    def _compare(self, step: int, gathered: list[Any]) -> EquivalenceResult:
        if any(p is None for p in gathered) or self._captured is None:
            return {"step": step, "skipped": "a rank did not run exactly one forward and backward of the module in this step"}
        one = self._captured["module"]
        modules = list(one.modules())
        caveats = []
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training for m in modules):
            caveats.append("batchnorm")
        if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0 for m in modules):
            caveats.append("dropout")
        device = next((p.device for p in one.parameters()), torch.device("cpu"))
        world = len(gathered)
        chunks = [(g["args"], g["kwargs"], g["out_grads"]) for g in gathered]
        result: EquivalenceResult = {"step": step, "world_size": world, "caveats": caveats,
                                  "batch_sizes": [int(_first_batch_dim(g["args"])) for g in gathered]}
        union = _union(gathered)
        if union is None:
            # The model returns its loss, or outputs with no batch dimension: no union batch to run.
            result.update({"mode": "per-rank batches", "relative_error": self._errors(one, device, world, chunks)})
            return result
        try:
            result.update({"mode": "union batch", "relative_error": self._errors(one, device, world, [union])})
        except (RuntimeError, ValueError, TypeError, IndexError):
            # The outputs joined but the model does not run on the joined batch (its shapes depend on it).
            result.update({"mode": "per-rank batches", "relative_error": self._errors(one, device, world, chunks)})
            return result
        if caveats == ["batchnorm"]:
            # BatchNorm normalises each rank's batch with that batch's statistics, which is what DDP
            # computes too: run each rank's batch on its own and sum, and DDP must match that exactly.
            result["relative_error_per_rank_batches"] = self._errors(one, device, world, chunks)
        return result

    def _errors(self, one: Any, device: torch.device, world: int, batches: list[Any]) -> dict[str, float | str | None]:
        """Backpropagate ``batches`` (args, kwargs, output gradients) through ``one``; compare (1/W) * sum of the
        gradients with DDP's, per parameter."""
        mod = self.probe.modules[0]
        for p in one.parameters():
            p.grad = None
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            for args, kwargs, out_grads in batches:
                out = one(*_to(args, device), **_to(kwargs, device))
                grad_outputs = [t for t in _output_tensors(out) if t.requires_grad]
                outs = [grad_outputs[i] for i in self._kept]
                torch.autograd.backward(outs, [g.to(device) for g in out_grads])
        one_grads = dict(one.named_parameters())
        per_param: dict[str, float | str | None] = {}
        for name, p in zip(mod.param_names, mod.params, strict=True):
            q = one_grads.get(name)
            if p.grad is None or q is None or q.grad is None:
                per_param[name] = None
                continue
            err = relative_error(p.grad, q.grad / world)
            per_param[name] = err if err != float("inf") else "inf"
        return per_param


def _sinks(outputs: list[torch.Tensor], max_nodes: int = 500_000) -> list[int]:
    """Indices of the outputs no other output was computed from.

    A model returning (logits, loss) computes loss from logits: the gradient that reaches logits already
    contains the part that flowed through loss, so backpropagating both would count it twice. Keeping the
    outputs computed last (loss) keeps terms the forward added to them (auxiliary losses, regularisers)."""
    if len(outputs) < 2:
        return list(range(len(outputs)))
    reach: list[set[Any]] = []
    for t in outputs:
        seen: set[Any] = set()
        stack = [fn for fn, _ in (t.grad_fn.next_functions if t.grad_fn is not None else ()) if fn is not None]
        while stack and len(seen) < max_nodes:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            stack.extend(f for f, _ in fn.next_functions if f is not None)
        reach.append(seen)
    return [i for i, t in enumerate(outputs)
            if t.grad_fn is None or not any(t.grad_fn in reach[j] for j in range(len(outputs)) if j != i)]


def _union(gathered: list[Any]) -> tuple[Any, Any, list[torch.Tensor]] | None:
    """(args, kwargs, output gradients) of all ranks' batches as one batch, or None when the outputs have no
    batch dimension (a loss, a scalar) or the ranks' outputs do not stack."""
    grads = [g["out_grads"] for g in gathered]
    if any(len(g) != len(grads[0]) for g in grads) or any(t.dim() == 0 for g in grads for t in g):
        return None
    try:
        out_grads = [torch.cat([g[i] for g in grads], dim=0) for i in range(len(grads[0]))]
        return _concat([g["args"] for g in gathered]), _concat([g["kwargs"] for g in gathered]), out_grads
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None


def _first_batch_dim(args: Any) -> int:
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return a.shape[0]
    return 0
