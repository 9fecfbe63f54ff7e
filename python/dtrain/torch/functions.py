"""Horovod's helpers for starting every rank from the same state: parameters, optimizer state,
and any picklable object."""
from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from dtrain.torch import collectives
from dtrain.torch.optimizer import _DistributedOptimizer

_T = TypeVar("_T")


def broadcast_parameters(params: dict[str, Any] | Iterable[tuple[str, torch.Tensor | None]],
                         root_rank: int = 0) -> None:
    """Overwrites every rank's tensors with root_rank's, in place. `params`: a state_dict, or an
    iterable of (name, tensor) pairs such as model.named_parameters()."""
    items: list[Any] = sorted(params.items()) if isinstance(params, dict) else list(params)
    if items and not isinstance(items[0], tuple):
        raise ValueError("broadcast_parameters: expected a state_dict or (name, tensor) pairs, "
                         f"got a sequence of {type(items[0]).__name__}")
    with torch.no_grad():
        for _, p in items:
            if p is not None:
                collectives.broadcast_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                       root_rank)


@collectives._whole_job
def broadcast_object(obj: _T, root_rank: int = 0, name: str | None = None,
                     process_set: object = None) -> _T:
    """root_rank's `obj` (pickled), on every rank."""
    payload: bytes | None
    if collectives.rank() == root_rank:
        payload = pickle.dumps(obj)
        length = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        payload = None
        length = torch.zeros(1, dtype=torch.int64)
    collectives.broadcast_(length, root_rank)
    buffer = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload is not None
              else torch.empty(int(length[0]), dtype=torch.uint8))
    collectives.broadcast_(buffer, root_rank)
    if payload is not None:
        return obj
    received: _T = pickle.load(io.BytesIO(buffer.numpy().tobytes()))
    return received


@collectives._whole_job
def allgather_object(obj: _T, name: str | None = None, process_set: object = None) -> list[_T]:
    """Every rank's `obj` (pickled), as a list in rank order."""
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    lengths = collectives.allgather(torch.tensor([payload.numel()], dtype=torch.int64)).tolist()
    gathered = collectives.allgather(payload)
    out: list[_T] = []
    at = 0
    for n in lengths:
        out.append(pickle.loads(gathered[at:at + n].numpy().tobytes()))
        at += n
    return out


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Overwrites every rank's optimizer state (and hyperparameters such as the learning rate)
    with root_rank's. When root_rank's optimizer has not stepped yet, each rank's gets its state
    first, as in Horovod: parameters that require grad and have none get zero gradients, and one
    step of the wrapped optimizer makes the state; the parameters are put back as they were."""
    _send_optimizer_state(optimizer, [root_rank])


def _send_optimizer_state(optimizer: torch.optim.Optimizer, holders: list[int]) -> None:
    """broadcast_optimizer_state from holders[0]; with several holders (ranks whose states are
    the same: live recovery's members at the newest commit), the tensors in pieces from each
    (collectives.share_)."""
    # The structure and the plain values travel pickled; the tensors (for a large model, most of
    # the bytes) each straight into its buffer: pickled, each would be copied several times over
    # on every rank.
    tensors: list[torch.Tensor] = []
    skeleton = broadcast_object(_without_tensors(optimizer.state_dict(), tensors), holders[0])
    if not skeleton["state"]:
        # holders[0]'s optimizer has not stepped: each rank's makes its state first, so that
        # every rank ends with one. A rank that receives a state makes none of its own: a
        # replacement would spend most of a step on it while the others wait.
        _make_state(optimizer)
        tensors = []
        skeleton = broadcast_object(_without_tensors(optimizer.state_dict(), tensors), holders[0])
    holder = collectives.rank() in holders
    if not holder:
        tensors = []
        state = _with_tensors(skeleton, tensors)
    if len(holders) > 1:
        collectives.share_(tensors, holders)
    else:
        for t in tensors:
            collectives.broadcast_(t, holders[0])
    if not holder:
        optimizer.load_state_dict(state)


def _make_state(optimizer: torch.optim.Optimizer) -> None:
    """An optimizer that has no state yet gets one, as in Horovod: parameters that require grad
    and have none get zero gradients, and one step of the wrapped optimizer makes the state; the
    parameters are put back as they were."""
    if optimizer.state_dict()["state"]:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
            if isinstance(optimizer, torch.optim.SparseAdam):
                p.grad = p.grad.to_sparse()
    kept = [p.detach().clone() for p in params]
    if isinstance(optimizer, _DistributedOptimizer):  # its own step would reduce the zeros
        optimizer._step_unreduced()
    else:
        optimizer.step()
    with torch.no_grad():
        for p, k in zip(params, kept):
            p.copy_(k)


class _TensorSlot:
    """Where a tensor sits in a state dict sent without its tensors: its shape, type and kind of
    device (a GPU's tensor is received on this rank's GPU: under the nccl backend a CUDA and a
    host tensor go through different groups)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype, self.cuda = tuple(t.shape), t.dtype, t.is_cuda


def _without_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with each tensor replaced by a _TensorSlot; the tensors appended to `tensors` in
    the order the slots are met (contiguous: a broadcast sends a dense buffer)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().contiguous())
        return _TensorSlot(value)
    if isinstance(value, dict):
        return {k: _without_tensors(v, tensors) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_without_tensors(v, tensors) for v in value)
    return value


def _with_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    """The state dict of a skeleton from _without_tensors, with a new tensor for each slot
    (appended to `tensors`, in the same order)."""
    if isinstance(value, _TensorSlot):
        tensors.append(torch.empty(value.shape, dtype=value.dtype,
                                   device="cuda" if value.cuda else "cpu"))
        return tensors[-1]
    if isinstance(value, dict):
        return {k: _with_tensors(v, tensors) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_with_tensors(v, tensors) for v in value)
    return value
