"""Sharded data parallelism (ZeRO stages 1-3) for torch modules, on dtrain's process groups.

Each rank keeps 1/N of the optimizer state (stage 1), of the gradients (2) and of the
parameters (3): with Adam in fp32, 16 bytes a parameter on every rank under DDP become 16/N
plus the unit being computed. The algorithm is the C++ ``dtrain::ShardedDataParallel``'s
(docs/sharding.md)::

    import torch, torch.nn.functional as F
    import dtrain, dtrain.sharding

    world = dtrain.init()                                     # under dtrain run -n 2
    torch.manual_seed(0)
    model = torch.nn.Sequential(...)                          # the same on every rank
    sdp = dtrain.sharding.ShardedDataParallel(model, world, stage=3)
    opt = torch.optim.Adam(sdp.parameters(), lr=1e-3)         # this rank's shards
    for x, y in batches:                                      # this rank's share of each batch
        opt.zero_grad()
        F.cross_entropy(sdp(x), y).backward()   # units gathered before use, released after;
        sdp.clip_grad_norm(1.0)                 # gradients reduce-scattered during backward
        opt.step()

Units: each child with parameters of a ``torch.nn.Sequential`` starts one (children without
join the one before; ``min_unit_parameters`` groups small ones); any other module is one unit.
A unit is one flat fp32 buffer padded to a multiple of N; rank r owns elements [r*S, (r+1)*S).
Before a unit's forward its parameters are all-gathered; at stage 3 they are released after it,
gathered again before its backward and released once its gradients are in. When every
parameter of a unit has its gradient, the unit's flat gradient is reduce-scattered (averaged)
into this rank's shard, units strictly from the last to the first on every rank. The
collectives here are synchronous (the C++ class overlaps them with compute). Released
parameters are empty tensors: read the model with :meth:`full_parameters` or after
:meth:`gather_parameters`. Parameters must be fp32 CPU tensors that require grad, each in one
unit; anything else is refused on every rank at construction, naming the parameter.
"""
import contextlib
import hashlib
import math

import numpy as np
import torch

from dtrain._core import InvalidArgumentError

__all__ = ["ShardedDataParallel"]


class _Unit:
    def __init__(self, modules, first_child, end_child):
        self.modules = modules
        self.first_child, self.end_child = first_child, end_child
        self.names, self.params, self.shapes, self.offsets, self.numels = [], [], [], [], []
        self.numel = self.padded = self.shard_numel = 0
        self.full = None          # padded flat parameters; storage released at stage 3
        self.whole = False        # full has memory and the parameters point into it
        self.current = False      # full holds the shards' latest values
        self.shard = None         # this rank's fp32 elements: what the optimizer steps
        self.grad_full = None     # padded flat gradients; the parameters' .grad are views of it
        self.ready = []
        self.ready_count = 0
        self.complete = False
        self.hooks = []


