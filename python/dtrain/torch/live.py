"""Live recovery for scripts on torch.distributed's backend ``"dtrain"``, under ``dtrain run
--live``: when a rank dies, the survivors make torch.distributed's world again among themselves
and go on, without restarting their processes.

    import dtrain.torch.live as live

    dist.init_process_group("dtrain")
    ddp = DistributedDataParallel(model)
    while step < steps:
        try:
            train_step(ddp)
        except Exception as error:          # torch.distributed.DistBackendError, ...
            if not live.peer_lost(error):
                raise
            live.reform()                   # the world again, among the survivors
            ddp = DistributedDataParallel(model)
            ...                             # agree on the state to go on from, redo the step

After ``reform()`` every rank of the new world has the rank ``dist.get_rank()`` gives (the
survivors keep their order; ``original_rank()`` is the one at start), and objects made on the old
world (DistributedDataParallel, groups from ``new_group``, a DeviceMesh) must be made again.

Under ``dtrain run --live --replace N`` the launcher starts a new worker in a dead one's place.
It calls ``join()`` instead of ``init_process_group`` (``replacement()`` says whether it is one),
which returns once the others took it in; they call ``waiting()`` at each step boundary and, when
it names newcomers, ``admit(newcomers)``. Both sides then share the state as after a re-forming.
Under ``dtrain run --live --spares K`` K workers start ahead of any failure with no rank of their
own (``spare()`` gives the number): each builds what it can before ``join()``, which waits until
the launcher gives it a dead worker's place (RANK and LOCAL_RANK are then the place's). Horovod's
API (``hvd.init()``, ``hvd.elastic.run`` and ``state.commit()``) does all of this by
itself.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from dtrain import _core, _torch
from dtrain._elastic_run import live_enabled, spare as spare_number, take_place
from dtrain.torch import backend as _backend

__all__ = ["Reformed", "admit", "close", "enabled", "generation", "join", "original_rank",
           "peer_lost", "reform", "replacement", "spare", "step_shape", "waiting"]

# How long peer_lost() waits for the launcher's word on a death: it reaps a killed process a few
# milliseconds after the survivors' connections to it closed.
_LAUNCHER_WORD_WAIT = timedelta(seconds=2)
# How long the survivors wait for a member neither here nor reported ended, and then for the
# members agreed on to connect the new world: one that does not (it died or stopped after the
# list was closed) is left out by agreeing again.
_SETTLE = timedelta(seconds=5)

_membership: _core.LiveMembership | None = None


@dataclass(frozen=True)
class Reformed:
    """The world after reform(), join() or admit()."""
    rank: int          # this process's rank in it
    size: int
    generation: int    # 0 at start, one more at each re-forming
    lost: list[int]    # the ranks at start left out this time
    seconds: float     # the agreement took
    joined: list[int] = field(default_factory=list)  # replacements taken in, by rank at start
    # This process was left out (it came after the others closed the list: stopped, slow or cut
    # off) and taken in again as a newcomer: its state is stale; it takes the members' as a
    # replacement does (they see it among `joined` of their admit()).
    rejoined: bool = False


def enabled() -> bool:
    """Whether the job runs under `dtrain run --live` (which keeps the survivors of a death)."""
    return live_enabled()


def _live_membership() -> _core.LiveMembership:
    global _membership
    if _membership is None:
        if not enabled():
            raise RuntimeError("dtrain.torch.live: live recovery needs the job to run under "
                               "`dtrain run --live`, which keeps the survivors of a death and "
                               "hosts the store they agree through")
        # A replacement's returns once the live workers took it in (see join()).
        _membership = _core.LiveMembership(settle=_SETTLE)
        if spare() and not _membership.too_late:
            take_place(_core.launcher_identity())
    return _membership


def generation() -> int:
    """The generation of the world this process is in: 0 at start, one more at each re-forming
    and each taking in of replacements; the same on every member (a replacement is in the
    generation that took it in). What a per-sample log names the attempt by, so that a step
    redone after a re-forming supersedes its earlier lines. 0 outside `dtrain run --live`."""
    return _live_membership().generation if enabled() else 0


def replacement() -> bool:
    """Whether this process was started in a dead worker's place (`dtrain run --live --replace`):
    it joins the others with join() and takes the training state from them."""
    return enabled() and os.environ.get("DTRAIN_LIVE_REPLACEMENT", "0") not in ("", "0")


def spare() -> int:
    """This process's number as a spare (`dtrain run --live --spares K`), 0 otherwise. A spare is
    a replacement started ahead: join() first waits for the place its launcher gives it."""
    return spare_number() if enabled() else 0


def original_rank() -> int:
    """This process's rank when the job started (the rank of later worlds may be another)."""
    return _live_membership().original_rank if enabled() else dist.get_rank()


