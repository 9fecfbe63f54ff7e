"""Horovod's elastic API for TensorFlow (``hvd.elastic.TensorFlowKerasState``,
``TensorFlowState``, ``@hvd.elastic.run``) on dtrain's elastic launcher.

    import dtrain.tensorflow as hvd
    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

```dtrain run -n 4 --max-restarts 3 -- python3 train.py```

```dtrain run -n 4 --live -- python3 train.py```: live recovery, as Horovod's. When a collective
fails because a rank died, ``@run`` re-forms the job among the survivors without restarting them
(dtrain::LiveWorld), goes back to the last commit, takes the state of the lowest rank holding the
newest commit, runs the reset callbacks (rescale the learning rate there, with ``size()`` or
``step_shape()``) and starts the function again. Under ``--live --replace N`` a replacement's
``hvd.init()`` returns once the others took it in at a ``commit()``, which then raises
``HostsUpdatedInterrupt``: ``@run`` syncs the state with it and starts the function again.

Without --live, as with dtrain.torch's: when a worker fails, `dtrain run` starts every worker
again and they resume from the newest commit any of them holds. ``commit()`` keeps a copy in the
process (what ``restore()`` returns to) and, under an elastic launcher, writes this rank's
variables and numbers to ``DTRAIN_COMMIT_DIR`` (node-local memory the launcher keeps across
restarts; replaced whole, by rename, so a crash mid-write leaves the previous commit). ``@run``
loads the newest commit of any rank on the rank that holds it and makes every rank start from it
(``sync()``). The state's attributes other than the model, optimizer and variables must be
numbers.
"""
from __future__ import annotations

import numbers
import os
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

from dtrain import _core
from dtrain._elastic_run import (HostsUpdatedInterrupt, elastic_run, live_enabled,
                                 reformed_line, take_in_waiting)
from dtrain.tensorflow import collectives
from dtrain.tensorflow._library import session as _session
from dtrain.tensorflow.functions import (allgather_object, broadcast_object, broadcast_variables,
                                         model_variables)

__all__ = ["TensorFlowState", "TensorFlowKerasState", "run", "HostsUpdatedInterrupt",
           "generation", "step_shape"]

# How long a survivor waits for the launcher's word on a death the error did not name: it reaps
# a killed process a few milliseconds after the survivors' connections to it closed.
_LAUNCHER_WORD_WAIT = timedelta(seconds=2)

