"""Horovod's elastic API (``hvd.elastic.TorchState``, ``hvd.elastic.ElasticSampler``,
``@hvd.elastic.run``) on dtrain.

    import dtrain.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for batch, (x, y) in enumerate(loader):
                ...
                state.sampler.record_batch(batch, 32)
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    train(state)

Two ways to survive a rank's death:

- ``dtrain run -n 4 --live -- python3 train.py``: live recovery, as Horovod's. A failed
  collective raises on the survivors; ``@run`` re-forms torch.distributed's world among them (each
  keeps its order; the dead rank's place closes up), returns the state to its last commit, syncs
  it from the newest commit any survivor holds, runs the reset callbacks and calls the function
  again. The sampler deals the epoch's samples not yet trained over the ranks that are left, so
  each is trained once (the last batch of an epoch may repeat a few to even out the ranks, as
  PyTorch's DistributedSampler does; ``sampler.is_padding(k)`` names them). The processes keep
  running: recovery takes well under a second.
- ``dtrain run -n 4 --max-restarts 3 -- python3 train.py``: restart. ``dtrain run`` stops the
  round and starts every worker again (on the nodes there are, between --nnodes MIN and MAX);
  they resume from the newest commit any of them holds.

``commit()`` saves the model, the optimizer, the samplers' positions and the state's numbers
(epoch, batch, ...) as the in-process copy that ``restore()`` returns to and, under a restarting
launcher, as an in-memory commit (DTRAIN_COMMIT_DIR on tmpfs, kept by the launcher across
restarts; the C++ checkpoint format, written in the background by each node's lowest rank).
Without either launcher commits stay in the process.

The state's other attributes must be numbers (they are stored as the checkpoint's values) or
ElasticSamplers.
"""
from __future__ import annotations

import collections
import copy
import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

import torch

from dtrain import _torch
from dtrain._elastic_run import (HostsUpdatedInterrupt, elastic_run, reformed_line,
                                 take_in_waiting)
from dtrain.torch import collectives, live
from dtrain.torch.backend import backend_of
from dtrain.torch.checkpoint import _finish_load, _model, _optimizer_type
from dtrain.torch.functions import (_send_optimizer_state, allgather_object, broadcast_object,
                                    broadcast_parameters)

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "TorchState", "run"]

_S = TypeVar("_S", bound="TorchState")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class ElasticSampler(torch.utils.data.Sampler[int]):
    """This rank's share of what is left of the epoch, over the ranks there are now: dtrain's
    DistributedSampler (PyTorch's split for a whole epoch), re-dealt after live recovery.
    Record the batches trained (record_batch) so that a commit knows the epoch's position."""

    def __init__(self, dataset: Sized | int, shuffle: bool = True, seed: int = 0) -> None:
        self._size = dataset if isinstance(dataset, int) else len(dataset)
        self._shuffle = bool(shuffle)
        self._seed = int(seed)
        self.epoch = 0
        self._start = 0    # the epoch's position (all ranks together) this deal began at
        self._trained = 0  # of this rank's indices since then
        self.reset()

    def reset(self) -> None:
        """Deals the rest of the epoch over the ranks there are now (after live recovery)."""
        self._sampler = _torch.DistributedSampler(self._size, collectives.size(),
                                                  collectives.rank(), self._shuffle, self._seed,
                                                  False)
        self._sampler.set_epoch(self.epoch, self._start)
        self._trained = 0

    def set_epoch(self, epoch: int) -> None:
        """The whole of epoch `epoch` (its permutation: seed + epoch)."""
        self.epoch = int(epoch)
        self._start = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Batches 0..batch_idx of this deal, of batch_size samples, are trained."""
        self._trained = min((int(batch_idx) + 1) * int(batch_size), len(self))

    def record_indices(self, indices: Sized) -> None:
        """The next len(indices) of this rank's samples are trained."""
        self._trained = min(self._trained + len(indices), len(self))

    def position(self) -> int:
        """Samples of the epoch the job has trained (all ranks together)."""
        return int(self._sampler.consumed(self._trained))

    def is_padding(self, k: int) -> bool:
        """Whether this rank's k-th index of the deal only evens out the ranks' shares (a sample
        another rank trains too): give it no weight to train each sample exactly once."""
        return bool(self._sampler.is_padding(int(k)))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self._start = int(state["position"])
        self.reset()

    def __iter__(self) -> Iterator[int]:
        return iter(self._sampler.indices())

    def __len__(self) -> int:
        return int(self._sampler.num_samples)