def step_shape(on_resize: str, batch_size: int, lr: float) -> tuple[int, float]:
    """The batch per rank and the learning rate for the world there is now, for a script that
    started with `batch_size` and `lr` (include/dtrain/step_shape.h): "keep-rank-batch"
    (torchft's way: the global batch follows the world), "scale-lr" (Horovod's elastic examples:
    the rate follows the world) or "keep-global-batch" (each rank's batch grows as the world
    shrinks). Call it after reform(), join() or admit(), or in hvd.elastic's reset callback."""
    at_start = _live_membership().size_at_start if enabled() else dist.get_world_size()
    return _core.step_shape(on_resize, batch_size, lr, at_start, dist.get_world_size())


def peer_lost(error: BaseException) -> bool:
    """Whether `error` comes from a peer's death (or from the group's abort for one): what
    reform() recovers from. A timeout alone is not: a slow or stopped rank is not left behind.
    False outside `dtrain run --live`."""
    if not enabled():
        return False
    if isinstance(error, (_core.PeerFailureError, _core.AbortedError)):
        return True
    # torch raises DistBackendError with dtrain's text, and autograd a RuntimeError for a hook
    # that failed (a DistributedOptimizer's): the launcher says whether a member died.
    if isinstance(error, RuntimeError):
        return bool(_live_membership().ended(_LAUNCHER_WORD_WAIT))
    return False


def reform() -> Reformed:
    """Collective among the survivors: aborts this rank's world, agrees on who goes on and
    initializes torch.distributed again among them (backend "dtrain", the timeout the script gave
    init_process_group). Raises dtrain.TimeoutError when the survivors do not agree in time."""
    membership = _live_membership()
    world = _backend.backend_of()
    if world is not None:
        _torch.abort_backend(world, "the group is being re-formed after a member's failure")
    if dist.is_initialized():
        dist.destroy_process_group()
    start = time.monotonic()
    joined = membership.next()
    lost = list(joined["lost"])
    rejoined = [joined["rejoined"]]
    place = _form(membership, joined["rank"], joined["size"], lost, [], rejoined)
    return Reformed(rank=place[0], size=place[1], generation=membership.generation, lost=lost,
                    seconds=time.monotonic() - start, rejoined=rejoined[0])


def join() -> Reformed | None:
    """For a replacement: waits until the live workers take it in, then initializes
    torch.distributed in their world (its rank at start keeps its place). None when they ended
    training first: the process has nothing to do."""
    if not replacement():
        raise RuntimeError("dtrain.torch.live.join(): this process is not a replacement (it was "
                           "not started by `dtrain run --live --replace`)")
    start = time.monotonic()
    membership = _live_membership()  # returns once taken in (or too late)
    if membership.too_late:
        return None
    lost: list[int] = []
    joined = [membership.original_rank]
    place = _form(membership, membership.rank, len(membership.members), lost, joined)
    return Reformed(rank=place[0], size=place[1], generation=membership.generation, lost=lost,
                    seconds=time.monotonic() - start, joined=joined)


def waiting() -> list[int]:
    """Collective among the members, at a step boundary: the ranks at start whose replacements
    wait to be taken in (rank 0 looks in the store at most every 100 ms and tells the others).
    [] at once, with nothing sent, while no rank is missing."""
    if not enabled():
        return []
    membership = _live_membership()
    missing = membership.missing()
    if not missing:
        return []
    flags = torch.zeros(len(missing), dtype=torch.int64)
    if dist.get_rank() == 0:
        found = set(membership.waiting())
        flags = torch.tensor([1 if r in found else 0 for r in missing], dtype=torch.int64)
    dist.broadcast(flags, src=0)
    return [r for r, flag in zip(missing, flags.tolist()) if flag]


