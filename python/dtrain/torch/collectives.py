"""Horovod's collective API (``hvd.init``, ``hvd.allreduce``, ...) on dtrain.

``init()`` starts torch.distributed with the backend ``"dtrain"`` (unless the script already did)
and opens a session on that group. As in Horovod, the ranks agree on every call before its data
moves: calls that differ between ranks (shape, dtype, root, op, kind) fail on every rank with an
error naming each rank's call, and the session goes on. Blocking ``allreduce``, ``allgather``,
``broadcast`` and ``alltoall`` run on the calling thread with the GIL released, in call order.
Asynchronous calls (``allreduce_async_``, ``grouped_allreduce``, the DistributedOptimizer's
gradients, ``allgather_async``, ``broadcast_async``, ``alltoall_async``) go to dtrain's C++
coordinator, which matches them across ranks by name, fuses the all-reduces and runs every call
in one order everywhere.
Waits come back to Python every 100 ms, so Ctrl-C interrupts them.

Under ``dtrain run --live`` the session can be re-formed among the survivors when a rank dies
(``hvd.elastic.run`` does it): torch.distributed's world is made again with the ranks that are
left, each keeping its order (dtrain.torch.live), and a DistributedOptimizer's hooks move to the
new session.

Ops: ``Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product``. ``Adasum`` is not
implemented and says so.
"""
from __future__ import annotations

import atexit
import functools
import itertools
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

import torch
import torch.distributed as dist

from dtrain import _core, _torch
from dtrain._horovod_settings import session_settings
from dtrain.torch import live
from dtrain.torch.backend import BACKEND, backend_of
from dtrain.torch.compression import Compression, Compressor

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

_SLICE = timedelta(milliseconds=100)  # how often a wait lets Python look for Ctrl-C

# Horovod's process sets are not supported: every call spans the whole job. Passing this one (or
# None) is accepted, as Horovod's default.
global_process_set = None


