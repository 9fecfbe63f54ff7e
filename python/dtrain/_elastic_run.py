"""Horovod's @hvd.elastic.run, one for every framework's Horovod API (dtrain.torch.elastic,
dtrain.tensorflow.elastic): the function starts from the newest commit a restart left, if any,
with every rank holding the same state."""
import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar, cast


class ElasticState(Protocol):
    """What run() needs of a state (TorchState, TensorFlowState)."""
    _reset_callbacks: list[Callable[[], object]]

    def _resume(self) -> bool: ...

    def sync(self) -> None: ...


class Collectives(Protocol):
    """What run() needs of a Horovod API module (dtrain.torch, dtrain.tensorflow)."""

    def init(self) -> None: ...

    def is_initialized(self) -> bool: ...


S = TypeVar("S", bound=ElasticState)
P = ParamSpec("P")
R = TypeVar("R")


def elastic_run(function: Callable[Concatenate[S, P], R],
                collectives: Collectives) -> Callable[Concatenate[S, P], R]:
    """`function(state, ...)` after `collectives.init()`, the state's resume (collective: the
    newest commit any rank holds) and sync; the reset callbacks run after a resume."""
    @functools.wraps(function)
    def wrapper(state: S, *args: P.args, **kwargs: P.kwargs) -> R:
        if not collectives.is_initialized():
            collectives.init()
        resumed = state._resume()
        state.sync()
        if resumed:
            for callback in state._reset_callbacks:
                callback()
        return function(state, *args, **kwargs)
    # `state` may also be passed by name, which Concatenate cannot say.
    return cast(Callable[Concatenate[S, P], R], wrapper)
