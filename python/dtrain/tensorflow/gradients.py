"""Gradients all-reduced across ranks, as DistributedGradientTape and the DistributedOptimizers
do it: dense or sparse, compressed, predivided, each under a name that is the same on every rank
and at every step (so that the coordinator serves it from its cache). Variables registered as
local keep their own gradient (divided by the ranks when scale_local_gradients, as Horovod's)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from dtrain.tensorflow.collectives import (Average, Sum, _op_of, _scaled, allreduce, size,
                                           size_op)
from dtrain.tensorflow.compression import Compression, Compressor


def _names_of(variables: list[Any]) -> list[str]:
    """Names for the gradients of `variables` that every rank computes the same way."""
    names = []
    for i, v in enumerate(variables):
        label = getattr(v, "path", None) or getattr(v, "name", None) or "grad"
        names.append(f"{i}.{label}")
    return names


class GradientReducer:
    """Reduces a list of gradients (None kept) of a list of variables."""

    def __init__(self, prefix: str, compression: type[Compressor] = Compression.none,
                 sparse_as_dense: bool = False, op: int | None = Average,
                 gradient_predivide_factor: float = 1.0,
                 scale_local_gradients: bool = True) -> None:
        code = _op_of(op)
        if gradient_predivide_factor != 1.0 and code != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        self.prefix = prefix
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = code
        self.predivide = gradient_predivide_factor
        self.scale_local = scale_local_gradients
        self.local: set[int] = set()  # id() of the variables whose gradients stay on this rank
        self._function: Callable[..., list[Any]] | None = None

    def register_local(self, variable: Any) -> None:
        self.local.add(id(variable))

    def _reduce(self, grads: list[Any], names: list[str], local: list[bool]) -> list[Any]:
        out: list[Any] = []
        for grad, name, is_local in zip(grads, names, local):
            if grad is None:
                out.append(None)
                continue
            if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            if is_local:
                out.append(grad / tf.cast(size_op(), grad.dtype) if self.scale_local else grad)
                continue
            key = f"{self.prefix}.{name}"
            if self.predivide != 1.0 and not isinstance(grad, tf.IndexedSlices):
                # Horovod's predivision: a sum of grad/f, then times f/size (the size when it
                # runs: live recovery may have changed it since the graph was traced).
                summed = allreduce(grad, op=Sum, compression=self.compression,
                                   prescale_factor=1.0 / self.predivide, name=key)
                out.append(_scaled(summed, self.predivide / tf.cast(size_op(), tf.float64)))
            else:
                out.append(allreduce(grad, op=self.op, compression=self.compression, name=key))
        return out

    def __call__(self, grads: Iterable[Any], variables: Iterable[Any]) -> list[Any]:
        grads, variables = list(grads), list(variables)
        local = [id(v) in self.local for v in variables]
        if size() == 1:
            return grads
        names = _names_of(variables)
        if tf.executing_eagerly():
            # In one graph the all-reduces run together and fuse, instead of one by one.
            if self._function is None:
                self._function = tf.function(self._reduce, autograph=False)
            return self._function(grads, names, local)
        return self._reduce(grads, names, local)