def _whole_job(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Refuses a process_set other than the whole job's, instead of silently ignoring it."""
    @functools.wraps(function)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if kwargs.get("process_set") is not None:
            raise ValueError(f"{function.__name__}: process sets are not supported by "
                             f"dtrain.torch; every call spans the whole job (for sub-groups use "
                             f"torch.distributed.new_group with the backend 'dtrain')")
        return function(*args, **kwargs)
    return checked


class _Waitable(Protocol):
    """An operation in flight: _torch.AsyncAllreduce, _torch.AsyncCall, or _Every of them."""

    def wait_some(self, slice_: timedelta, /) -> bool: ...

    def done(self) -> bool: ...


# What synchronize() returns, from the operation and the handle's result.
_Finish = Callable[[Any, Any], Any]


class _Rebindable(Protocol):
    """What holds a session's resources and moves to the next one (DistributedOptimizer)."""

    def _rebind(self) -> None: ...


class _State:
    def __init__(self, session: _torch.Session, identity: LauncherIdentity) -> None:
        self.session = session
        self.identity = identity
        # What re-forming moves to the new session.
        self.rebindables: weakref.WeakSet[_Rebindable] = weakref.WeakSet()
        # handle -> (the operation, or None when done; result; finish)
        self.handles: dict[int, tuple[_Waitable | None, Any, _Finish | None]] = {}
        self.next_handle: Iterator[int] = itertools.count(1)
        self.names: Iterator[int] = itertools.count()


_state: _State | None = None
# A replacement's launcher identity between init() and its first need of the world (see init()).
_deferred: LauncherIdentity | None = None


def init(comm: object = None, process_sets: object = None) -> None:
    """Joins the job: this process's rank and size come from whichever launcher started it
    (dtrain run, torchrun, mpirun, srun); a process started alone is a world of one. Calling it
    again does nothing. Collective: every rank calls it. A replacement for a dead worker
    (`dtrain run --live --replace`) returns at once and asks the others to take it in when it
    first needs their world (its rank or the size, a collective, a DistributedOptimizer): they
    go on training meanwhile instead of waiting while it builds its model. A spare
    (`dtrain run --live --spares K`) returns at once too and, at that first need (local_rank()
    included), waits for the place its launcher gives it when a worker dies. Either exits the
    process (status 0) when training ended first."""
    global _state, _deferred
    if comm is not None or process_sets is not None:
        raise ValueError("dtrain.torch.init(): comm and process_sets are not supported; every "
                         "process of the job takes part (use torch.distributed.new_group with the "
                         "backend 'dtrain' for sub-groups)")
    if _state is not None or _deferred is not None:
        return
    identity = _core.launcher_identity()
    if live.replacement() and not dist.is_initialized():
        _deferred = identity
        return
    _start(identity)


def _start(identity: LauncherIdentity) -> None:
    """init()'s work: torch.distributed's world (a replacement's: the live workers', once they
    took it in) and the session on it."""
    global _state
    if live.replacement() and not dist.is_initialized():
        # Started in a dead worker's place (or ahead, as a spare): it joins the live workers'
        # world.
        if live.join() is None:
            if live.spare():
                print(f"spare {live.spare()}: training ended without needing it; nothing to do",
                      flush=True)
            else:
                print(f"rank {live.original_rank()} at start, a replacement: training ended "
                      f"before the others could take it in; nothing to do", flush=True)
            raise SystemExit(0)
        identity = _core.launcher_identity()  # a spare's place is known only now
    if not dist.is_initialized():
        if identity["source"] == "single" and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(BACKEND, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(BACKEND)
    group = backend_of()
    if group is None:
        raise RuntimeError(
            f"dtrain.torch.init(): torch.distributed was initialized with the backend "
            f"{dist.get_backend()!r}; Horovod's API on dtrain needs the backend 'dtrain': call "
            f"dist.init_process_group('dtrain') instead, or let init() do it")
    session = _torch.Session(group, *session_settings())
    _state = _State(session, identity)


def _admit_waiting() -> list[int]:
    """At a step boundary under `dtrain run --live --replace` (TorchState.commit() calls it):
    replacements waiting to take dead ranks' places are taken in, and the session is made again
    with them. Collective. Returns their ranks at start ([] at once while no rank is missing)."""
    state = _live()
    joiners = live.waiting()
    if not joiners:
        return []
    state.session.close()
    state.handles.clear()
    live.admit(joiners)
    _renew_session(state)
    return joiners


def _reform() -> live.Reformed:
    """Live recovery (hvd.elastic.run, under `dtrain run --live`): aborts this rank's group,
    makes torch.distributed's world again among the survivors (dtrain.torch.live.reform) and the
    session on it, and moves what held the old session to the new one. Collective among the
    survivors."""
    state = _live()
    world = backend_of()
    if world is not None:  # first, so that the coordinator's thread stops waiting on the group
        _torch.abort_backend(world, "the group is being re-formed after a member's failure")
    state.session.close()
    state.handles.clear()
    reformed = live.reform()
    _renew_session(state)
    return reformed


def _renew_session(state: _State) -> None:
    """The session on torch.distributed's new world, and what held the old one moved to it."""
    world = backend_of()
    assert world is not None
    state.session = _torch.Session(world, *session_settings())
    for holder in list(state.rebindables):
        holder._rebind()


def shutdown() -> None:
    """Stops the session (collective); init() may be called again afterwards. torch.distributed's
    group stays up until the process ends: the script may use it, and a second init() reuses it
    (a new env:// rendezvous on the same port could meet the old store)."""
    global _state, _deferred
    state, _state, _deferred = _state, None, None
    if state is not None:
        state.session.close()


atexit.register(shutdown)


def is_initialized() -> bool:
    return _state is not None or _deferred is not None


def _spare_waiting() -> bool:
    """A spare not yet in the world: its first need of it waits for a place."""
    return _state is None and _deferred is not None and live.spare() > 0


def _live() -> _State:
    global _deferred
    if _state is None and _deferred is not None:
        identity, _deferred = _deferred, None
        _start(identity)
    if _state is None:
        raise ValueError("dtrain.torch has not been initialized; call dtrain.torch.init() (as "
                         "hvd.init()) first")
    return _state


def _session() -> _torch.Session:
    return _live().session


def _identity(key: Literal["local_rank", "local_world_size", "node_rank"]) -> int:
    # The launcher's word, which a replacement has before it joins (to pick its device); a
    # spare's comes with its place, when it joins.
    if _deferred is not None and not live.spare():
        return _deferred[key]
    return _live().identity[key]


def rank() -> int:
    return _session().rank


def size() -> int:
    return _session().size


def local_rank() -> int:
    return _identity("local_rank")


def local_size() -> int:
    return _identity("local_world_size")


def cross_rank() -> int:
    """The index of this process's node."""
    return _identity("node_rank")


def cross_size() -> int:
    """The number of nodes (processes per node being equal, as launchers start them)."""
    return max(1, size() // max(1, local_size()))


def mpi_threads_supported() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """NCCL's version code (e.g. 23007 for 2.30.7) when this dtrain has the nccl backend
    (DTRAIN_BACKEND=nccl), else 0, as Horovod's."""
    return _torch.backend_version("nccl") or 0


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def cuda_built() -> bool:
    """Whether CUDA tensors can be passed (dtrain built with the CUDA toolkit)."""
    return _torch.cuda_built()


def rocm_built() -> bool:
    return False


def _op(op: int | None, average: bool | None) -> str:
    if average is not None:
        warnings.warn("the 'average' argument is deprecated (as in Horovod); pass op=Average or "
                      "op=Sum", DeprecationWarning, stacklevel=3)
        if op is not None:
            raise ValueError("give op or average, not both")
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not implemented by dtrain; use op=Average (the "
                                  "default) or op=Sum")
    if op not in _OPS:
        raise ValueError(f"unknown reduction op {op!r}; use Average, Sum, Min, Max or Product")
    return _OPS[op]


def _name(kind: str, name: str | None) -> str:
    return name if name is not None else f"{kind}.noname.{next(_live().names)}"


def _given(name: str | None) -> str:
    """A blocking call's name: the caller's, or "" (blocking calls match in call order)."""
    return "" if name is None else str(name)


def _new_handle(async_op: _Waitable | None, result: Any, finish: _Finish | None = None) -> int:
    state = _live()
    handle = next(state.next_handle)
    state.handles[handle] = (async_op, result, finish)
    return handle


def _wait(async_op: _Waitable) -> None:
    while not async_op.wait_some(_SLICE):
        pass


class _Every:
    """Waits for every call of a group."""
    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    def wait_some(self, slice_: timedelta, /) -> bool:
        return all(c.wait_some(slice_) for c in self.calls)

    def done(self) -> bool:
        return all(c.done() for c in self.calls)


def synchronize(handle: int) -> Any:
    """Waits for an asynchronous operation; returns its output."""
    state = _live()
    if handle not in state.handles:
        raise ValueError(f"handle {handle!r} is unknown or was already synchronized")
    async_op, result, finish = state.handles[handle]
    try:
        if async_op is not None:
            _wait(async_op)
    finally:
        if async_op is None or async_op.done():
            del state.handles[handle]
    return finish(async_op, result) if finish is not None else result


def poll(handle: int) -> bool:
    """True once the operation of `handle` finished (synchronize() then returns at once)."""
    state = _live()
    if handle not in state.handles:
        raise ValueError(f"handle {handle!r} is unknown or was already synchronized")
    async_op = state.handles[handle][0]
    return async_op is None or async_op.done()


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    # CUDA tensors go to the nccl backend, or through host memory on the native one; the
    # coordinator fuses them in host memory. Other devices have no path.
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"dtrain.torch: tensors on {tensor.device} are not supported: dtrain "
                         f"moves CPU and CUDA tensors; move it to one of those")
    return tensor


# --- all-reduce -----------------------------------------------------------------------------

@_whole_job
def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: object = None) -> int:
    """Queues an in-place all-reduce of `tensor` on the coordinator; returns a handle. Ranks
    match it by `name` (an automatic one when None, counted in call order)."""
    op_name = _op(op, average)
    session = _session()
    if not tensor.is_contiguous():
        raise ValueError("allreduce_async_: the tensor must be contiguous")
    async_op = session.allreduce_async_(_dense(tensor), _name("allreduce", name), op_name,
                                               float(prescale_factor), float(postscale_factor))
    return _new_handle(async_op, tensor)


@_whole_job
def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: object = None) -> int:
    """Like allreduce_async_, into a new tensor; `tensor` is left as it is."""
    output = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_async_(output, average, name, op, prescale_factor, postscale_factor)


