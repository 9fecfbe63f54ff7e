"""Horovod's Keras API on dtrain (``import dtrain.tensorflow.keras as hvd``): the collectives of
dtrain.tensorflow, DistributedOptimizer for Keras 3 optimizers, and the callbacks
(``hvd.callbacks.BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
``LearningRateWarmupCallback``, ``LearningRateScheduleCallback``)."""
import keras
import tensorflow as tf

from dtrain.tensorflow import (  # noqa: F401
    Average, Compression, Max, Min, Product, Sum, SyncBatchNormalization, allgather,
    allgather_object, allreduce, alltoall, broadcast, broadcast_global_variables,
    broadcast_object, broadcast_variables, cross_rank, cross_size, grouped_allreduce, init,
    is_initialized, join, local_rank, local_size, rank, reducescatter, shutdown, size)
from dtrain.tensorflow.gradient_tape import local_variables_of
from dtrain.tensorflow.gradients import GradientReducer
from dtrain.tensorflow.keras import callbacks, elastic  # noqa: F401


class _Distributed:
    """Mixed in before a Keras 3 optimizer's class. Keras clips the gradients just before it
    updates the variables (_clip_gradients), at every step or, with gradient accumulation, at
    every N-th step on the accumulated ones: that is where Horovod all-reduces them (before
    clipping), so the hook sits there. _backend_apply_gradients tells it which variables the
    gradients are for."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        self._dtrain_variables = list(trainable_variables)
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        grads = list(grads)
        if self.gradient_accumulation_steps and not self._dtrain_average_aggregated:
            # Keras averages the accumulated gradients; Horovod's default sums them.
            steps = self.gradient_accumulation_steps
            grads = [g if g is None else g * tf.cast(steps, g.dtype) for g in grads]
        grads = self._dtrain_reducer(grads, self._dtrain_variables)
        return super()._clip_gradients(grads)

    def register_local_var(self, var):
        """`var`'s gradient stays on this rank (a model-parallel part, say)."""
        self._dtrain_reducer.register_local(var)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, op=Average,
                         gradient_predivide_factor=1.0, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """A copy of the Keras `optimizer` (same class, same configuration) whose gradients are
    all-reduced across ranks before they are applied."""
    if process_set is not None:
        raise ValueError("DistributedOptimizer: process sets are not supported by "
                         "dtrain.tensorflow; every call spans the whole job")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer: {type(optimizer).__name__} is not a Keras "
                         f"optimizer; for tf.compat.v1 optimizers use "
                         f"dtrain.tensorflow.DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError(f"DistributedOptimizer: backward_passes_per_step must be at least 1, "
                         f"not {backward_passes_per_step}")
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {})
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        # Keras' own accumulation: the all-reduce then runs once per N steps (_clip_gradients).
        config["gradient_accumulation_steps"] = backward_passes_per_step
    distributed = cls.from_config(config)
    distributed._dtrain_average_aggregated = average_aggregated_gradients
    distributed._dtrain_variables = []
    distributed._dtrain_reducer = GradientReducer(
        name or f"DistributedOptimizer.{base.__name__}", compression, sparse_as_dense, op,
        gradient_predivide_factor, scale_local_gradients)
    return distributed


def PartialDistributedOptimizer(optimizer, name=None, compression=Compression.none,
                                sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                num_groups=0, groups=None, process_set=None, local_layers=None,
                                scale_local_gradients=True):
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
