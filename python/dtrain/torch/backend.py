"""The ``torch.distributed`` backend ``"dtrain"``: dtrain's native process group under PyTorch.

A script written for torchrun and gloo changes one word::

    import torch.distributed as dist
    dist.init_process_group("dtrain")          # was "gloo"
    model = torch.nn.parallel.DistributedDataParallel(model)

and runs under ``dtrain run -n 2 -- python train.py`` (or torchrun, mpirun, srun). Installed
with pip, torch finds the backend through its entry point (``torch.distributed.backends``);
``import dtrain.torch`` registers it as well. It is a ``c10d::Backend`` for the devices cpu and
cuda, so every operation torch 2.x's ProcessGroup sends reaches it: collectives, point to point
(``recv`` from any source included), the coalesced forms that DTensor and FSDP2 use, the
coalescing manager. A failed operation raises ``torch.distributed.DistBackendError`` with
dtrain's full text: this rank, the peer and its address, the operation and its sequence number,
the time waited against the limit.

The group's timeout is the one given to ``init_process_group``; torch's default (10 or 30
minutes) means dtrain's default instead (``DTRAIN_TIMEOUT``, 300 s), so a dead peer is named in
minutes, not half an hour. A group made later without a timeout of its own (``new_group``, a
``DeviceMesh``) takes the one given to ``init_process_group``. ``DTRAIN_*`` variables
(transport, algorithm, logging) keep their meaning.
"""

from __future__ import annotations

import atexit as _atexit
import importlib as _importlib
import os as _os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as _dist

from dtrain import _core, _torch

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend, _DistributedBackendOptions

BACKEND = "dtrain"
DEVICES = ("cpu", "cuda")

# torch.distributed's default timeouts (10 minutes for NCCL-style groups, 30 for the others): a
# script that does not pass one gets dtrain's.
_TORCH_DEFAULT_TIMEOUTS = (timedelta(minutes=10), timedelta(minutes=30))


# The timeout the script gave init_process_group (0: none, dtrain's default). Groups made later
# without one of their own (new_group, DeviceMesh, FSDP2 and DTensor through it) take it: a script
# that asks for 10 s expects a mesh whose ranks disagree to fail in 10 s, not in torch's 30 min.
_world_timeout = timedelta(0)

# While dtrain.torch.live makes a later generation's world: how long its members may take to
# connect (they announced themselves a moment ago; one that does not come died or stopped since).
_connect_within = timedelta(0)


def _create(options: _DistributedBackendOptions, backend_options: object = None) -> Backend:
    """The backend's creator, called by torch on each member of a new group."""
    global _world_timeout
    timeout: Any = options.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    own = timeout not in _TORCH_DEFAULT_TIMEOUTS
    group_id = str(options.group_id)
    name: str | None = None  # the world: named as C++ names it
    if group_id in ("", "0"):
        _world_timeout = timeout if own else timedelta(0)
    else:  # errors then say "collective #3 of group 1[0,2]": torch's group name, global ranks
        name = f"{group_id}[{','.join(map(str, options.global_ranks_in_group))}]"
    if not own:
        timeout = _world_timeout
    return _torch.create_backend(options.store, options.group_rank, options.group_size, timeout,
                                 name, _connect_within if name is None else timedelta(0))


def backend_of(group: _dist.ProcessGroup | None = None) -> Backend | None:
    """The dtrain backend under ``group`` (torch's ProcessGroup; default the world), or None
    when the group has another backend or torch.distributed is not initialized."""
    if not _dist.is_initialized():
        return None
    group = group if group is not None else _dist.group.WORLD
    if group is None:
        return None
    import torch
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if _torch.is_dtrain_backend(backend) else None


def _adopt_launcher_variables() -> None:
    """Under mpirun, srun or a Kubernetes Indexed Job, torch's env:// finds no RANK or
    WORLD_SIZE: fill them (and LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, unless
    set) from that launcher's own variables, as dtrain's C++ programs read them. Under dtrain run
    and torchrun nothing changes."""
    if "RANK" in _os.environ and "WORLD_SIZE" in _os.environ:
        return
    identity: Mapping[str, object] = _core.launcher_identity()
    if identity["source"] in ("single", "torchrun", "options"):
        return
    for var, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
                     ("LOCAL_WORLD_SIZE", "local_world_size"), ("MASTER_ADDR", "master_addr"),
                     ("MASTER_PORT", "master_port")):
        _os.environ.setdefault(var, str(identity[key]))


def _wrap_env_rendezvous() -> None:
    """Reads the launcher's variables when init_process_group("env://", the default) runs
    without rank and world size of its own, not at import: a program that passes them (the
    mp.spawn pattern) never depends on what its environment says."""
    # The module (torch.distributed.rendezvous is also the name of a function there).
    module = _importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict):
        return
    torch_env: Callable[..., Any] | None = handlers.get("env")
    if torch_env is None or getattr(torch_env, "_dtrain", False):
        return

    def env_handler(url: str, **kwargs: Any) -> Any:
        query = parse_qs(urlparse(url).query)
        if "rank" not in query or "world_size" not in query:
            _adopt_launcher_variables()
        return torch_env(url, **kwargs)

    env_handler._dtrain = True  # type: ignore[attr-defined]
    handlers["env"] = env_handler


def register() -> None:
    """Registers the backend with torch.distributed (idempotent). torch calls it through the
    entry point ``torch.distributed.backends``; ``import dtrain.torch`` calls it too."""
    _wrap_env_rendezvous()
    if BACKEND.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=list(DEVICES))


# Before the interpreter finalizes, let the backend's threads finish running futures' Python
# callbacks: Python ends a thread that asks for the GIL after that, which aborts the process.
_atexit.register(_torch._quiesce)