_S = TypeVar("_S", bound="TensorFlowState")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class TensorFlowState:
    """Variables and named numbers (epoch, batch, ...) that training resumes from. Set and read
    the numbers as attributes."""

    _names: list[str]  # of the numbers, in the order they were first set
    _explicit_variables: list[Any]

    def __init__(self, variables: Iterable[Any] | None = None, **numbers_: float) -> None:
        object.__setattr__(self, "_names", [])
        object.__setattr__(self, "_explicit_variables", list(variables or []))
        for name, value in numbers_.items():
            setattr(self, name, value)
        self._saved: tuple[list[NDArray[Any]], dict[str, Any]] | None = None
        self._commits = 0
        self._reset_callbacks: list[Callable[[], object]] = []

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """The numbers set as attributes (epoch, batch, ...)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in ("model", "optimizer"):
            if not isinstance(value, numbers.Number):
                raise TypeError(f"{type(self).__name__}.{name} = {value!r}: the state's "
                                f"attributes other than the model and optimizer must be numbers")
            if name not in self._names:
                self._names.append(name)
        object.__setattr__(self, name, value)

    def variables(self) -> list[Any]:
        return self._explicit_variables

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def _set_values(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def save(self) -> None:
        """The in-process copy that restore() returns to."""
        self._saved = ([np.array(v.numpy()) for v in self.variables()], self._values())

    def restore(self) -> None:
        """Back to the last commit (in this process)."""
        if self._saved is None:
            return
        arrays, values = self._saved
        for v, a in zip(self.variables(), arrays):
            v.assign(a)
        self._set_values(values)

    def commit(self) -> None:
        """Saves the state in this process and, under an elastic launcher, for a restarted job.
        Under `dtrain run --live`, ranks waiting to be taken in (replacements under --replace,
        ranks left out of a re-forming) are then taken in (HostsUpdatedInterrupt, which run()
        handles)."""
        self.save()
        self._commits += 1
        path = _commit_path(collectives.rank())
        if path is not None and self._saved is not None:
            arrays, values = self._saved
            tmp = f"{path}.tmp"
            with open(tmp, "wb") as f:
                np.savez(f, *arrays, _commits=self._commits, _names=np.array(list(values)),
                         _values=np.array([float(x) for x in values.values()]))
            os.replace(tmp, path)
        if live_enabled():
            take_in_waiting(collectives._admit_waiting,
                            lambda: int(_session.live_status()["original_rank"]), self._commits,
                            collectives.rank, collectives.size)

    def sync(self) -> None:
        """Collective: every rank takes the state of the lowest rank holding the newest commit
        (rank 0 at start; the rank that resumed a restarted job; after live recovery, a survivor
        that committed one step more than the others spares them that step)."""
        counts = allgather_object(self._commits, name="elastic.commits")
        root = counts.index(max(counts))
        broadcast_variables(self.variables(), root, name="elastic.sync")
        self._set_values(broadcast_object(self._values(), root, name="elastic.values"))
        self._commits = counts[root]
        self.save()

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Called after the state was restored from a commit, e.g. to scale the learning rate to
        the new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def _resume(self) -> bool:
        """Collective: loads the newest commit any rank holds on that rank. True if one was. A
        live replacement has none and takes the members' state in their sync() instead (they
        took it in at a commit)."""
        if live_enabled() and _session.live_status()["replacement"]:
            return False
        path = _commit_path(collectives.rank())
        mine = -1
        if path is not None and os.path.exists(path):
            with np.load(path) as f:
                mine = int(f["_commits"])
        every = allgather_object(mine, name="elastic.resume")
        best = max(every)
        if best < 0:
            return False
        if collectives.rank() == every.index(best) and path is not None:
            with np.load(path) as f:
                variables = self.variables()
                stored = len([k for k in f.files if k.startswith("arr_")])
                if stored != len(variables):
                    raise ValueError(
                        f"rank {collectives.rank()}: the commit {path} holds {stored} variables "
                        f"and this state has {len(variables)}: it was written by another model "
                        f"or optimizer; remove it (DTRAIN_COMMIT_DIR) to start afresh")
                for i, v in enumerate(variables):
                    v.assign(f[f"arr_{i}"])
                for name, value in zip(f["_names"], f["_values"]):
                    old = getattr(self, str(name), 0.0)
                    setattr(self, str(name), type(old)(value) if isinstance(old, int) else
                            float(value))
            self._commits = best
            print(f"rank {collectives.rank()}: resumed from commit {best} ({path})", flush=True)
        return True


class TensorFlowKerasState(TensorFlowState):
    """A Keras model, its optimizer and named numbers."""

    def __init__(self, model: Any, optimizer: Any = None, **numbers_: float) -> None:
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer or getattr(model, "optimizer", None))
        super().__init__(None, **numbers_)

    def variables(self) -> list[Any]:
        return model_variables(self.model, self.optimizer)


def _commit_path(rank: int) -> str | None:
    folder = os.environ.get("DTRAIN_COMMIT_DIR")
    if not folder:
        return None
    os.makedirs(os.path.join(folder, "tensorflow"), exist_ok=True)
    return os.path.join(folder, "tensorflow", f"rank{rank}.npz")


def generation() -> int:
    """The generation of the live world this process is in: 0 at start, one more at each
    re-forming and each taking in of replacements; the same on every member. What a per-sample
    log names the attempt by. 0 outside `dtrain run --live`."""
    return int(_session.live_status()["generation"]) if live_enabled() else 0


def step_shape(on_resize: str, batch_size: int, lr: float) -> tuple[int, float]:
    """The batch per rank and the learning rate for the world there is now, for a script that
    started with `batch_size` and `lr` (include/dtrain/step_shape.h): "keep-rank-batch" (the
    global batch follows the world), "scale-lr" (Horovod's elastic examples: the rate follows
    the world) or "keep-global-batch" (each rank's batch grows as the world shrinks). Call it in
    a reset callback."""
    at_start = (int(_session.live_status()["size_at_start"]) if live_enabled()
                else collectives.size())
    return _core.step_shape(on_resize, batch_size, lr, at_start, collectives.size())


def run(function: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Runs `function(state, ...)` from the newest commit of the job, if a restart left one,
    with every rank starting from the same state; under `dtrain run --live` it starts again
    among the survivors, from the last commit, when a rank dies (and with the replacements
    taken in, under --replace)."""
    return elastic_run(function, collectives, _recover, _close_live)


def _close_live() -> None:
    """Training is over: replacements still waiting have nothing to join."""
    if live_enabled():
        _session.live_close()


def _peer_lost(error: Exception) -> bool:
    """Whether `error` comes from a peer's death (or from the session's abort for one). A
    timeout alone is not: a slow or stopped rank is not left behind."""
    if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                          _core.PeerFailureError, _core.AbortedError)):
        return True  # dtrain's PeerFailureError and AbortedError, as the ops raise them
    if isinstance(error, (tf.errors.OpError, RuntimeError)):
        return bool(_session.live_ended(_LAUNCHER_WORD_WAIT))
    return False


def _recover(error: Exception, state: TensorFlowState) -> bool:
    """Live recovery: re-forms the job among the survivors after a peer's death."""
    if not live_enabled() or not _peer_lost(error):
        return False
    me = int(_session.live_status()["original_rank"])
    first = (str(error).splitlines() or [type(error).__name__])[0]
    print(f"rank {me} at start: {first}", flush=True)
    start = time.monotonic()
    reformed = collectives._reform()
    if reformed["rejoined"]:
        # Left out (it came after the others closed the list) and taken in again at their
        # commit: its own commits are stale, never the ones to go on from.
        state._commits = -1
    print(reformed_line(me, list(reformed["lost"]), bool(reformed["rejoined"]),
                        time.monotonic() - start, collectives.rank(), collectives.size()),
          flush=True)
    return True
