"""`check-sync --equivalence`: for one step, DDP's averaged gradient vs the gradient one process computes on all batches.

At the chosen iteration each rank keeps a copy of the wrapped module (as the forward saw it), its inputs
and the gradient that reached the module's output (dL_r/d output_r, so no knowledge of the loss is needed).
At that iteration's optimizer step the ranks gather these on a gloo group of their own; rank 0 runs its
copy once on the concatenated inputs, backpropagates the concatenated output gradients, divides by the
world size and compares with the gradient DDP left in its parameters:

    g_one = (1/W) * d/dθ Σ_r <out(x_1..x_W)_r, dL_r/dout_r>      g_ddp = what DDP's all-reduce produced

For per-sample models these are equal up to float rounding (DDP's promise). BatchNorm in training mode
(statistics of the union batch differ from each rank's) and dropout (other masks) break the identity by
design; the result says when they are present."""

from __future__ import annotations

import copy
from typing import Any

import torch


def _cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


def _output_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    if isinstance(out, dict):
        return [t for t in out.values() if isinstance(t, torch.Tensor)]
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


class EquivalenceCheck:
    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.target = 0 if probe.stop_after == 1 else 1  # iteration 1: DDP has rebuilt its buckets by then
        self.result: dict[str, Any] | None = None
        self._forwards = 0
        self._captured: dict[str, Any] | None = None
        self._out_grads: list[torch.Tensor | None] = []

    def on_forward(self, mod: Any, args: Any, kwargs: Any) -> None:
        if mod.index != 0 or self.probe.tracker.step != self.target:
            return
        self._forwards += 1
        if self._forwards > 1:
            self._captured = None  # several forwards per step (accumulation): the identity needs one
            return
        self._captured = {"module": copy.deepcopy(mod.ddp.module), "args": _cpu(args), "kwargs": _cpu(kwargs)}

    def on_output(self, mod: Any, out: Any) -> None:
        if mod.index != 0 or self.probe.tracker.step != self.target or self._captured is None:
            return
        tensors = [t for t in _output_tensors(out) if t.requires_grad]
        self._out_grads = [None] * len(tensors)
        for i, t in enumerate(tensors):
            t.register_hook(lambda g, i=i: self._keep(i, g))

    def _keep(self, i: int, grad: torch.Tensor) -> None:
        self._out_grads[i] = grad.detach().cpu()

    def on_optimizer_pre(self, step: int) -> None:
        if step != self.target or self.result is not None:
            return
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self.result = {"step": step, "skipped": "no process group"}
            return
        cap = self._captured
        ok = cap is not None and self._out_grads and all(g is not None for g in self._out_grads)
        payload = {"args": cap["args"], "kwargs": cap["kwargs"], "out_grads": self._out_grads} if ok and cap else None
        group = self.probe.group()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload, group=group)
        if dist.get_rank() != 0:
            self.result = {"step": step, "computed_on": 0}
            return
        self.result = self._compare(step, gathered)

    def _compare(self, step: int, gathered: list[Any]) -> dict[str, Any]:
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
        union = [(_concat([g["args"] for g in gathered]), _concat([g["kwargs"] for g in gathered]),
                  [torch.cat([g["out_grads"][i] for g in gathered], dim=0) for i in range(len(gathered[0]["out_grads"]))])]
        result = {"step": step, "world_size": world, "batch_sizes": [int(_first_batch_dim(g["args"])) for g in gathered],
                  "caveats": caveats, "relative_error": self._errors(one, device, world, union)}
        if caveats == ["batchnorm"]:
            # BatchNorm normalises each rank's batch with that batch's statistics, which is what DDP
            # computes too: run each rank's batch on its own and sum, and DDP must match that exactly.
            chunks = [(g["args"], g["kwargs"], g["out_grads"]) for g in gathered]
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
                outs = [t for t in _output_tensors(out) if t.requires_grad]
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


def _first_batch_dim(args: Any) -> int:
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return a.shape[0]
    return 0
