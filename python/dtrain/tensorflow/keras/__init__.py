"""Horovod's Keras API on dtrain (``import dtrain.tensorflow.keras as hvd``): the collectives of
dtrain.tensorflow, DistributedOptimizer for Keras 3 optimizers and for Keras 2's (tf_keras, which
tf.keras is under TF_USE_LEGACY_KERAS=1, as Horovod's own scripts need on TensorFlow 2.16 and
later), and the callbacks (``hvd.callbacks.BroadcastGlobalVariablesCallback``,
``MetricAverageCallback``, ``LearningRateWarmupCallback``, ``LearningRateScheduleCallback``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from dtrain.tensorflow import (  # noqa: F401
    Average, Compression, Max, Min, Product, Sum, SyncBatchNormalization, allgather,
    allgather_object, allreduce, alltoall, broadcast, broadcast_global_variables,
    broadcast_object, broadcast_variables, cross_rank, cross_size, grouped_allreduce, init,
    is_initialized, join, local_rank, local_size, rank, reducescatter, shutdown, size)
from dtrain.tensorflow.gradient_aggregation import LocalAggregation
from dtrain.tensorflow.gradient_tape import local_variables_of
from dtrain.tensorflow.gradients import GradientReducer
from dtrain.tensorflow.compression import Compressor
from dtrain.tensorflow.keras import callbacks, elastic  # noqa: F401

__all__ = [
    "Average", "Compression", "Max", "Min", "Product", "Sum", "SyncBatchNormalization",
    "allgather", "allgather_object", "allreduce", "alltoall", "broadcast",
    "broadcast_global_variables", "broadcast_object", "broadcast_variables", "cross_rank",
    "cross_size", "grouped_allreduce", "init", "is_initialized", "join", "local_rank",
    "local_size", "rank", "reducescatter", "shutdown", "size",
    "DistributedOptimizer", "PartialDistributedOptimizer", "callbacks", "elastic",
]

if TYPE_CHECKING:
    from keras.optimizers import Optimizer as _Optimizer
else:  # at run time the wrapped optimizer's class follows in the MRO
    _Optimizer = object


class _Distributed(_Optimizer):
    """Mixed in before a Keras 3 optimizer's class. Keras clips the gradients just before it
    updates the variables (_clip_gradients), at every step or, with gradient accumulation, at
    every N-th step on the accumulated ones: that is where Horovod all-reduces them (before
    clipping), so the hook sits there. _backend_apply_gradients tells it which variables the
    gradients are for."""

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> Any:
        self._dtrain_variables = list(trainable_variables)
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads: Any) -> Any:
        grads = list(grads)
        if self.gradient_accumulation_steps and not self._dtrain_average_aggregated:
            # Keras averages the accumulated gradients; Horovod's default sums them.
            steps = self.gradient_accumulation_steps
            grads = [g if g is None else g * tf.cast(steps, g.dtype) for g in grads]
        grads = self._dtrain_reducer(grads, self._dtrain_variables)
        return super()._clip_gradients(grads)

    def register_local_var(self, var: Any) -> None:
        """`var`'s gradient stays on this rank (a model-parallel part, say)."""
        self._dtrain_reducer.register_local(var)


class _DistributedKeras2(_Optimizer):
    """Mixed in before a Keras 2 (tf_keras) optimizer's class, new or legacy: apply_gradients
    (which minimize() and model.fit call) all-reduces the gradients first, unless
    _compute_gradients, Horovod's hook, already did. With backward_passes_per_step N > 1 the
    gradients are aggregated locally and applied every N-th step (gradient_aggregation.py); the
    other steps only count themselves in `iterations`."""

    def _dtrain_reduce(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        if self._agg_helper is None:
            return self._dtrain_reducer(grads, variables)
        return self._agg_helper(grads, variables, self._dtrain_reducer)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: tf.GradientTape | None = None) -> list[tuple[Any, Any]]:
        var_list = list(var_list)
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        grads = tape.gradient(loss, var_list, grad_loss)
        self._dtrain_reduced = True
        return list(zip(self._dtrain_reduce(grads, var_list), var_list))

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        if not getattr(self, "_dtrain_reduced", False):
            pairs = list(zip(self._dtrain_reduce([g for g, _ in pairs], variables), variables))
        self._dtrain_reduced = False
        apply = super().apply_gradients
        if self._agg_helper is None:
            return apply(pairs, *args, **kwargs)
        # The slots exist before the branch (no variable may be made inside one).
        if hasattr(self, "_create_all_weights"):
            self._create_all_weights(variables)
        elif not getattr(self, "built", True):
            self.build(variables)

        def apply_now() -> None:
            apply(pairs, *args, **kwargs)

        def count_only() -> None:
            self.iterations.assign_add(1)

        return tf.cond(self._agg_helper.applies_now(), apply_now, count_only)

    def register_local_var(self, var: Any) -> None:
        """`var`'s gradient stays on this rank (a model-parallel part, say)."""
        self._dtrain_reducer.register_local(var)


def _keras2(optimizer: Any) -> bool:
    """Whether `optimizer` is a Keras 2 (tf_keras) optimizer."""
    return type(optimizer).__module__.split(".")[0] == "tf_keras" or any(
        c.__module__.split(".")[0] == "tf_keras" for c in type(optimizer).__mro__)


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, op: int = Average,
                         gradient_predivide_factor: float = 1.0, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: object = None,
                         scale_local_gradients: bool = True) -> Any:
    """A copy of the Keras `optimizer` (same class, same configuration) whose gradients are
    all-reduced across ranks before they are applied."""
    if process_set is not None:
        raise ValueError("DistributedOptimizer: process sets are not supported by "
                         "dtrain.tensorflow; every call spans the whole job")
    keras2 = _keras2(optimizer)
    if not keras2 and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer: {type(optimizer).__name__} is not a Keras "
                         f"optimizer; for tf.compat.v1 optimizers use "
                         f"dtrain.tensorflow.DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError(f"DistributedOptimizer: backward_passes_per_step must be at least 1, "
                         f"not {backward_passes_per_step}")
    base = type(optimizer)
    cls: Any = type(base.__name__, (_DistributedKeras2 if keras2 else _Distributed, base), {})
    config = optimizer.get_config()
    if backward_passes_per_step > 1 and not keras2:
        # Keras 3's own accumulation: the all-reduce then runs once per N steps
        # (_clip_gradients); Keras 2 aggregates in LocalAggregation.
        config["gradient_accumulation_steps"] = backward_passes_per_step
    distributed = cls.from_config(config)
    if keras2:
        distributed._agg_helper = None if backward_passes_per_step == 1 else LocalAggregation(
            backward_passes_per_step, average_aggregated_gradients, sparse_as_dense,
            f"{base.__name__}_aggregation")
    distributed._dtrain_average_aggregated = average_aggregated_gradients
    distributed._dtrain_variables = []
    distributed._dtrain_reducer = GradientReducer(
        name or f"DistributedOptimizer.{base.__name__}", compression, sparse_as_dense, op,
        gradient_predivide_factor, scale_local_gradients)
    return distributed


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None,
                                compression: type[Compressor] = Compression.none,
                                sparse_as_dense: bool = False, op: int = Average,
                                gradient_predivide_factor: float = 1.0,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, num_groups: int = 0,
                                groups: Any = None, process_set: object = None,
                                local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """A DistributedOptimizer that leaves the gradients of `local_layers` on this rank."""
    distributed = DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    for v in local_variables_of(local_layers):
        distributed.register_local_var(v)
    return distributed
