"""Horovod's Keras API on dtrain (``import dtrain.tensorflow.keras as hvd``): the collectives of
dtrain.tensorflow, DistributedOptimizer for Keras 3 optimizers, and the callbacks
(``hvd.callbacks.BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
``LearningRateWarmupCallback``, ``LearningRateScheduleCallback``)."""
import keras

from dtrain.tensorflow import (Average, Compression, Max, Min, Product, Sum, allgather,  # noqa: F401
                               allgather_object, allreduce, alltoall, broadcast,
                               broadcast_object, broadcast_variables, cross_rank, cross_size,
                               grouped_allreduce, init, is_initialized, join, local_rank,
                               local_size, rank, shutdown, size)
from dtrain.tensorflow.gradients import GradientReducer, names_of
from dtrain.tensorflow.keras import callbacks  # noqa: F401


class _Distributed:
    """Mixed in before a Keras optimizer's class: apply() (which apply_gradients and model.fit
    call) all-reduces the gradients first."""

    def apply(self, grads, trainable_variables=None):
        variables = trainable_variables if trainable_variables is not None else \
            self._trainable_variables
        grads = self._dtrain_reducer(list(grads), names_of(variables))
        return super().apply(grads, trainable_variables)


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
    if backward_passes_per_step != 1:
        raise NotImplementedError("DistributedOptimizer: backward_passes_per_step > 1 (local "
                                  "gradient aggregation) is not implemented by dtrain.tensorflow")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer: {type(optimizer).__name__} is not a Keras "
                         f"optimizer; for tf.compat.v1 optimizers use "
                         f"dtrain.tensorflow.DistributedOptimizer")
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {})
    distributed = cls.from_config(optimizer.get_config())
    distributed._dtrain_reducer = GradientReducer(
        name or f"DistributedOptimizer.{base.__name__}", compression, sparse_as_dense, op,
        gradient_predivide_factor)
    return distributed


def broadcast_global_variables(model, root_rank=0):
    """The model's and its optimizer's variables from `root_rank`, on every rank."""
    from dtrain.tensorflow.keras.callbacks import _model_variables
    broadcast_variables(_model_variables(model), root_rank)