@_whole_job
def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: object = None) -> torch.Tensor:
    """In place; returns `tensor`."""
    op_name = _op(op, average)
    target = tensor if tensor.is_contiguous() else tensor.contiguous()
    with torch.no_grad():
        _session().allreduce_(_dense(target), op_name, float(prescale_factor),
                              float(postscale_factor), _given(name))
        if target is not tensor:
            tensor.copy_(target)
    return tensor


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op_name: str, prescale: float, postscale: float,
                name: str) -> torch.Tensor:
        ctx.args = (op_name, prescale, postscale)
        output = tensor.detach().clone(memory_format=torch.contiguous_format)
        _session().allreduce_(_dense(output), op_name, prescale, postscale, name)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None,
                                                               None]:
        op_name, prescale, postscale = ctx.args
        grad = grad_output.detach().clone(memory_format=torch.contiguous_format)
        _session().allreduce_(grad, op_name, prescale, postscale)
        return grad, None, None, None, None


@_whole_job
def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: object = None) -> torch.Tensor:
    """The reduction of `tensor` over every rank, as a new tensor (differentiable)."""
    op_name = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, op_name, float(prescale_factor),
                               float(postscale_factor), _given(name))
    return compression.decompress(reduced, ctx)


@_whole_job
def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: object = None) -> int:
    """Queues in-place all-reduces of every tensor of the list together (fused by the
    coordinator); one handle, whose result is the list."""
    op_name = _op(op, average)
    session = _session()
    base = _name("grouped_allreduce", name)
    ops = []
    for i, t in enumerate(tensors):
        if not t.is_contiguous():
            raise ValueError(f"grouped_allreduce_async_: tensor {i} must be contiguous")
        ops.append(session.allreduce_async_(_dense(t), f"{base}.{i}", op_name,
                                            float(prescale_factor), float(postscale_factor)))
    return _new_handle(_Every(ops), list(tensors))


