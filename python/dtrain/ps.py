"""The parameter server from Python: dtrain's C++ client on NumPy arrays or torch tensors.

    dtrain run --servers 1 -n 2 -- python3 train.py

    import numpy as np
    import dtrain.ps
    client = dtrain.ps.Client()                       # finds the job's servers
    w = np.zeros(10, np.float32)
    client.create_dense("w", w, optimizer="sgd", lr=0.1)
    for step in range(100):
        g = gradient(w)
        client.push_pull("w", g, w).wait()            # sync: the average of every worker's push

Every call returns a Handle; the arrays passed stay referenced (and must stay unchanged) until
it completed. ``wait(timeout=None)`` releases the GIL and stops on Ctrl-C. Dense tables hold
float32; sparse tables hold rows of ``width`` float32 keyed by uint64 ids. Consistency "sync",
"async" or "bounded" (staleness s), as in C++ (include/dtrain/ps.h, docs/parameter_server.md).
torch tensors are used in place, as NumPy views of their memory (CPU, contiguous).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Union, cast

from dtrain import _core

if TYPE_CHECKING:
    import torch

    from dtrain._core import Buffer

__all__ = ["Client", "Handle"]

Handle = _core.PsHandle
# A NumPy array (anything with the buffer protocol), or a contiguous CPU tensor.
Array = Union["Buffer", "torch.Tensor"]

# The keyword defaults of create_dense and create_sparse: C++'s (dtrain::ps::TableOptions,
# SparseTableOptions).
_DENSE = _core.PsTableOptions()
_SPARSE = _core.PsSparseTableOptions()


def _array(x: Array, name: str) -> Buffer:
    """NumPy arrays and buffers as they are; a torch tensor as a NumPy view of its memory."""
    if type(x).__module__.startswith("torch"):
        t = cast("torch.Tensor", x)
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name}: the tensor must be a contiguous CPU tensor")
        return t.detach().numpy()
    return cast("Buffer", x)


def _optimizer(kwargs: dict[str, float], table: _core.PsTableOptions) -> dict[str, float]:
    """The optimizer options given, the others at the table's defaults."""
    defaults = table.optimizer_options
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"unknown optimizer options {sorted(unknown)}; known: "
                        f"{sorted(defaults)}")
    return {**defaults, **kwargs}


class Client:
    """A worker's connection to the job's parameter servers (started by
    ``dtrain run --servers S``, or described by TF_CONFIG or DMLC_* variables)."""

    def __init__(self) -> None:
        self._client = _core.PsClient()

    @property
    def worker(self) -> int:
        return self._client.worker

    @property
    def num_servers(self) -> int:
        return self._client.num_servers

    def create_dense(self, name: str, init: Array, optimizer: str = _DENSE.optimizer,
                     consistency: str = _DENSE.consistency, staleness: int = _DENSE.staleness,
                     **optimizer_options: float) -> None:
        """Creates (or attaches to) a dense float32 table initialised from `init`; every worker
        creates the same tables in the same order. optimizer: sgd, momentum, adam, adagrad or
        sum (the servers only add the gradients up); its options: lr, momentum, beta1, beta2,
        eps, weight_decay, initial_accumulator."""
        self._client.create_dense(name, _array(init, "create_dense"), optimizer,
                                  consistency=consistency, staleness=staleness,
                                  **_optimizer(optimizer_options, _DENSE))

    def create_sparse(self, name: str, width: int, init: str = _SPARSE.init,
                      a: float = _SPARSE.a, b: float = _SPARSE.b, seed: int = _SPARSE.seed,
                      optimizer: str = _SPARSE.table.optimizer,
                      consistency: str = _SPARSE.table.consistency,
                      staleness: int = _SPARSE.table.staleness,
                      evict_after_s: int = _SPARSE.evict_after_s,
                      **optimizer_options: float) -> None:
        """Creates a sparse table of rows of `width` float32, each created on first touch:
        init "zeros", "uniform" (between a and b) or "normal" (mean a, deviation b), derived
        from the row's id and `seed`."""
        self._client.create_sparse(name, width, init, a, b, seed, optimizer,
                                   consistency=consistency, staleness=staleness,
                                   evict_after_s=evict_after_s,
                                   **_optimizer(optimizer_options, _SPARSE.table))

    def push(self, name: str, grad: Array) -> Handle:
        return self._client.push(name, _array(grad, "push"))

    def pull(self, name: str, out: Array) -> Handle:
        return self._client.pull(name, _array(out, "pull"))

    def push_pull(self, name: str, grad: Array, out: Array) -> Handle:
        """A push, then a pull of values that include it (one round trip)."""
        return self._client.push_pull(name, _array(grad, "push_pull"), _array(out, "push_pull"))

    def pull_rows(self, table: str, ids: Array, out: Array) -> Handle:
        """Rows `ids` (uint64 or int64) of a sparse table into `out` (len(ids) x width)."""
        return self._client.pull_rows(table, _array(ids, "pull_rows"), _array(out, "pull_rows"))

    def push_rows(self, table: str, ids: Array, grads: Array) -> Handle:
        return self._client.push_rows(table, _array(ids, "push_rows"),
                                      _array(grads, "push_rows"))

    def checkpoint(self) -> list[str]:
        """Asks every server to write a checkpoint of its tables now; returns the directories."""
        return self._client.checkpoint()

    def close(self) -> None:
        """Says goodbye to the servers (a departed worker no longer holds the others back)."""
        # The client is unusable after: its calls raise AttributeError.
        self._client = None  # type: ignore[assignment]
