"""dtrain for PyTorch 2.x: the ``torch.distributed`` backend ``"dtrain"``, and Horovod's API.

The backend (see :mod:`dtrain.torch.backend`) is found by torch through its entry point, and
registered by importing this module::

    import torch.distributed as dist
    dist.init_process_group("dtrain")          # was "gloo"

It is also a drop-in for ``horovod.torch``: a Horovod script changes its import line only::

    import dtrain.torch as hvd                 # was: import horovod.torch as hvd
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

and runs under ``dtrain run -n 4 -- python3 train.py`` (or mpirun, srun, torchrun). Gradients
are negotiated, fused and reduced by dtrain's C++ coordinator, the engine of its C++
DistributedOptimizer; errors arrive as exceptions with dtrain's full text. docs/pytorch.md lists
what is supported and how it differs from Horovod.

``CheckpointManager`` and ``DistributedSampler`` bring dtrain's exact resume (atomic,
CRC-checked checkpoints in the C++ format; mid-epoch, on any number of ranks) to Python.
Under ``dtrain run --live`` a job goes on without a rank that died: ``hvd.elastic.run`` by
itself, a torch.distributed script through :mod:`dtrain.torch.live`.
"""

from dtrain.torch import _torch_version

__all__ = [
    "BACKEND", "backend_of", "register",
    "Adasum", "Average", "Max", "Min", "Product", "Sum",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "global_process_set",
    "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "join", "poll", "sparse_allreduce_async", "synchronize",
    "ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
    "Checkpoint", "CheckpointManager", "DistributedSampler", "Compression", "elastic",
    "live", "comm_hooks",
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "DistributedOptimizer", "ProgressReporter", "announce_resumed",
]

_torch_version.check()  # before the extension loads: a clear error for another torch or Python

from dtrain.torch.backend import BACKEND, backend_of, register  # noqa: E402
from dtrain.torch.collectives import (Adasum, Average, Max, Min, Product, Sum, allgather,
                                      allgather_async, allreduce, allreduce_, allreduce_async,
                                      allreduce_async_, alltoall, alltoall_async, barrier,
                                      broadcast, broadcast_, broadcast_async, broadcast_async_,
                                      ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                      global_process_set, grouped_allgather,
                                      grouped_allgather_async, grouped_allreduce,
                                      grouped_allreduce_, grouped_allreduce_async,
                                      grouped_allreduce_async_, gloo_built, gloo_enabled, init,
                                      is_initialized, join, local_rank, local_size, mpi_built,
                                      mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                                      rocm_built, shutdown, size, sparse_allreduce_async,
                                      synchronize)
from dtrain.torch.checkpoint import Checkpoint, CheckpointManager, DistributedSampler
from dtrain.torch.compression import Compression
from dtrain.torch import comm_hooks, elastic, live
from dtrain.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                    broadcast_parameters)
from dtrain.torch.optimizer import DistributedOptimizer
from dtrain._torch import ProgressReporter  # steps for `dtrain run --metrics-port`
from dtrain._torch import announce_resumed  # where a resumed job started, for `dtrain run`

register()
