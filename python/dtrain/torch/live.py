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
Horovod's API (``hvd.elastic.run``) does all of this by itself.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from dtrain import _core, _torch
from dtrain.torch import backend as _backend

__all__ = ["Reformed", "enabled", "original_rank", "peer_lost", "reform"]

# How long peer_lost() waits for the launcher's word on a death: it reaps a killed process a few
# milliseconds after the survivors' connections to it closed.
_LAUNCHER_WORD_WAIT = timedelta(seconds=2)

_membership: _core.LiveMembership | None = None


@dataclass(frozen=True)
class Reformed:
    """The world after reform()."""
    rank: int          # this process's rank in it
    size: int
    generation: int    # 0 at start, one more at each re-forming
    lost: list[int]    # the ranks at start left out this time
    seconds: float     # the agreement took


def enabled() -> bool:
    """Whether the job runs under `dtrain run --live` (which keeps the survivors of a death)."""
    return os.environ.get("DTRAIN_LIVE", "0") not in ("", "0")


def _live_membership() -> _core.LiveMembership:
    global _membership
    if _membership is None:
        if not enabled():
            raise RuntimeError("dtrain.torch.live: live recovery needs the job to run under "
                               "`dtrain run --live`, which keeps the survivors of a death and "
                               "hosts the store they agree through")
        _membership = _core.LiveMembership()
    return _membership


def original_rank() -> int:
    """This process's rank when the job started (the rank of later worlds may be another)."""
    return _live_membership().original_rank if enabled() else dist.get_rank()


def peer_lost(error: BaseException) -> bool:
    """Whether `error` comes from a peer's death (or from the group's abort for one): what
    reform() recovers from. A timeout alone is not: a slow or stopped rank is not left behind.
    False outside `dtrain run --live`."""
    if not enabled():
        return False
    if isinstance(error, (_core.PeerFailureError, _core.AbortedError)):
        return True
    # torch raises DistBackendError with dtrain's text; the launcher says whether a member died.
    if isinstance(error, dist.DistError):
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
    joined = membership.next()
    identity = _core.launcher_identity()
    store = dist.TCPStore(identity["master_addr"], identity["master_port"], is_master=False,
                          timeout=timedelta(seconds=60))
    prefix = dist.PrefixStore(f"dtrain/live/g{membership.generation}/torch/", store)
    timeout = _backend._world_timeout
    dist.init_process_group(_backend.BACKEND, store=prefix, rank=joined["rank"],
                            world_size=joined["size"],
                            timeout=timeout if timeout > timedelta(0) else None)
    return Reformed(rank=joined["rank"], size=joined["size"], generation=membership.generation,
                    lost=list(joined["lost"]), seconds=joined["seconds"])
