"""Horovod's @hvd.elastic.run, one for every framework's Horovod API (dtrain.torch.elastic,
dtrain.tensorflow.elastic): the function starts from the newest commit a restart left, if any,
with every rank holding the same state; with live recovery it starts again among the survivors
when a peer dies."""
import functools
import os
from collections.abc import Callable, Mapping
from typing import Concatenate, ParamSpec, Protocol, TypeVar, cast


class ElasticState(Protocol):
    """What run() needs of a state (TorchState, TensorFlowState)."""
    _reset_callbacks: list[Callable[[], object]]

    def _resume(self) -> bool: ...

    def sync(self) -> None: ...

    def restore(self) -> None: ...


class Collectives(Protocol):
    """What run() needs of a Horovod API module (dtrain.torch, dtrain.tensorflow)."""

    def init(self) -> None: ...

    def is_initialized(self) -> bool: ...


def live_enabled() -> bool:
    """Whether the job runs under `dtrain run --live` (which keeps the survivors of a death)."""
    return os.environ.get("DTRAIN_LIVE", "0") not in ("", "0")


def spare() -> int:
    """This process's number as a spare (`dtrain run --live --spares K`: a replacement started
    ahead, which waits for the place its launcher gives it when a worker dies), 0 otherwise."""
    if os.environ.get("DTRAIN_LIVE_REPLACEMENT", "0") in ("", "0"):
        return 0
    return int(os.environ.get("DTRAIN_LIVE_SPARE", "") or 0)


def take_place(identity: Mapping[str, object]) -> None:
    """A spare given its place: the place's RANK and LOCAL_RANK, which dtrain set in the C
    environment, for Python's readers too (os.environ is a copy made at start)."""
    os.environ["RANK"] = str(identity["rank"])
    os.environ["LOCAL_RANK"] = str(identity["local_rank"])


def reformed_line(me: int, lost: list[int], rejoined: bool, seconds: float, rank: int,
                  size: int) -> str:
    """What a rank says after live recovery re-formed the job (`me`: its rank at start)."""
    if rejoined:
        return (f"rank {me} at start: left out of the re-formed job and taken in again in "
                f"{seconds:.2f} s; now rank {rank} of {size}, going on from the others' commit "
                "(--live)")
    return (f"rank {me} at start: the job re-formed without rank(s) {lost} at start in "
            f"{seconds:.2f} s; now rank {rank} of {size}, going on from the last commit (--live)")


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by a state's commit() when the job took in new workers (replacements for dead
    ones): the function starts again from that commit, synced with them, as Horovod's does."""


def take_in_waiting(admit: Callable[[], list[int]], original_rank: Callable[[], int],
                    commit: int, rank: Callable[[], int], size: Callable[[], int]) -> None:
    """At a state's commit under `dtrain run --live`: `admit()` takes in the ranks waiting to
    join (and returns them; [] at once while nobody waits). When it took some, says so and
    raises HostsUpdatedInterrupt, on which run() syncs the state with them."""
    joined = admit()
    if joined:
        print(f"rank {original_rank()} at start: took in rank(s) {joined} at start at commit "
              f"{commit}; now rank {rank()} of {size()} (--live)", flush=True)
        raise HostsUpdatedInterrupt(f"rank(s) {joined} at start taken in")


S = TypeVar("S", bound=ElasticState)
P = ParamSpec("P")
R = TypeVar("R")


def elastic_run(function: Callable[Concatenate[S, P], R], collectives: Collectives,
                recover: Callable[[Exception, S], bool] | None = None,
                finished: Callable[[], object] | None = None
                ) -> Callable[Concatenate[S, P], R]:
    """`function(state, ...)` after `collectives.init()`, the state's resume (collective: the
    newest commit any rank holds) and sync; the reset callbacks run after a resume.

    `recover(error, state)`, where given, is live recovery: for an error it recovers from (a peer
    died) it re-forms the job among the survivors and returns True; the state then goes back to its
    last commit, is synced (from the newest commit any survivor holds), the reset callbacks run
    and `function` starts again, as Horovod's elastic run does after a HorovodInternalError.
    After a HostsUpdatedInterrupt (newcomers taken in at a commit) the same, from that commit.
    `finished()`, where given, is called once `function` returned (live recovery: replacements
    still waiting have nothing to join)."""
    @functools.wraps(function)
    def wrapper(state: S, *args: P.args, **kwargs: P.kwargs) -> R:
        if not collectives.is_initialized():
            collectives.init()
        reset = state._resume()
        while True:
            try:
                state.sync()
                if reset:
                    for callback in state._reset_callbacks:
                        callback()
                result = function(state, *args, **kwargs)
                break
            except HostsUpdatedInterrupt:
                reset = True  # the state is the commit just made: sync it with the newcomers
            except Exception as error:
                if recover is None or not recover(error, state):
                    raise
                state.restore()
                reset = True
        if finished is not None:
            finished()
        return result
    # `state` may also be passed by name, which Concatenate cannot say.
    return cast(Callable[Concatenate[S, P], R], wrapper)
