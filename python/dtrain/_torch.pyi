"""dtrain._torch (src/python/torch): the torch.distributed backend "dtrain", the session under the
Horovod-compatible API, and the C++ checkpoints and sampler. Written by hand from the bindings;
tests/python/test_typing.py checks it against the module."""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypedDict

from torch import Tensor
from torch._C._distributed_c10d import Backend, Store
from typing_extensions import NotRequired

# Seconds as a number, or a timedelta (pybind11's conversion of std::chrono durations).
_Duration = timedelta | float
_Named = Sequence[tuple[str, Tensor]]

torch_built_for: str

# --- the backend (module.cc) ----------------------------------------------------------------

def create_backend(store: Store, rank: int, size: int, timeout: _Duration,
                   name: str = "world") -> Backend: ...
def is_dtrain_backend(backend: Backend) -> bool: ...
def _quiesce() -> None: ...

# --- the session under Horovod's API (module.cc) --------------------------------------------

class AsyncAllreduce:
    """An all-reduce queued on the coordinator (or a join)."""

    def wait_some(self, slice: _Duration) -> bool: ...
    def done(self) -> bool: ...
    @property
    def tensor(self) -> Tensor: ...
    def last_joined(self) -> int: ...

class AsyncCall:
    """An allgather, broadcast or alltoall: queued on the coordinator, or done (blocking)."""

    def wait_some(self, slice: _Duration) -> bool: ...
    def done(self) -> bool: ...
    @property
    def output(self) -> Tensor: ...
    @property
    def received(self) -> Tensor: ...

class GradientHooks:
    """Post hooks on the parameters' gradient accumulators that queue each gradient on the
    session's coordinator (DistributedOptimizer's engine)."""

    def submit_missing(self) -> None: ...
    def wait_some(self, slice: _Duration) -> bool: ...
    def pending(self) -> bool: ...
    def set_backward_passes_per_step(self, passes: int, /) -> None: ...
    def __len__(self) -> int: ...

class Session:
    """What hvd.init() sets up: a group for blocking collectives and a coordinator for named
    asynchronous all-reduces."""

    def __init__(self, group: Backend, cycle_time: _Duration, fusion_threshold: int,
                 stall_timeout: _Duration) -> None: ...
    def close(self) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def allreduce_(self, tensor: Tensor, op: str, prescale: float, postscale: float,
                   name: str = "") -> None: ...
    def broadcast_(self, tensor: Tensor, root: int, name: str = "",
                   async_op: bool = False) -> AsyncCall: ...
    def allgather(self, tensor: Tensor, name: str = "", async_op: bool = False) -> AsyncCall: ...
    def alltoall(self, tensor: Tensor, splits: Sequence[int], name: str = "",
                 async_op: bool = False) -> AsyncCall: ...
    def barrier(self) -> None: ...
    def allreduce_async_(self, tensor: Tensor, name: str, op: str, prescale: float,
                         postscale: float) -> AsyncAllreduce: ...
    def join(self) -> AsyncAllreduce: ...
    def gradient_hooks(self, named_parameters: _Named, compression: str, op: str,
                       backward_passes_per_step: int, prescale: float,
                       postscale: float) -> GradientHooks: ...

# --- checkpoints and the sampler (checkpoint_bindings.cc) -----------------------------------

class Progress(TypedDict):
    step: int
    epoch: int
    epoch_consumed: int
    epoch_size: int
    values: dict[str, float]

class LoadedCheckpoint(TypedDict):
    path: str
    step: int
    epoch: int
    epoch_consumed: int
    epoch_size: int
    world_size: int
    values: dict[str, float]
    skipped: list[str]
    # With an optimizer: its param_groups' hyper-parameters, and each parameter's state (None:
    # none), in group order.
    optimizer: NotRequired[tuple[list[dict[str, Any]], list[dict[str, Any] | None]]]

class Resumed(LoadedCheckpoint):
    kind: str
    root: int

class CheckpointStats(TypedDict):
    saves: int
    snapshot_ms: float
    blocked_ms: float
    write_ms: float
    bytes: int

class CheckpointManager:
    def __init__(self, dir: str, keep: int, writer_rank: int, async_write: bool,
                 write_timeout: _Duration, group: Backend | None) -> None: ...
    def save(self, parameters: _Named, buffers: _Named, optimizer_type: str,
             param_groups: list[dict[str, Any]], state: dict[Any, Any],
             progress: Progress) -> None: ...
    def load_latest(self, parameters: _Named, buffers: _Named, optimizer_type: str,
                    param_groups: list[dict[str, Any]]) -> LoadedCheckpoint | None: ...
    def wait(self) -> None: ...
    @property
    def dir(self) -> str: ...
    @property
    def is_writer(self) -> bool: ...
    def stats(self) -> CheckpointStats: ...

def commit_manager(group: Backend | None) -> CheckpointManager | None: ...
def resume_newest(sources: Sequence[tuple[CheckpointManager, str]], group: Backend | None,
                  parameters: _Named, buffers: _Named, optimizer_type: str,
                  param_groups: list[dict[str, Any]]) -> Resumed | None: ...

class DistributedSampler:
    def __init__(self, dataset_size: int, num_replicas: int, rank: int, shuffle: bool,
                 seed: int, drop_last: bool) -> None: ...
    def set_epoch(self, epoch: int, consumed: int = 0) -> None: ...
    @property
    def epoch(self) -> int: ...
    def consumed(self, trained: int) -> int: ...
    def indices(self) -> list[int]: ...
    @property
    def num_samples(self) -> int: ...

# --- progress reports (progress_binding.h: this extension's own copy) ----------------------

class ProgressReporter:
    """Reports each training step to `dtrain run --metrics-port`; does nothing outside one."""

    def __init__(self, rank: int, interval: _Duration = ...) -> None: ...
    def step(self, step: int, samples: int) -> None: ...
    @property
    def active(self) -> bool: ...

def announce_resumed(rank: int, what: str) -> None: ...
