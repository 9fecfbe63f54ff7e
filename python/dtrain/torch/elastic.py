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
Without either launcher commits stay in the process. Under ``--live`` a commit one optimizer
step after the one before copies only what is small (TorchState.save says why that is enough).

The state's other attributes must be numbers (they are stored as the checkpoint's values) or
ElasticSamplers.
"""
from __future__ import annotations

import collections
import copy
import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any, Concatenate, Literal, NamedTuple, ParamSpec, TypeVar

import torch

from dtrain import _torch
from dtrain._elastic_run import (HostsUpdatedInterrupt, elastic_run, reformed_line,
                                 take_in_waiting)
from dtrain.torch import collectives, live
from dtrain.torch.backend import backend_of
from dtrain.torch.checkpoint import _finish_load, _model, _optimizer_type
from dtrain.torch.functions import (_send_optimizer_state, allgather_object, broadcast_object,
                                    broadcast_parameters)

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "TorchState", "WHOLE_EVERY", "run"]

# Under --live, every how many commits one copies the whole state (TorchState.save): what a
# rank goes back to when it changed its state after a light commit and no survivor holds that.
WHOLE_EVERY = 10
# The prefix of the samplers' positions among a restart commit's values (TorchState.commit).
_SAMPLER = "sampler/"

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
        self._saved: _Commit | None = None  # the newest commit: whole or light
        self._whole: _Commit | None = None  # the newest whole one
        # Whether commits may be light: not once this rank had to go back from one (its loop
        # changes the state between the optimizer step and the commit, where light ones fail it).
        self._lights = True
        self._steps = _StepCounter(optimizer)
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
        """Makes the current state the one restore() returns to: a copy of the whole state (into
        the previous copy's tensors), as Horovod's. Under `dtrain run --live`, where the
        survivors of a failure usually still hold their last commit (a peer's death fails the
        gradients' all-reduce before the optimizer changes anything), a commit made one optimizer
        step after the one before is light instead, but for every WHOLE_EVERY-th: it copies what
        is small (buffers, the optimizer's settings, the numbers, the samplers' positions) and
        notes the version of every parameter and optimizer tensor. A rank that changed them since
        a light commit goes back to its last whole one, unless another survivor holds the light
        one still (sync()), and makes whole commits from then on."""
        self._save(received=False)

    def _save(self, received: bool) -> None:
        """save(); `received`: this rank has just taken the whole state from the ranks holding the
        newest commit (sync()). Its commit is light then, even without a whole one of its own
        (a newcomer's first): should it have to go back, those ranks give it the state again. So a
        spare taken in copies nothing while the others wait for it; its first whole commit comes
        with theirs, at the next multiple of WHOLE_EVERY."""
        steps = self._steps.completed
        last, whole = self._saved, self._whole
        whole_due = (self._commit_count % WHOLE_EVERY == 0
                     or (last is None and not received)
                     or (whole is not None and self._commit_count - whole.number >= WHOLE_EVERY))
        light = (self._lights and live.enabled() and not whole_due
                 and (received or (last is not None and steps - last.steps <= 1)))
        if light:
            earlier = last if last is not None and last.versions is not None else None
            model = (_copy_into(earlier.model if earlier else None,
                                dict(self.model.named_buffers()))
                     if self.model is not None else None)
            optimizer = ({"param_groups": _hyperparameters(self.optimizer)}
                         if self.optimizer is not None else None)
            versions = _Versions.of(self.model, self.optimizer)
        else:
            earlier = whole
            model = (_copy_into(earlier.model if earlier else None, self.model.state_dict())
                     if self.model is not None else None)
            optimizer = (_copy_into(earlier.optimizer if earlier else None,
                                    self.optimizer.state_dict())
                         if self.optimizer is not None else None)
            versions = None
        self._saved = _Commit(self._commit_count, steps, model, optimizer, self._values(),
                              self._sampler_states(), versions)
        if not light:
            self._whole = self._saved

    def _committed_values(self) -> dict[str, float]:
        """The numbers and the samplers' positions, as a commit for a restart keeps them (its
        values are numbers by name): a restarted job goes on with the epoch's rest."""
        values = self._values()
        for name, state in self._sampler_states().items():
            for key, value in state.items():
                values[f"{_SAMPLER}{name}/{key}"] = float(value)
        return values

    def _sampler_states(self) -> dict[str, dict[str, int]]:
        return {name: sampler.state_dict() for name, sampler in self._samplers.items()}

    def _set_sampler_states(self, states: dict[str, dict[str, int]]) -> None:
        for name, sampler in self._samplers.items():
            if name in states:
                sampler.load_state_dict(states[name])

    def restore(self) -> None:
        """Back to the last commit, in this process: to the last whole one when this process
        changed its parameters or optimizer state since a light one."""
        saved = self._saved
        self._steps.depth = 0  # the step that failed, if one did, ended
        if saved is None:
            return
        if saved.versions is not None and (saved.steps != self._steps.completed or saved.versions
                                           != _Versions.of(self.model, self.optimizer)):
            self._lights = False
            if self._whole is None:
                # Its state came from the others (sync()) and it made no whole commit since:
                # stale, as a rank taken in again, it takes the state from them again.
                self._commit_count = -1
                return
            saved = self._whole
        if saved.versions is None:
            if saved.model is not None and self.model is not None:
                self.model.load_state_dict(saved.model)
            if saved.optimizer is not None and self.optimizer is not None:
                # A copy: the optimizer keeps the tensors it is given and updates them in place,
                # and the commit must stay as it was until the next (a second failure before it).
                self.optimizer.load_state_dict(copy.deepcopy(saved.optimizer))
        else:
            if saved.model is not None and self.model is not None:
                with torch.no_grad():
                    for name, buffer in self.model.named_buffers():
                        if name in saved.model:
                            buffer.copy_(saved.model[name])
            if saved.optimizer is not None and self.optimizer is not None:
                for group, kept in zip(self.optimizer.param_groups,
                                       saved.optimizer["param_groups"]):
                    group.update(copy.deepcopy(kept))
        if self._commit_count >= 0:  # -1: taken in again, its commits stale (_recover)
            self._commit_count = saved.number
        self._set_values(saved.values)
        self._set_sampler_states(saved.samplers)

    def commit(self) -> None:
        """Saves the state: in this process, and as an in-memory commit that a restarted job
        resumes from. Under `dtrain run --live`, ranks waiting to be taken in (replacements under
        --replace, ranks left out of a re-forming) are then taken in (HostsUpdatedInterrupt,
        which run() handles)."""
        self._commit_count += 1
        self.save()
        manager = self._manager()
        if manager is not None and self.model is not None:
            parameters, buffers = _model(self.model)
            manager.save(parameters, buffers, _optimizer_type(self.optimizer),
                         self.optimizer.param_groups if self.optimizer is not None else [],
                         self.optimizer.state if self.optimizer is not None else {},
                         dict(step=self._commit_count, epoch=0, epoch_consumed=0, epoch_size=0,
                              values=self._committed_values()))
        if live.enabled():
            take_in_waiting(collectives._admit_waiting, live.original_rank, self._commit_count,
                            collectives.rank, collectives.size)

    def sync(self) -> None:
        """Collective: every rank takes the state of the lowest rank holding the newest commit
        any rank holds (rank 0's at start; after live recovery, a survivor that committed one
        step more than the others, or still holds a light commit they went back from, spares
        them those steps), its samplers dealt over the ranks there are now."""
        counts = (allgather_object(self._commit_count) if collectives.size() > 1
                  else [self._commit_count])
        if max(counts) < 0:
            raise RuntimeError(
                f"rank {collectives.rank()} of {collectives.size()}: no rank holds a commit of the "
                f"job's state to go on from: the ranks that held one died, and every rank left "
                f"took its state from them and changed it since (or was left out and taken in "
                f"again); run the job with `dtrain run --max-restarts N` to restart it from its "
                f"newest in-memory or durable commit")
        holders = [r for r, count in enumerate(counts) if count == max(counts)]
        root = holders[0]
        received = counts[collectives.rank()] != counts[root]
        if self.model is not None:  # the parameters in pieces from the holders where that pays
            collectives.share_([p.detach() for p in self.model.parameters()], holders)
            broadcast_parameters(dict(self.model.named_buffers()), root_rank=root)
        if self.optimizer is not None:
            _send_optimizer_state(self.optimizer, holders)
        self._set_values(broadcast_object(self._values(), root_rank=root))
        self._set_sampler_states(broadcast_object(self._sampler_states(), root_rank=root))
        self._commit_count = broadcast_object(self._commit_count, root_rank=root)
        if live.enabled():
            self._save(received)  # every rank holds this commit now

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
        collectives._live()  # a replacement that has not needed the world yet joins it now
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
        samplers: dict[str, dict[str, int]] = {}
        for key, value in checkpoint.values.items():
            if key.startswith(_SAMPLER):
                name, field = key[len(_SAMPLER):].rsplit("/", 1)
                samplers.setdefault(name, {})[field] = int(value)
        self._set_sampler_states(samplers)
        self.save()
        what = (f"from commit {checkpoint.step} ({checkpoint.path}, saved at world size "
                f"{checkpoint.world_size})")
        print(f"rank {collectives.rank()}: resumed {what}", flush=True)
        _torch.announce_resumed(collectives.rank(), what)
        return True


class _Commit(NamedTuple):
    """What restore() returns to: commit `number`, made after `steps` optimizer steps; the
    model's and the optimizer's state dicts (a light commit: the buffers and the optimizer's
    settings, with the `versions` of the rest), the numbers and the samplers' positions."""
    number: int
    steps: int
    model: dict[str, Any] | None
    optimizer: dict[str, Any] | None
    values: dict[str, float]
    samplers: dict[str, dict[str, int]]
    versions: _Versions | None


class _Versions:
    """The parameters and optimizer tensors, each with its version (which every in-place change
    bumps): equal while nothing changed them."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors  # kept, so that a tensor freed and another made there differ
        self.versions = [t._version for t in tensors]

    @staticmethod
    def of(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> _Versions:
        tensors: list[torch.Tensor] = list(model.parameters()) if model is not None else []
        if optimizer is not None:
            tensors += [t for group in optimizer.param_groups for t in group["params"]]
            tensors += [v for per_param in optimizer.state.values() for v in per_param.values()
                        if isinstance(v, torch.Tensor)]
        return _Versions(tensors)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _Versions) and len(self.tensors) == len(other.tensors)
                and all(a is b for a, b in zip(self.tensors, other.tensors))
                and self.versions == other.versions)


class _StepCounter:
    """The optimizer steps completed: each counts once, though torch's hooks run twice for a
    step that calls the step of the optimizer it wraps (DistributedOptimizer's), and not at all
    when it raised (its gradients' all-reduce failed: it changed nothing). An optimizer that
    writes its parameters through `.data` changes no version counter, but is counted here."""

    def __init__(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.completed = 0
        self.depth = 0  # steps running, one in another
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._enter)
            optimizer.register_step_post_hook(self._leave)

    def _enter(self, *_: Any) -> None:
        self.depth += 1

    def _leave(self, *_: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.completed += 1


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings (lr, momentum, ...), without its parameters."""
    return [copy.deepcopy({k: v for k, v in group.items() if k != "params"})
            for group in optimizer.param_groups]


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