@_whole_job
def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: int | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: object = None) -> int:
    outputs = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_async_(outputs, average, name, op, prescale_factor,
                                    postscale_factor)


@_whole_job
def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: object = None) -> list[torch.Tensor]:
    reduced: list[torch.Tensor] = synchronize(grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor))
    return reduced


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: int, prescale: float, postscale: float, name: str | None,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale, postscale)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op, prescale,
                                                         postscale)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, prescale, postscale = ctx.args
        dense = [g.contiguous() for g in grads]
        reduced = synchronize(grouped_allreduce_async(dense, None, None, op, prescale, postscale))
        return (None, None, None, None, *reduced)


@_whole_job
def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: object = None) -> list[torch.Tensor]:
    """The reductions of a list of tensors, reduced together; new tensors (differentiable)."""
    code = {v: k for k, v in _OPS.items()}[_op(op, average)]
    compressed = [compression.compress(t) for t in tensors]
    outputs = _GroupedAllreduce.apply(code, float(prescale_factor), float(postscale_factor), name,
                                      *[c for c, _ in compressed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outputs, compressed)]


# --- allgather, broadcast, alltoall -----------------------------------------------------------

class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return _session().allgather(_dense(tensor.detach()), name).output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        # As Horovod: the average of every rank's gradient, then this rank's rows of it.
        grad = grad_output.detach().clone(memory_format=torch.contiguous_format)
        _session().allreduce_(grad, "avg", 1.0, 1.0)
        rows = _session().allgather(torch.tensor([ctx.rows], dtype=torch.int64)).output
        offset = int(rows[:rank()].sum())
        return grad.narrow(0, offset, ctx.rows), None