class TorchState:
    """The model, the optimizer and named numbers (epoch, batch, ...) that training resumes
    from. Set and read the numbers as attributes."""

    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    _names: list[str]  # of the numbers, in the order they were first set
    _samplers: dict[str, ElasticSampler]

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **numbers_: float) -> None:
        object.__setattr__(self, "_names", [])
        object.__setattr__(self, "_samplers", {})
        self.model = model
        self.optimizer = optimizer
        for name, value in numbers_.items():
            setattr(self, name, value)
        # The commit manager: None until looked for, False when there is none.
        self._commits: _torch.CheckpointManager | Literal[False] | None = None
        self._commit_count = 0
        self._saved: tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, float],
                           dict[str, dict[str, int]]] | None = None
        self._reset_callbacks: list[Callable[[], object]] = []

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """The numbers set as attributes (epoch, batch, ...)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ElasticSampler) and not name.startswith("_"):
            self._samplers[name] = value
        elif not name.startswith("_") and name not in ("model", "optimizer"):
            if not isinstance(value, numbers.Number):
                raise TypeError(f"TorchState.{name} = {value!r}: the state's attributes other than "
                                f"model and optimizer must be numbers (they are checkpointed as "
                                f"such) or ElasticSamplers")
            if name not in self._names:
                self._names.append(name)
        object.__setattr__(self, name, value)

    def _values(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in self._names}

    def _set_values(self, values: dict[str, float]) -> None:
        for name in self._names:
            if name in values:
                old = getattr(self, name)
                setattr(self, name, type(old)(values[name]) if isinstance(old, int) else values[name])

    def save(self) -> None:
        """The in-process copy that restore() returns to (into the previous copy's tensors)."""
        model_state, optimizer_state = self._saved[:2] if self._saved else (None, None)
        self._saved = (_copy_into(model_state, self.model.state_dict())
                       if self.model is not None else None,
                       _copy_into(optimizer_state, self.optimizer.state_dict())
                       if self.optimizer is not None else None,
                       self._values(), self._sampler_states())

    def _sampler_states(self) -> dict[str, dict[str, int]]:
        return {name: sampler.state_dict() for name, sampler in self._samplers.items()}

    def _set_sampler_states(self, states: dict[str, dict[str, int]]) -> None:
        for name, sampler in self._samplers.items():
            if name in states:
                sampler.load_state_dict(states[name])

    def restore(self) -> None:
        """Back to the last commit (in this process)."""
        if self._saved is None:
            return
        model_state, optimizer_state, values, sampler_states = self._saved
        if model_state is not None and self.model is not None:
            self.model.load_state_dict(model_state)
        if optimizer_state is not None and self.optimizer is not None:
            # A copy: the optimizer keeps the tensors it is given and updates them in place,
            # and the commit must stay as it was until the next (a second failure before it).
            self.optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        self._set_values(values)
        self._set_sampler_states(sampler_states)

    def commit(self) -> None:
        """Saves the state: in this process, and as an in-memory commit that a restarted job
        resumes from. Under `dtrain run --live`, ranks waiting to be taken in (replacements under
        --replace, ranks left out of a re-forming) are then taken in (HostsUpdatedInterrupt,
        which run() handles)."""
        self.save()
        self._commit_count += 1
        manager = self._manager()
        if manager is not None and self.model is not None:
            parameters, buffers = _model(self.model)
            manager.save(parameters, buffers, _optimizer_type(self.optimizer),
                         self.optimizer.param_groups if self.optimizer is not None else [],
                         self.optimizer.state if self.optimizer is not None else {},
                         dict(step=self._commit_count, epoch=0, epoch_consumed=0, epoch_size=0,
                              values=self._values()))
        if live.enabled():
            take_in_waiting(collectives._admit_waiting, live.original_rank, self._commit_count,
                            collectives.rank, collectives.size)

    def sync(self) -> None:
        """Collective: every rank takes the state of the lowest rank holding the newest commit
        (rank 0 at start; after live recovery, a survivor that committed one step more than the
        others spares them that step), its samplers dealt over the ranks there are now."""
        counts = allgather_object(self._commit_count) if collectives.size() > 1 else [0]
        holders = [r for r, count in enumerate(counts) if count == max(counts)]
        root = holders[0]
        if self.model is not None:  # the parameters in pieces from the holders where that pays
            collectives.share_([p.detach() for p in self.model.parameters()], holders)
            broadcast_parameters(dict(self.model.named_buffers()), root_rank=root)
        if self.optimizer is not None:
            _send_optimizer_state(self.optimizer, holders)
        self._set_values(broadcast_object(self._values(), root_rank=root))
        self._set_sampler_states(broadcast_object(self._sampler_states(), root_rank=root))
        self._commit_count = broadcast_object(self._commit_count, root_rank=root)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Called after the state was restored from a commit (as Horovod calls them after a
        reset), e.g. to scale the learning rate to the new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def _manager(self) -> _torch.CheckpointManager | None:
        if self._commits is None and self.model is not None:
            group = backend_of()
            self._commits = _torch.commit_manager(group) or False
        return self._commits or None

    def _resume(self) -> bool:
        """Collective: the newest commit any rank holds, if any. True when one was loaded."""
        manager = self._manager()
        if manager is None or self.model is None:
            return False
        parameters, buffers = _model(self.model)
        loaded = _torch.resume_newest([(manager, "in-memory commit")],
                                      backend_of(), parameters,
                                      buffers, _optimizer_type(self.optimizer),
                                      self.optimizer.param_groups
                                      if self.optimizer is not None else [])
        checkpoint = _finish_load(loaded, self.optimizer)
        if checkpoint is None:
            return False
        self._commit_count = checkpoint.step
        self._set_values(checkpoint.values)
        self.save()
        what = (f"from commit {checkpoint.step} ({checkpoint.path}, saved at world size "
                f"{checkpoint.world_size})")
        print(f"rank {collectives.rank()}: resumed {what}", flush=True)
        _torch.announce_resumed(collectives.rank(), what)
        return True


def _copy_into(saved: Any, current: Any) -> Any:
    """A copy of the state dict `current` (dicts, lists and tuples of tensors and plain values)
    that reuses the tensors of `saved`, an earlier copy, where shape, type and device match: a
    commit per step of a large model then allocates nothing (a fresh copy would allocate and
    fault in the whole state each step)."""
    if isinstance(current, torch.Tensor):
        if (isinstance(saved, torch.Tensor) and saved.shape == current.shape
                and saved.dtype == current.dtype and saved.device == current.device):
            return saved.copy_(current)
        return current.detach().clone()
    if type(current) in (dict, collections.OrderedDict):
        earlier: dict[Any, Any] = saved if isinstance(saved, dict) else {}
        copied = type(current)((k, _copy_into(earlier.get(k), v)) for k, v in current.items())
        if hasattr(current, "_metadata"):  # a module's state dict: versions for loading
            copied._metadata = copy.deepcopy(current._metadata)
        return copied
    if type(current) in (list, tuple):
        same = type(saved) is type(current) and len(saved) == len(current)
        return type(current)(_copy_into(saved[i] if same else None, v)
                             for i, v in enumerate(current))
    return copy.deepcopy(current)


def run(function: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Runs `function(state, ...)` from the newest commit of the job, if a restart left one,
    with every rank starting from the same state; under `dtrain run --live` it starts again
    among the survivors, from the last commit, when a rank dies (and with the replacements
    taken in, under --replace)."""
    return elastic_run(function, collectives, _recover, live.close)


def _recover(error: Exception, state: TorchState) -> bool:
    """Live recovery: re-forms the job among the survivors after a peer's death."""
    if not live.peer_lost(error):
        return False
    me = live.original_rank()
    first = (str(error).splitlines() or [type(error).__name__])[0]
    print(f"rank {me} at start: {first}", flush=True)
    start = time.monotonic()
    reformed = collectives._reform()
    took = time.monotonic() - start
    if reformed.rejoined:
        # Left out (it came after the others closed the list) and taken in again at their
        # commit: its own commits are stale, never the ones to go on from.
        state._commit_count = -1
    print(reformed_line(me, reformed.lost, reformed.rejoined, took, collectives.rank(),
                        collectives.size()), flush=True)
    return True