class ShardedDataParallel:
    """ZeRO stage 1, 2 or 3 over ``group`` (a ``dtrain.ProcessGroup``). Collective to build."""

    def __init__(self, module, group, stage=3, broadcast_buffers=True, min_unit_parameters=0):
        self.module, self.group, self.stage = module, group, stage
        self.broadcast_buffers = broadcast_buffers
        self._sync = True
        self._armed = False
        self._finish_queued = False
        self._backward_started = False
        self._next_to_reduce = -1
        rank, n = group.rank, group.size
        refusal = ""
        if stage not in (1, 2, 3):
            refusal = f"stage {stage} is not 1, 2 or 3"

        self._sequential = isinstance(module, torch.nn.Sequential)
        if self._sequential:
            groups, ranges = [], []
            for i, child in enumerate(module.children()):
                count = sum(p.numel() for p in child.parameters())
                open_count = sum(p.numel() for m in groups[-1] for p in m.parameters()) if groups else 0
                if not groups or (count > 0 and open_count > 0 and
                                  open_count >= min_unit_parameters):
                    groups.append([])
                    ranges.append([i, i])
                groups[-1].append(child)
                ranges[-1][1] = i + 1
        else:
            groups, ranges = [[module]], [[0, 0]]

        name_of = {id(p): name for name, p in module.named_parameters()}
        seen = set()
        description = []
        self._units = []
        for u, (mods, (first, end)) in enumerate(zip(groups, ranges)):
            unit = _Unit(mods, first, end)
            for m in mods:
                for p in m.parameters():
                    name = name_of.get(id(p), "<unnamed>")
                    if id(p) in seen:
                        refusal = (f"parameter '{name}' is used by two units (tied weights); put "
                                   "the modules that share it into one unit "
                                   "(min_unit_parameters) or wrap the model as one unit")
                        continue
                    seen.add(id(p))
                    if p.dtype != torch.float32 or p.device.type != "cpu":
                        refusal = (f"parameter '{name}' is {p.dtype} on {p.device}; "
                                   "ShardedDataParallel keeps fp32 CPU parameters")
                    if not p.requires_grad:
                        refusal = (f"parameter '{name}' does not require grad; frozen parameters "
                                   "are not sharded: keep them out of the model given to "
                                   "ShardedDataParallel")
                    unit.names.append(name)
                    unit.params.append(p)
                    unit.shapes.append(tuple(p.shape))
                    unit.offsets.append(unit.numel)
                    unit.numels.append(p.numel())
                    unit.numel += p.numel()
                    description.append(f"{name}:{tuple(p.shape)}:{u}")
            unit.padded = (unit.numel + n - 1) // n * n
            unit.shard_numel = unit.padded // n
            self._units.append(unit)
        if all(not u.params for u in self._units):
            refusal = "the model has no parameters"
        description += [f"{name}:{tuple(b.shape)}" for name, b in module.named_buffers()]

        digest = hashlib.sha256(";".join(description).encode()).digest()[:8]
        mine = np.array([int.from_bytes(digest, "little", signed=True), 1 if refusal else 0],
                        np.int64)
        every = group.allgather(mine).reshape(n, 2)
        differ = [r for r in range(n) if every[r, 0] != every[0, 0]]
        refusing = [r for r in range(n) if every[r, 1] != 0]
        if refusal:
            raise InvalidArgumentError(f"rank {rank}: ShardedDataParallel: {refusal}")
        if refusing:
            raise InvalidArgumentError(
                f"rank {rank}: ShardedDataParallel: ranks {refusing} refused the model (their "
                "errors say why)")
        if differ:
            raise InvalidArgumentError(
                f"rank {rank}: ShardedDataParallel: ranks {differ} have a model that differs from "
                "rank 0's (parameter names, shapes, buffers or units differ); every rank must "
                "build the same model with the same options")

        with torch.no_grad():
            tensors = [p for u in self._units for p in u.params] + list(module.buffers())
            _broadcast(group, tensors)
            for ui, unit in enumerate(self._units):
                unit.full = torch.zeros(unit.padded)
                for i, p in enumerate(unit.params):
                    view = unit.full[unit.offsets[i]:unit.offsets[i] + unit.numels[i]].view(
                        unit.shapes[i])
                    view.copy_(p)
                    p.data = view
                unit.whole = unit.current = True
                unit.shard = unit.full[rank * unit.shard_numel:(rank + 1) * unit.shard_numel] \
                    .clone().requires_grad_()
                unit.ready = [False] * len(unit.params)
                for i, p in enumerate(unit.params):
                    # The AccumulateGrad node of p: its hook runs once p.grad holds the gradient.
                    with torch.enable_grad():
                        acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    unit.hooks.append((acc, acc.register_hook(self._gradient_hook(ui, i))))
                if stage == 1:
                    self._ensure_gradients(ui)
                if stage == 3:
                    self._release(ui)

    # -- public ----------------------------------------------------------------------------------

    def parameters(self):
        """This rank's shards, one flat fp32 tensor per unit: what the optimizer steps."""
        return [u.shard for u in self._units]

    def units(self):
        """[(parameter names, numel, shard numel)] per unit."""
        return [(list(u.names), u.numel, u.shard_numel) for u in self._units]

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The model's forward: a Sequential unit by unit, any other module as one unit."""
        if not self._sequential and len(self._units) != 1:
            raise InvalidArgumentError("ShardedDataParallel: expected one unit")
        self._begin_forward()
        grad = torch.is_grad_enabled()
        if not self._sequential:
            self._gather(0)
            out = self.module(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else [out]
            for t in outs:
                if grad and isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g: self._before_unit_backward(0))
            if self.stage == 3 and not grad:
                self._release(0)
            self._armed = grad and self._sync
            return out
        (x,) = args
        children = list(self.module.children())
        for u, unit in enumerate(self._units):
            self._gather(u)
            for c in range(unit.first_child, unit.end_child):
                x = children[c](x)
            if grad and x.requires_grad:
                x.register_hook(self._output_hook(u))
            if self.stage == 3 and not (grad and u + 1 == len(self._units)):
                self._release(u)
        self._armed = grad and self._sync
        return x

    def clip_grad_norm(self, max_norm):
        """Scales the shards' gradients to a norm over every rank of at most max_norm, as
        torch.nn.utils.clip_grad_norm_ would on the whole model; returns the norm (collective)."""
        squares = np.array([sum(float(u.shard.grad.double().pow(2).sum())
                                for u in self._units if u.shard.grad is not None)])
        self.group.allreduce(squares)
        norm = math.sqrt(squares[0])
        coefficient = max_norm / (norm + 1e-6)
        if coefficient < 1:
            with torch.no_grad():
                for u in self._units:
                    if u.shard.grad is not None:
                        u.shard.grad.mul_(coefficient)
        return norm

    def gather_parameters(self):
        """Makes the module's parameters whole and current (collective)."""
        for u in range(len(self._units)):
            self._gather(u)

    def full_parameters(self):
        """Every parameter's fp32 master value by name, on every rank (collective)."""
        out = {}
        with torch.no_grad():
            for unit in self._units:
                flat = torch.from_numpy(self.group.allgather(unit.shard.detach().numpy()))
                for i, name in enumerate(unit.names):
                    out[name] = flat[unit.offsets[i]:unit.offsets[i] + unit.numels[i]] \
                        .view(unit.shapes[i]).clone()
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Backward accumulates whole gradients locally; the next one outside reduces the sum."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # -- gathering and releasing -----------------------------------------------------------------

    def _gather(self, u):
        unit = self._units[u]
        if unit.current:
            return
        with torch.no_grad():
            if not unit.whole:
                unit.full.untyped_storage().resize_(unit.padded * unit.full.element_size())
            unit.full.copy_(torch.from_numpy(self.group.allgather(unit.shard.detach().numpy())))
            if not unit.whole:
                for i, p in enumerate(unit.params):
                    p.data = unit.full[unit.offsets[i]:unit.offsets[i] + unit.numels[i]].view(
                        unit.shapes[i])
        unit.whole = unit.current = True

    def _release(self, u):
        unit = self._units[u]
        if not unit.whole:
            return
        for p in unit.params:
            p.data = torch.empty(0)
        unit.full.untyped_storage().resize_(0)
        unit.whole = unit.current = False

    def _begin_forward(self):
        if self.stage == 3:
            for u in range(len(self._units)):
                self._release(u)
        if self._armed and not self._backward_started:
            self._armed = False
        if self._backward_started:  # a backward that raised never finished
            self._backward_started = self._finish_queued = self._armed = False
            for unit in self._units:
                unit.ready = [False] * len(unit.params)
                unit.ready_count, unit.complete = 0, False
        if self.broadcast_buffers and torch.is_grad_enabled() and self.group.size > 1:
            buffers = list(self.module.buffers())
            if buffers:
                with torch.no_grad():
                    _broadcast(self.group, buffers)

    # -- backward --------------------------------------------------------------------------------

    def _output_hook(self, u):
        return lambda grad: self._before_unit_backward(u)

    def _gradient_hook(self, u, i):
        return lambda grad_inputs, grad_outputs: self._on_gradient(u, i)

    def _queue_finish(self):
        if not self._backward_started:
            self._backward_started = True
            self._next_to_reduce = len(self._units) - 1
        if not self._finish_queued:
            self._finish_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _ensure_gradients(self, u):
        unit = self._units[u]
        with torch.no_grad():
            if unit.grad_full is None:
                unit.grad_full = torch.zeros(unit.padded)
            for i, p in enumerate(unit.params):
                slot = unit.grad_full[unit.offsets[i]:unit.offsets[i] + unit.numels[i]]
                if p.grad is not None and p.grad.data_ptr() == slot.data_ptr():
                    continue
                if p.grad is not None:  # replaced or reset by the user: it is what counts now
                    slot.copy_(p.grad.reshape(-1))
                else:
                    slot.zero_()
                p.grad = slot.view(unit.shapes[i])

    def _before_unit_backward(self, u):
        self._queue_finish()
        if self.stage == 3:
            self._gather(u)
        self._ensure_gradients(u)

    def _on_gradient(self, u, i):
        self._queue_finish()
        unit = self._units[u]
        if unit.ready[i] and self._armed:
            raise InvalidArgumentError(
                f"rank {self.group.rank}: ShardedDataParallel: parameter '{unit.names[i]}' "
                "received a gradient twice in one backward; run one backward per forward, and "
                "use no_sync() to accumulate over several")
        self._ensure_gradients(u)
        if not unit.ready[i]:
            unit.ready[i] = True
            unit.ready_count += 1
        if unit.ready_count < len(unit.params):
            return
        unit.complete = True
        if self.stage == 3:
            self._release(u)
        if self._armed:
            while self._next_to_reduce >= 0 and self._units[self._next_to_reduce].complete:
                self._reduce(self._next_to_reduce)
                self._next_to_reduce -= 1

    def _reduce(self, u):
        unit = self._units[u]
        self._ensure_gradients(u)
        with torch.no_grad():
            reduced = torch.from_numpy(self.group.reduce_scatter(unit.grad_full.numpy(), op="avg"))
            if unit.shard.grad is None:
                unit.shard.grad = reduced
            else:
                unit.shard.grad.add_(reduced)
            if self.stage == 1:
                unit.grad_full.zero_()
            else:
                for p in unit.params:
                    p.grad = None
                unit.grad_full = None
            if self.stage < 3:
                unit.current = False

    def _finish_backward(self):
        self._finish_queued = False
        self._backward_started = False
        reduce, self._armed = self._armed, False
        if reduce:
            while self._next_to_reduce >= 0:
                self._reduce(self._next_to_reduce)
                self._next_to_reduce -= 1
        for u, unit in enumerate(self._units):
            if self.stage == 3:
                self._release(u)
            unit.ready = [False] * len(unit.params)
            unit.ready_count, unit.complete = 0, False


def _broadcast(group, tensors):
    """Rank 0's tensors into every rank's, packed by dtype into one broadcast each."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for ts in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        group.broadcast(flat.numpy(), root=0)
        offset = 0
        for t in ts:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
