"""Horovod's TensorFlow collectives (``hvd.init``, ``hvd.allreduce``, ...) on dtrain.

Every collective is a TensorFlow op (``DtrainAllreduce``, ``DtrainAllgather``, ``DtrainBroadcast``,
``DtrainAlltoall``, ``DtrainJoin``) whose kernel hands the tensor to dtrain's C++ coordinator and
finishes when the coordinator is done with it, so the ops work eagerly and inside
``tf.function``, where TensorFlow runs them concurrently. The coordinator matches the ranks'
calls by name (the op's node name in a graph, or ``name=``), fuses the all-reduces and runs every
call in one order on every rank. Calls that differ between ranks (shape, dtype, op, root) fail
on every rank with ``tf.errors.FailedPreconditionError`` naming each rank's call, and the next
calls go on; a rank's own wrong argument raises ``tf.errors.InvalidArgumentError``.

Ops: ``Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product``. ``Adasum`` and process
sets are not implemented and say so.
"""
from __future__ import annotations

import atexit
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

import tensorflow as tf

from dtrain import _core
from dtrain._elastic_run import live_enabled, spare, take_place
from dtrain._horovod_settings import session_settings
from dtrain.tensorflow._library import ops as _ops, session as _session
from dtrain.tensorflow.compression import Compression, Compressor

if TYPE_CHECKING:
    from dtrain._core import LauncherIdentity

_P = ParamSpec("_P")
_R = TypeVar("_R")

# Horovod's values, so that code passing the numbers keeps working.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OPS = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

# Horovod's process sets are not supported: every call spans the whole job. Passing this one (or
# None) is accepted, as Horovod's default.
global_process_set = None

_identity: LauncherIdentity | None = None


def _whole_job(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Refuses a process_set other than the whole job's, instead of silently ignoring it."""
    @functools.wraps(function)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if kwargs.get("process_set") is not None:
            raise ValueError(f"{function.__name__}: process sets are not supported by "
                             f"dtrain.tensorflow; every call spans the whole job")
        return function(*args, **kwargs)
    return checked


def init(comm: object = None, process_sets: object = None) -> None:
    """Joins the job: rank and size come from whichever launcher started this process (dtrain
    run, torchrun, mpirun, srun); a process started alone is a world of one. Calling it again
    does nothing. Collective: every rank calls it. Under `dtrain run --live` it joins the live
    world (hvd.elastic.run re-forms it when a rank dies); a replacement for a dead worker
    (`--live --replace`) returns once the others took it in, a spare (`--live --spares K`) once
    it was given a dead worker's place and taken in; either exits the process (status 0) when
    training ended first."""
    global _identity
    if comm is not None or process_sets is not None:
        raise ValueError("dtrain.tensorflow.init(): comm and process_sets are not supported; "
                         "every process of the job takes part")
    if _session.is_initialized():
        return
    _identity = _core.launcher_identity()
    if not _session.init(None, *session_settings(), live=live_enabled()):
        if spare():
            print(f"spare {spare()}: training ended without needing it; nothing to do",
                  flush=True)
        else:
            print(f"rank {_session.live_status()['original_rank']} at start, a replacement: "
                  f"training ended before the others could take it in; nothing to do", flush=True)
        raise SystemExit(0)
    if spare():  # its place is known only now
        _identity = _core.launcher_identity()
        take_place(_identity)


def _reform() -> dict[str, Any]:
    """Live recovery (hvd.elastic.run, under `dtrain run --live`): aborts the session and its
    group, agrees with the survivors on who goes on and opens the session among them (the ops
    use it from their next call). Collective among the survivors; _session.reform()'s dict."""
    return _session.reform()


def _admit_waiting() -> list[int]:
    """At a step boundary under `dtrain run --live --replace` (a state's commit() calls it):
    replacements waiting to take dead ranks' places are taken in, and the session is opened
    again with them. Collective. Their ranks at start ([] at once while no rank is missing)."""
    grown = _session.admit_waiting()
    return list(grown["joined"]) if grown is not None else []


def shutdown() -> None:
    """Stops the session (collective); init() may be called again afterwards."""
    _session.shutdown()


atexit.register(shutdown)


def is_initialized() -> bool:
    return _session.is_initialized()


def rank() -> int:
    return _session.rank()


def size() -> int:
    return _session.size()


def _launcher(key: Literal["local_rank", "local_world_size", "node_rank"]) -> int:
    if not _session.is_initialized():
        raise ValueError("dtrain.tensorflow has not been initialized; call "
                         "dtrain.tensorflow.init() (as hvd.init()) first")
    assert _identity is not None  # init() sets it before it opens the session
    return _identity[key]


def local_rank() -> int:
    return _launcher("local_rank")


def local_size() -> int:
    return _launcher("local_world_size")


def cross_rank() -> int:
    """The index of this process's node."""
    return _launcher("node_rank")


def cross_size() -> int:
    """The number of nodes (processes per node being equal, as launchers start them)."""
    return max(1, size() // max(1, local_size()))


def is_homogeneous() -> bool:
    return True


# As ops, read when they run, as Horovod's: live recovery changes rank and size under a graph
# traced before it.
def rank_op(process_set_id: int = 0) -> tf.Tensor:
    return _ops.dtrain_rank()


def size_op(process_set_id: int = 0) -> tf.Tensor:
    return _ops.dtrain_size()


def local_rank_op() -> tf.Tensor:
    return tf.constant(local_rank(), dtype=tf.int32)


def local_size_op() -> tf.Tensor:
    return tf.constant(local_size(), dtype=tf.int32)


def _false() -> bool:
    return False


mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = _false
nccl_built = ddl_built = ccl_built = cuda_built = rocm_built = _false


def _op_of(op: int | None, average: bool | None = None) -> int:
    """Horovod's op argument (and its deprecated `average`), as dtrain's code."""
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: give op or average (deprecated), not both")
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by dtrain.tensorflow; use Average "
                                  "or Sum")
    if op not in _OPS:
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, Sum, Min, Max or "
                         f"Product")
    return op


