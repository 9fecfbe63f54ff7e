"""Horovod's Keras callbacks on dtrain, for the Keras tf.keras is: Keras 3, or Keras 2 (tf_keras)
under TF_USE_LEGACY_KERAS=1."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from dtrain.tensorflow.collectives import Average, allreduce, size
from dtrain.tensorflow.functions import broadcast_variables, model_variables


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Makes every rank start from rank `root_rank`'s model and optimizer state: after the first
    batch, when the optimizer's slots exist (its update used all-reduced gradients, so the ranks
    then agree)."""

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Iterable[Any] | None = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.local = {id(v) for v in local_variables or []}  # kept as each rank has them
        self.done = False

    def _shared(self, variables: Iterable[Any]) -> list[Any]:
        return [v for v in variables if id(v) not in self.local]

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        broadcast_variables(self._shared(self.model.variables), self.root_rank, name="initial")

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.done:
            return
        broadcast_variables(self._shared(model_variables(self.model)), self.root_rank,
                            name="first_batch")
        self.done = True


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Replaces each epoch's metrics by their average over the ranks; place it before the
    callbacks that read them (checkpoints, early stopping, learning-rate schedules)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        for key in sorted(logs):
            value = logs[key]
            if isinstance(value, (int, float, np.floating, np.integer)) or (
                    hasattr(value, "shape") and np.ndim(value) == 0):
                averaged = allreduce(tf.constant(float(value), tf.float64), op=Average,
                                     name=f"MetricAverageCallback.{key}")
                logs[key] = float(averaged.numpy())


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) from start_epoch to end_epoch;
    `staircase`: once per epoch, else at every batch with a fractional epoch."""

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier: Callable[[float], float] = (
            multiplier if callable(multiplier) else (lambda epoch: multiplier))
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch
        if self._in_range(epoch) and self.staircase:
            self._set(epoch)

    def on_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.staircase or not self._in_range(self.current_epoch):
            return
        steps = self.steps_per_epoch or self.params.get("steps")
        if not steps:
            raise ValueError("LearningRateScheduleCallback(staircase=False) needs "
                             "steps_per_epoch when the epoch's length is not known")
        self._set(self.current_epoch + batch / steps)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Goya et al.'s warmup: the learning rate grows from initial_lr / size to initial_lr over
    `warmup_epochs`, batch by batch, for large global batches."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.end_epoch is not None and epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"Epoch {epoch + 1}: finished the learning-rate warmup at "
                  f"{float(np.asarray(self.model.optimizer.learning_rate)):g}")
