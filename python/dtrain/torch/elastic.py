"""Horovod's elastic API (``hvd.elastic.TorchState``, ``@hvd.elastic.run``) on dtrain's elastic
launcher.

    import dtrain.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches_per_epoch):
                ...
                state.commit()
            state.batch = 0

    train(state)

```dtrain run -n 4 --max-restarts 3 -- python3 train.py```

Horovod recovers inside the process: a failed collective raises, the survivors roll back to the
last commit and go on with fewer workers. dtrain's elasticity is its launcher's: when a worker
fails, `dtrain run` stops the round and starts every worker again (on the nodes there are, between
--nnodes MIN and MAX), and they resume from the newest commit any of them holds. So here:

- ``commit()`` saves the model, the optimizer and the state's numbers (epoch, batch, ...) as an
  in-memory commit (DTRAIN_COMMIT_DIR on tmpfs, kept by the launcher across restarts; the C++
  checkpoint format, written in the background by each node's lowest rank) and as the in-process
  copy that ``restore()`` returns to;
- ``@run`` starts the function from the newest commit any rank holds (after a restart), then
  ``sync()`` makes every rank start from rank 0's state;
- without an elastic launcher (no DTRAIN_COMMIT_DIR) commits stay in the process.

The state's other attributes must be numbers (they are stored as the checkpoint's values).
"""
from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

import torch

from dtrain import _torch
from dtrain._elastic_run import elastic_run
from dtrain.torch import collectives
from dtrain.torch.backend import backend_of
from dtrain.torch.checkpoint import _finish_load, _model, _optimizer_type
from dtrain.torch.functions import (broadcast_object, broadcast_optimizer_state,
                                    broadcast_parameters)

__all__ = ["TorchState", "run"]

_S = TypeVar("_S", bound="TorchState")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class TorchState:
    """The model, the optimizer and named numbers (epoch, batch, ...) that training resumes
    from. Set and read the numbers as attributes."""

    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    _names: list[str]  # of the numbers, in the order they were first set

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **numbers_: float) -> None:
        object.__setattr__(self, "_names", [])
        self.model = model
        self.optimizer = optimizer
        for name, value in numbers_.items():
            setattr(self, name, value)
        # The commit manager: None until looked for, False when there is none.
        self._commits: _torch.CheckpointManager | Literal[False] | None = None
        self._commit_count = 0
        self._saved: tuple[dict[str, Any] | None, dict[str, Any] | None,
                           dict[str, float]] | None = None
        self._reset_callbacks: list[Callable[[], object]] = []

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """The numbers set as attributes (epoch, batch, ...)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in ("model", "optimizer"):
            if not isinstance(value, numbers.Number):
                raise TypeError(f"TorchState.{name} = {value!r}: the state's attributes other than "
                                f"model and optimizer must be numbers (they are checkpointed as "
                                f"such)")
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
        """The in-process copy that restore() returns to."""
        self._saved = (copy.deepcopy(self.model.state_dict()) if self.model is not None else None,
                       copy.deepcopy(self.optimizer.state_dict())
                       if self.optimizer is not None else None,
                       self._values())

    def restore(self) -> None:
        """Back to the last commit (in this process)."""
        if self._saved is None:
            return
        model_state, optimizer_state, values = self._saved
        if model_state is not None and self.model is not None:
            self.model.load_state_dict(model_state)
        if optimizer_state is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self._set_values(values)

    def commit(self) -> None:
        """Saves the state: in this process, and as an in-memory commit that a restarted job
        resumes from."""
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

    def sync(self) -> None:
        """Collective: every rank takes rank 0's state."""
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        self._set_values(broadcast_object(self._values(), root_rank=0))
        self._commit_count = broadcast_object(self._commit_count, root_rank=0)

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


def run(function: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Runs `function(state, ...)` from the newest commit of the job, if a restart left one,
    with every rank starting from the same state."""
    return elastic_run(function, collectives)