def _scaled(tensor: tf.Tensor, factor: float | tf.Tensor) -> tf.Tensor:
    """Horovod's scaling: integers in double precision and truncated back, halves in float.
    `factor` may be a tensor (one computed from size_op())."""
    if isinstance(factor, (int, float)) and factor == 1.0:
        return tensor
    dtype = tensor.dtype
    if dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * tf.cast(factor, tf.float64), dtype)
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(tensor, tf.float32) * tf.cast(factor, tf.float32), dtype)
    return tensor * tf.cast(factor, dtype)


def _allreduce(tensor: tf.Tensor, op: int = Average, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, name: str | None = None) -> tf.Tensor:
    """The all-reduce op itself on a dense tensor, scaled before and after."""
    reduced = _ops.dtrain_allreduce(_scaled(tensor, prescale_factor),
                                    reduce_op=_session.reduce_op(_OPS[op]),
                                    tensor_name=name or "")
    return _scaled(reduced, postscale_factor)


@_whole_job
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: object = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Every rank's `tensor` reduced with `op` (Average by default). A tf.IndexedSlices (a sparse
    gradient) is allgathered, values and indices, instead: its average divides the values."""
    code = _op_of(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if code not in (Sum, Average):
            raise NotImplementedError("only Sum and Average are supported with tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("prescale_factor and postscale_factor are not supported "
                                      "with tf.IndexedSlices")
        values = allgather(tensor.values, name=name and f"{name}.values")
        indices = allgather(tensor.indices, name=name and f"{name}.indices")
        if code == Average:
            values = values / tf.cast(size_op(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, code, prescale_factor, postscale_factor, name)
    return compression.decompress(reduced, ctx)


@_whole_job
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: str | None = None, process_set: object = global_process_set,
                      ignore_name_scope: bool = False) -> list[Any]:
    """allreduce of each tensor; the coordinator fuses them into as few all-reduces as fit."""
    return [allreduce(t, average=average, compression=compression, op=op,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      name=name and f"{name}.{i}")
            for i, t in enumerate(tensors)]


@tf.RegisterGradient("DtrainAllreduce")
def _allreduce_grad(op: tf.Operation, grad: tf.Tensor) -> tf.Tensor:
    code = op.get_attr("reduce_op")
    if code not in (_session.reduce_op("sum"), _session.reduce_op("avg")):
        raise NotImplementedError("the gradient of an all-reduce is defined for Sum and Average "
                                  "only")
    return _ops.dtrain_allreduce(grad, reduce_op=code)


@_whole_job
def reducescatter(tensor: Any, device_dense: str = "",
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  name: str | None = None, process_set: object = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Every rank's `tensor` (the same shape on every rank) reduced with `op` (Average or Sum);
    this rank's part of dimension 0: equal parts, one more row for each of the first
    rows % size ranks."""
    code = _op_of(op)
    if code not in (Average, Sum):
        raise NotImplementedError("reducescatter supports Average and Sum")
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _ops.dtrain_reducescatter(_scaled(compressed, prescale_factor),
                                        reduce_op=_session.reduce_op(_OPS[code]),
                                        tensor_name=name or "")
    return compression.decompress(_scaled(reduced, postscale_factor), ctx)