@_whole_job
def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: object = None) -> torch.Tensor:
    """Every rank's tensor concatenated along dimension 0, in rank order; the first dimension
    may differ between ranks (differentiable)."""
    gathered: torch.Tensor = _Allgather.apply(tensor, _given(name))
    return gathered


def _output(async_call: _torch.AsyncCall, _: object) -> torch.Tensor:
    return async_call.output


@_whole_job
def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: object = None) -> int:
    """Queues an allgather; synchronize(handle) returns the gathered tensor."""
    return _new_handle(_session().allgather(_dense(tensor.detach()), _name("allgather", name),
                                            True), None, _output)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # As allgather's: the average of every rank's gradients, then this rank's rows of each.
        dense = [g.contiguous() for g in grads]
        reduced = synchronize(grouped_allreduce_async(dense, op=Average))
        rows = _session().allgather(torch.tensor([ctx.rows], dtype=torch.int64)).output
        offsets = rows[:rank()].sum(dim=0).tolist()
        return (None, *[g.narrow(0, int(o), n)
                        for g, o, n in zip(reduced, offsets, ctx.rows)])


@_whole_job
def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: object = None) -> list[torch.Tensor]:
    """allgather of every tensor of the list; the gathered tensors, in the list's order
    (differentiable)."""
    return list(_GroupedAllgather.apply(name, *tensors))


@_whole_job
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: object = None) -> int:
    base = _name("grouped_allgather", name)
    calls = [_session().allgather(_dense(t.detach()), f"{base}.{i}", True)
             for i, t in enumerate(tensors)]
    return _new_handle(_Every(calls), None, lambda every, _: [c.output for c in every.calls])


@_whole_job
def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: object = None) -> torch.Tensor:
    """root_rank's tensor, in place on every rank; returns `tensor`."""
    target = tensor if tensor.is_contiguous() else tensor.contiguous()
    with torch.no_grad():
        _session().broadcast_(_dense(target), int(root_rank), _given(name))
        if target is not tensor:
            tensor.copy_(target)
    return tensor


def share_(tensors: Sequence[torch.Tensor], holders: Sequence[int]) -> None:
    """Collective, in place: the holders' tensors into every rank's, in pieces from each holder
    where that pays (several nodes; C++'s dtrain::share_tensors), else a broadcast from the
    first; every rank ends with the same bytes. Live recovery hands its state over this way."""
    dense = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    with torch.no_grad():
        _session().share_([_dense(t) for t in dense], sorted(int(h) for h in holders))
        for t, d in zip(tensors, dense):
            if d is not t:
                t.copy_(d)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str) -> torch.Tensor:
        ctx.root_rank = root_rank
        output = tensor.detach().clone(memory_format=torch.contiguous_format)
        _session().broadcast_(_dense(output), root_rank, name)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        # As Horovod: the average of every rank's gradient, on the root only.
        grad = grad_output.detach().clone(memory_format=torch.contiguous_format)
        _session().allreduce_(grad, "avg", 1.0, 1.0)
        if rank() != ctx.root_rank:
            grad.zero_()
        return grad, None, None


@_whole_job
def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: object = None) -> torch.Tensor:
    """root_rank's tensor, as a new tensor on every rank (differentiable)."""
    received: torch.Tensor = _Broadcast.apply(tensor, int(root_rank), _given(name))
    return received


@_whole_job
def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: object = None) -> int:
    """Queues an in-place broadcast; synchronize(handle) returns `tensor`."""
    if not tensor.is_contiguous():
        raise ValueError("broadcast_async_: the tensor must be contiguous")
    call = _session().broadcast_(_dense(tensor), int(root_rank), _name("broadcast", name), True)
    return _new_handle(call, tensor)


