"""The ``torch.distributed`` backend ``"dtrain"``: dtrain's native process group under PyTorch.

Importing ``dtrain.torch`` registers the backend; a script written for torchrun and gloo changes
one word::

    import torch.distributed as dist
    import dtrain.torch  # noqa: F401
    dist.init_process_group("dtrain")          # was "gloo"
    model = torch.nn.parallel.DistributedDataParallel(model)

and runs under ``dtrain run -n 2 -- python3 train.py`` (or torchrun, mpirun with the torch
variables set, srun). Every collective and point-to-point operation of torch 1.13's
ProcessGroup is served, ``recv`` from any source included. Errors arrive as ``RuntimeError`` with
dtrain's full text: this rank, the peer and its address, the operation and its sequence number,
the time waited against the limit.

The group's timeout is the one given to ``init_process_group``; torch's default of 30 minutes
means dtrain's default instead (``DTRAIN_TIMEOUT``, 300 s), so a dead peer is named in minutes,
not half an hour. ``DTRAIN_*`` variables (transport, algorithm, logging) keep their meaning.
"""

import atexit as _atexit
import os as _os
from datetime import timedelta

import torch.distributed as _dist

from dtrain import _torch

BACKEND = "dtrain"

ProcessGroup = _torch.ProcessGroup

# torch.distributed's default timeout: a script that does not pass one gets dtrain's.
_TORCH_DEFAULT_TIMEOUT = timedelta(minutes=30)


def _create(options, pg_options=None):
    """The backend's creator, called by torch on each member of a new group."""
    timeout = options.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if timeout == _TORCH_DEFAULT_TIMEOUT:
        timeout = timedelta(0)  # dtrain's default (DTRAIN_TIMEOUT)
    group_id = str(options.group_id)
    if group_id in ("", "0"):
        name = "world"
    else:  # errors then say "collective #3 of group 1[0,2]": torch's group name, global ranks
        name = f"{group_id}[{','.join(map(str, options.global_ranks_in_group))}]"
    return _torch.ProcessGroup(options.store, options.group_rank, options.group_size, timeout,
                               name)


def _adopt_launcher_variables():
    """Under mpirun, srun or a Kubernetes Indexed Job, torch's env:// finds no RANK or
    WORLD_SIZE: fill them (and LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, unless
    set) from that launcher's own variables, as dtrain's C++ programs read them. Under dtrain run
    and torchrun nothing changes."""
    if "RANK" in _os.environ and "WORLD_SIZE" in _os.environ:
        return
    identity = _torch.launcher_identity()
    if identity["source"] in ("single", "torchrun", "options"):
        return
    for var, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
                     ("LOCAL_WORLD_SIZE", "local_world_size"), ("MASTER_ADDR", "master_addr"),
                     ("MASTER_PORT", "master_port")):
        _os.environ.setdefault(var, str(identity[key]))


_adopt_launcher_variables()

# Before the interpreter finalizes, let the backend's threads finish running futures' Python
# callbacks: Python ends a thread that asks for the GIL after that, which aborts the process.
_atexit.register(_torch._quiesce)

if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create, extended_api=True)
