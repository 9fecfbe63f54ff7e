"""Horovod's TensorFlow 2 API on dtrain: ``import dtrain.tensorflow as hvd`` in place of
``import horovod.tensorflow as hvd``, and ``dtrain.tensorflow.keras`` in place of
``horovod.tensorflow.keras``.

The collectives are TensorFlow ops on dtrain's C++ coordinator (see collectives.py), usable
eagerly and inside ``tf.function``, with Horovod's gradients. Needs the TensorFlow release this
dtrain was built against (``pip install '.[tensorflow]'``); ``import dtrain`` and ``import
dtrain.torch`` never import TensorFlow.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dtrain.tensorflow.collectives import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier, broadcast,
    broadcast_, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    global_process_set, grouped_allgather, grouped_allreduce, grouped_reducescatter, init,
    is_homogeneous, is_initialized, join, local_rank, local_rank_op, local_size, local_size_op,
    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rank_op, reducescatter,
    rocm_built, shutdown, size, size_op)
from dtrain.tensorflow import elastic  # noqa: F401
from dtrain.tensorflow.compression import Compression, Compressor
from dtrain.tensorflow.functions import (allgather_object, broadcast_global_variables,  # noqa: F401
                                         broadcast_object, broadcast_object_fn,
                                         broadcast_variables)
from dtrain.tensorflow.gradient_tape import (DistributedGradientTape,  # noqa: F401
                                             PartialDistributedGradientTape)
from dtrain.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401

__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "rank_op", "size_op", "local_rank_op",
    "local_size_op", "global_process_set",
    "allgather", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "reducescatter",
    "ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
    "elastic", "Compression", "allgather_object", "broadcast_global_variables",
    "broadcast_object", "broadcast_object_fn", "broadcast_variables",
    "DistributedGradientTape", "PartialDistributedGradientTape", "SyncBatchNormalization",
    "DistributedOptimizer", "BroadcastGlobalVariablesHook",
]


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: object = None,
                         scale_local_gradients: bool = True) -> Any:
    """An optimizer whose gradients are all-reduced across ranks before they are applied: a
    Keras optimizer (see dtrain.tensorflow.keras.DistributedOptimizer), or a
    tf.compat.v1.train.Optimizer in a TF1 graph."""
    if process_set is not None:
        raise ValueError("DistributedOptimizer: process sets are not supported by "
                         "dtrain.tensorflow; every call spans the whole job")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from dtrain.tensorflow.optimizer_v1 import DistributedOptimizerV1
        return DistributedOptimizerV1(
            optimizer, name, use_locking, compression, sparse_as_dense, op,
            gradient_predivide_factor, backward_passes_per_step, average_aggregated_gradients,
            scale_local_gradients)
    from dtrain.tensorflow import keras as _keras
    return _keras.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        scale_local_gradients=scale_local_gradients)


def BroadcastGlobalVariablesHook(root_rank: int, device: str = "") -> Any:
    """A tf.compat.v1 SessionRunHook that broadcasts the global variables from `root_rank` once
    the session is created."""
    from dtrain.tensorflow.optimizer_v1 import BroadcastGlobalVariablesHook as Hook
    return Hook(root_rank, device)
