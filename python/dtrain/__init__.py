"""dtrain: distributed training whose errors say which rank, which peer and which operation.

Without torch, on NumPy arrays (anything with the buffer protocol)::

    import numpy as np
    import dtrain
    pg = dtrain.init()                    # rank and size from dtrain run, torchrun, mpirun, srun
    x = np.full(4, pg.rank, np.float32)
    pg.allreduce(x)                       # in place; op="sum" by default
    pg.send(x, dst=1) / pg.recv(x, src=0) / pg.isend(...).wait()

The parameter server: :mod:`dtrain.ps`; sharded record files: :mod:`dtrain.data`; cutting a
model into pipeline stages and verifying schedules: :mod:`dtrain.pipeline`. With PyTorch: ``import dtrain.torch`` registers the
``torch.distributed`` backend ``"dtrain"`` and is a drop-in for ``horovod.torch``.

Blocking calls release the GIL, and Ctrl-C interrupts them (KeyboardInterrupt naming what was
waited for). Errors are ``dtrain.Error`` (a RuntimeError) or one of its kinds:
``InvalidArgumentError`` (also a ValueError), ``TimeoutError`` (also the built-in TimeoutError),
``PeerFailureError``, ``AbortedError``, and for storage ``DataLossError``,
``ResourceExhaustedError``, ``UnavailableError``. Importing this module does not import torch.
"""
from datetime import timedelta

import faulthandler as _faulthandler
import signal as _signal
import tempfile as _tempfile
from typing import IO

from dtrain._core import (AbortedError, DataLossError, Error, InvalidArgumentError, ParallelLayout,
                          PeerFailureError, ProcessGroup, ProgressReporter,
                          ResourceExhaustedError, TimeoutError, UnavailableError, Work,
                          announce_resumed, dump_flight_record)
from dtrain._core import _set_python_stack_dump
from dtrain._core import init_process_group as _init_process_group

__version__ = "0.1.0"
__all__ = ["__version__", "init", "ProcessGroup", "Work", "ParallelLayout", "ProgressReporter",
           "announce_resumed", "dump_flight_record", "Error",
           "InvalidArgumentError", "TimeoutError", "PeerFailureError", "AbortedError",
           "DataLossError", "ResourceExhaustedError", "UnavailableError"]


def init(rank: int | None = None, world_size: int | None = None, init_method: str | None = None,
         timeout: float | timedelta | None = None, name: str | None = None) -> ProcessGroup:
    """Joins the job and returns its world ProcessGroup (collective).

    rank, world_size: default to the launcher's (dtrain run, torchrun, mpirun, srun, a
    Kubernetes Indexed Job); a process started alone is a world of one. init_method: "env://"
    (MASTER_ADDR, MASTER_PORT), "tcp://host:port" or "file:///path". timeout: seconds or a
    timedelta for every operation (default DTRAIN_TIMEOUT, 300 s)."""
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    return _init_process_group(rank, world_size, init_method, timeout, name)


def _register_python_stacks() -> IO[bytes]:
    """Lets a flight-record dump (dtrain doctor) show every Python thread's stack: faulthandler
    writes them, from its signal handler and without the GIL, to a file the dump reads back."""
    signum = _signal.SIGRTMIN + 5
    stacks = _tempfile.TemporaryFile()
    _faulthandler.register(signum, file=stacks, all_threads=True, chain=False)
    _set_python_stack_dump(int(signum), stacks.fileno())
    return stacks


_python_stacks = _register_python_stacks()
