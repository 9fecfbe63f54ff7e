"""Horovod's TensorFlow 2 API on dtrain: ``import dtrain.tensorflow as hvd`` in place of
``import horovod.tensorflow as hvd``, and ``dtrain.tensorflow.keras`` in place of
``horovod.tensorflow.keras``.

The collectives are TensorFlow ops on dtrain's C++ coordinator (see collectives.py), usable
eagerly and inside ``tf.function``, with Horovod's gradients. Needs the TensorFlow release this
dtrain was built against (``pip install '.[tensorflow]'``); ``import dtrain`` and ``import
dtrain.torch`` never import TensorFlow.
"""
from dtrain.tensorflow.collectives import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                           allgather, allreduce, alltoall, barrier, broadcast,
                                           broadcast_, ccl_built, cross_rank, cross_size,
                                           cuda_built, ddl_built, gloo_built, gloo_enabled,
                                           global_process_set, grouped_allgather,
                                           grouped_allreduce, init, is_homogeneous,
                                           is_initialized, join, local_rank, local_rank_op,
                                           local_size, local_size_op, mpi_built, mpi_enabled,
                                           mpi_threads_supported, nccl_built, rank, rank_op,
                                           rocm_built, shutdown, size, size_op)
from dtrain.tensorflow.compression import Compression  # noqa: F401
from dtrain.tensorflow.functions import (allgather_object, broadcast_object,  # noqa: F401
                                         broadcast_object_fn, broadcast_variables)
from dtrain.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401


def DistributedOptimizer(optimizer, *args, **kwargs):
    """A Keras optimizer whose gradients are all-reduced across ranks before they are applied
    (see dtrain.tensorflow.keras.DistributedOptimizer)."""
    from dtrain.tensorflow import keras as _keras
    return _keras.DistributedOptimizer(optimizer, *args, **kwargs)