def admit(joiners: list[int]) -> Reformed:
    """Collective among the members, each with waiting()'s list: the next generation takes the
    replacements in, and torch.distributed is initialized again with them."""
    membership = _live_membership()
    if dist.is_initialized():
        dist.destroy_process_group()
    start = time.monotonic()
    taken = membership.admit(joiners)
    lost: list[int] = []
    joined = list(joiners)
    place = _form(membership, taken["rank"], taken["size"], lost, joined)
    return Reformed(rank=place[0], size=place[1], generation=membership.generation, lost=lost,
                    seconds=time.monotonic() - start, joined=joined)


def _form(membership: _core.LiveMembership, rank: int, size: int, lost: list[int],
          joined: list[int], rejoined: list[bool] | None = None) -> tuple[int, int]:
    """Initializes torch.distributed for the membership's newest generation, this process
    being `rank` of `size` (LiveMembership.form agrees again while a member does not come).
    Returns the rank and size it ended with; the members lost meanwhile are added to `lost` and
    taken out of `joined`, and `rejoined[0]` is set when this process was left out and taken in
    again meanwhile."""
    def make(rank: int, size: int) -> None:
        try:
            _init_generation(membership, rank, size)
        except BaseException:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
    formed = membership.form(rank, size, make)
    lost += formed["lost"]
    joined[:] = [m for m in joined if m not in formed["lost"]]
    if rejoined is not None and formed["rejoined"]:
        rejoined[0] = True
    return formed["rank"], formed["size"]


def _init_generation(membership: _core.LiveMembership, rank: int, size: int) -> None:
    """torch.distributed's world of the membership's generation (its own store prefix)."""
    identity = _core.launcher_identity()
    store = dist.TCPStore(identity["master_addr"], identity["master_port"], is_master=False,
                          timeout=timedelta(seconds=60))
    prefix = dist.PrefixStore(f"dtrain/live/g{membership.generation}/torch/", store)
    timeout = _backend._world_timeout
    if membership.generation > 0:
        _backend._connect_within = _SETTLE
    try:
        dist.init_process_group(_backend.BACKEND, store=prefix, rank=rank, world_size=size,
                                timeout=timeout if timeout > timedelta(0) else None)
    finally:
        _backend._connect_within = timedelta(0)


def close() -> None:
    """Training is over: replacements still waiting are told so (any member may call it)."""
    if enabled():
        _live_membership().close()


# How long a spare waits for the others on its host to warm their memory before it skips its own.
_WARM_LOCK_SECONDS = 60.0


def _warm_spare(parameters: Iterable[torch.Tensor]) -> None:
    """A spare about to wait for its place touches and frees, for each parameter in host memory,
    four tensors of its size: what its gradient, the optimizer state it will receive and its
    first whole commit (parameter and state) take, for an optimizer keeping one tensor per
    parameter such as SGD's momentum. `dtrain run`'s jemalloc keeps freed pages
    (dirty_decay_ms:-1) and gives them to the next tensors of those sizes (each its own: it
    does not split a much larger free extent for a small request), which then find memory
    already faulted in, where faulting it in would hold up the others in the steps that take
    the spare in. Under another allocator it costs only time in which the spare waits.

    Not when it would leave less than a quarter of the machine's memory available: the spares
    of a host warm one at a time (a lock file), each seeing what the others took. A spare given
    its place meanwhile warms without waiting any longer for the lock, whose holder (another
    spare, at the idle CPU priority) may get no CPU at all while the workers train: the others
    train without it until it joins, but would wait for it in every one of its first steps."""
    on_host = [p for p in parameters if p.device.type == "cpu"]
    need = 4 * sum(p.numel() * p.element_size() for p in on_host)
    if need == 0:
        return
    path = os.path.join(tempfile.gettempdir(), f"dtrain-warm-spares-{os.getuid()}.lock")
    try:
        lock = open(path, "a")
    except OSError:
        return  # nowhere to agree with the other spares: not worth the risk to the host's memory
    with lock:
        deadline = time.monotonic() + _WARM_LOCK_SECONDS
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if _core.spare_place_given(spare()):
                    break
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if _available_memory() - need < total // 4:
            return
        warm = [torch.ones_like(p) for p in on_host for _ in range(4)]
        del warm


def _available_memory() -> int:
    """The kernel's estimate of the memory available to a new allocation (0 where unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
