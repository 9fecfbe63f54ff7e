"""Horovod's elastic Keras API (``hvd.elastic.KerasState``, ``@hvd.elastic.run`` and the state's
callbacks) on dtrain's elastic launcher: see dtrain.tensorflow.elastic."""
from __future__ import annotations

from typing import Any

import keras

from dtrain.tensorflow.elastic import (HostsUpdatedInterrupt, TensorFlowKerasState,  # noqa: F401
                                       generation, run, step_shape)

__all__ = ["KerasState", "run", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "HostsUpdatedInterrupt", "generation", "step_shape"]


class KerasState(TensorFlowKerasState):
    """A Keras model, its optimizer and named numbers (epoch, batch, ...)."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **numbers_: float) -> None:
        super().__init__(model, optimizer, **numbers_)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` batches and at the end of each epoch."""

    def __init__(self, state: TensorFlowKerasState, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches = 0

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches += 1
        if self.batches % self.batches_per_commit == 0:
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps state.batch at the next batch to train."""

    def __init__(self, state: TensorFlowKerasState) -> None:
        super().__init__()
        self.state = state

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps state.epoch at the next epoch to train."""

    def __init__(self, state: TensorFlowKerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.epoch = epoch + 1