@_whole_job
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: object = None) -> int:
    """Like broadcast_async_, into a new tensor."""
    output = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(output, root_rank, name)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: list[int],
                name: str) -> tuple[torch.Tensor, torch.Tensor]:
        call = _session().alltoall(_dense(tensor.detach()), splits, name)
        ctx.received = call.received.tolist()
        ctx.mark_non_differentiable(call.received)
        return call.output, call.received

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, _: object) -> tuple[torch.Tensor, None, None]:
        grad = _session().alltoall(grad_output.contiguous(), ctx.received).output
        return grad, None, None


# Horovod's splits: row counts per rank, as a list or an integer tensor.
_Splits = Sequence[int] | torch.Tensor


def _splits(splits: _Splits | None) -> list[int]:
    """Horovod's splits: a list or an integer tensor of row counts, one per rank."""
    if splits is None:
        return []
    if torch.is_tensor(splits) and (splits.is_floating_point() or splits.is_complex()):
        raise ValueError(f"alltoall: splits must hold integers (int32 as in Horovod), not "
                         f"{splits.dtype}")
    values: list[int] = torch.as_tensor(splits).tolist()
    if not all(isinstance(v, int) for v in values):
        raise ValueError(f"alltoall: splits must be whole row counts, got {values}")
    return values


@overload
def alltoall(tensor: torch.Tensor, splits: None = None, name: str | None = None,
             process_set: object = None) -> torch.Tensor: ...


@overload
def alltoall(tensor: torch.Tensor, splits: _Splits, name: str | None = None,
             process_set: object = None) -> tuple[torch.Tensor, torch.Tensor]: ...


@_whole_job
def alltoall(tensor: torch.Tensor, splits: _Splits | None = None, name: str | None = None,
             process_set: object = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Slices of dimension 0 go to the ranks in order (splits[j] rows to rank j; equal slices
    when splits is None); returns what arrived, and with splits given also the rows received
    from each rank (as Horovod does)."""
    output, received = _Alltoall.apply(tensor, _splits(splits), _given(name))
    return output if splits is None else (output, received)


@_whole_job
def alltoall_async(tensor: torch.Tensor, splits: _Splits | None = None, name: str | None = None,
                   process_set: object = None) -> int:
    """Queues an alltoall; synchronize(handle) returns what alltoall would."""
    call = _session().alltoall(_dense(tensor.detach()), _splits(splits), _name("alltoall", name),
                               True)
    return _new_handle(call, None,
                       lambda c, _: c.output if splits is None else (c.output, c.received))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                           process_set: object = None) -> Callable[[], torch.Tensor]:
    """Reduces a sparse COO tensor by gathering every rank's indices and values (Horovod's
    sparse all-reduce); returns a function that waits and gives the coalesced sparse result."""
    op_name = _op(op, None)
    if op_name not in ("avg", "sum"):
        raise ValueError("sparse_allreduce_async: only Average and Sum reduce sparse tensors")
    t = tensor.coalesce()
    base = _name("sparse_allreduce", name)
    indices = _session().allgather(t.indices().t().contiguous(), f"{base}.indices", True)
    values = _session().allgather(t.values().contiguous(), f"{base}.values", True)
    every = _Every([indices, values])

    def result() -> torch.Tensor:
        _wait(every)
        gathered = values.output / size() if op_name == "avg" else values.output
        return torch.sparse_coo_tensor(indices.output.t(), gathered, t.shape).coalesce()
    return result


# --- synchronization --------------------------------------------------------------------------

@_whole_job
def barrier(process_set: object = None) -> None:
    _session().barrier()


def join(device: int = -1) -> int:
    """This rank has run out of data: it takes part in the other ranks' all-reduces (blocking,
    asynchronous and the DistributedOptimizer's) with zeros until every rank has joined; an
    Average divides by every rank, as in Horovod. Their other collectives fail, naming the
    joined ranks. Returns the rank that joined last (every rank gets the same answer)."""
    coordinated = _session().join()  # returns once every rank's blocking calls joined
    _wait(coordinated)
    return coordinated.last_joined()