@_whole_job
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          name: str | None = None, process_set: object = global_process_set,
                          ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    return [reducescatter(t, compression=compression, op=op, name=name and f"{name}.{i}",
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)
            for i, t in enumerate(tensors)]


@tf.RegisterGradient("DtrainReducescatter")
def _reducescatter_grad(op: tf.Operation, grad: tf.Tensor) -> tf.Tensor:
    # Horovod's: this rank's part of the gradient gathered back, times the ranks for a sum.
    if op.get_attr("reduce_op") == _session.reduce_op("sum"):
        grad = grad * tf.cast(size_op(), grad.dtype)
    return _ops.dtrain_allgather(grad)


@_whole_job
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: object = global_process_set) -> tf.Tensor:
    """Every rank's `tensor` concatenated along dimension 0, whose size may differ between
    ranks (the other dimensions may not)."""
    return _ops.dtrain_allgather(tensor, tensor_name=name or "")


@_whole_job
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: object = global_process_set) -> list[tf.Tensor]:
    return [allgather(t, name=name and f"{name}.{i}") for i, t in enumerate(tensors)]


@tf.RegisterGradient("DtrainAllgather")
def _allgather_grad(op: tf.Operation, grad: tf.Tensor) -> tf.Tensor:
    # Every rank's gradient of the whole result, averaged; this rank's rows of it.
    grad = _ops.dtrain_allreduce(grad, reduce_op=_session.reduce_op("avg"))
    rows = tf.reshape(tf.shape(op.inputs[0], out_type=tf.int64)[0:1], [1])
    every = _ops.dtrain_allgather(rows)
    me = rank_op()
    first = tf.reduce_sum(every[:me])
    return grad[first:first + every[me]]


@_whole_job
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,
              process_set: object = global_process_set) -> tf.Tensor:
    """Rank `root_rank`'s `tensor`, on every rank."""
    return _ops.dtrain_broadcast(tensor, root_rank=root_rank, tensor_name=name or "")


@tf.RegisterGradient("DtrainBroadcast")
def _broadcast_grad(op: tf.Operation, grad: tf.Tensor) -> tf.Tensor:
    reduced = _ops.dtrain_allreduce(grad, reduce_op=_session.reduce_op("avg"))
    return reduced if rank() == op.get_attr("root_rank") else reduced * 0


@_whole_job
def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: object = global_process_set) -> list[Any]:
    """Assigns rank `root_rank`'s values to `variables` on every rank; returns the assigned
    values (in a TF1 graph: tensors that do the assignment when evaluated)."""
    return [v.assign(broadcast(v, root_rank, name=name and f"{name}.{i}"))
            for i, v in enumerate(variables)]


@_whole_job
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: object = global_process_set) -> Any:
    """Sends splits[j] rows of `tensor` to rank j (equal parts when splits is None); returns
    what arrived, in rank order, and (when splits were given, as Horovod's) how many rows came
    from each rank."""
    given = splits is not None
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int32) if given else \
        tf.zeros([0], dtype=tf.int32)  # the kernel splits equally
    output, received = _ops.dtrain_alltoall(tensor, splits, tensor_name=name or "")
    return (output, received) if given else output


@tf.RegisterGradient("DtrainAlltoall")
def _alltoall_grad(op: tf.Operation, grad: tf.Tensor,
                   grad_received_splits: tf.Tensor) -> list[tf.Tensor | None]:
    # The rows go back where they came from.
    back, _ = _ops.dtrain_alltoall(grad, op.outputs[1])
    return [back, None]


def join() -> tf.Tensor:
    """This rank has run out of data: it takes part in the others' all-reduces with zeros until
    every rank has joined. Returns the rank that joined last (an int32 tensor, as Horovod's)."""
    return _ops.dtrain_join()


def barrier(process_set: object = global_process_set) -> None:
    """Returns once every rank has called it."""
    allreduce(tf.zeros([1]), op=Sum, name="dtrain.barrier")
