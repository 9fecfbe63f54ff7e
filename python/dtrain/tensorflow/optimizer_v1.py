"""Horovod's DistributedOptimizer for TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer) and
BroadcastGlobalVariablesHook: the reference material's TF1-style training, in a tf.compat.v1
graph and session."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dtrain.tensorflow.collectives import Average
from dtrain.tensorflow.compression import Compression, Compressor
from dtrain.tensorflow.functions import broadcast_global_variables
from dtrain.tensorflow.gradient_aggregation import LocalAggregation
from dtrain.tensorflow.gradients import GradientReducer


class DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """Wraps a tf.compat.v1.train.Optimizer: compute_gradients() returns the gradients
    all-reduced across ranks. With backward_passes_per_step N > 1 they are aggregated locally
    (gradient_aggregation.py) and all-reduced every N-th call; apply_gradients() applies them
    then, and on the other calls only advances global_step."""

    def __init__(self, optimizer: Any, name: str | None = None, use_locking: bool = False,
                 compression: type[Compressor] = Compression.none,
                 sparse_as_dense: bool = False, op: int = Average,
                 gradient_predivide_factor: float = 1.0, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False,
                 scale_local_gradients: bool = True) -> None:
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = GradientReducer(name, compression, sparse_as_dense, op,
                                        gradient_predivide_factor, scale_local_gradients)
        self._aggregation = None if backward_passes_per_step == 1 else LocalAggregation(
            backward_passes_per_step, average_aggregated_gradients, sparse_as_dense,
            f"{name}_aggregation")

    def register_local_var(self, var: Any) -> None:
        self._reducer.register_local(var)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._aggregation is None:
            return list(zip(self._reducer(grads, variables), variables))
        return list(zip(self._aggregation(grads, variables, self._reducer), variables))

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        if self._aggregation is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        grads_and_vars = list(grads_and_vars)

        def apply() -> tf.Operation:
            return tf.group(self._optimizer.apply_gradients(grads_and_vars, global_step, name))

        def skip() -> tf.Operation:
            return tf.group(global_step.assign_add(1)) if global_step is not None else tf.no_op()

        return tf.cond(self._aggregation.applies_now(), apply, skip)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook that broadcasts rank `root_rank`'s global variables to every rank once
    the session is created (Horovod's sample uses it with MonitoredTrainingSession)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
