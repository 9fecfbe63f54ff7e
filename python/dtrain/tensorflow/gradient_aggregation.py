"""Local gradient aggregation (Horovod's backward_passes_per_step) for the optimizers whose own
code has none: tf.compat.v1's and Keras 2's (Keras 3 accumulates by itself). The gradients of N
calls are summed in local variables; the N-th call all-reduces the sums (divided by N when
average_aggregated_gradients) and resets them, and only then does the optimizer apply them."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

# Reduces (gradients, variables) to the reduced gradients: a GradientReducer.
_Reduce = Callable[[list[Any], list[Any]], list[Any]]


class LocalAggregation:
    def __init__(self, passes: int, average: bool, sparse_as_dense: bool, scope: str) -> None:
        self.passes, self.average = passes, average
        self.sparse_as_dense, self.scope = sparse_as_dense, scope
        self.counter: Any = None  # calls since the last all-reduce (a tf.Variable)
        self.sums: list[Any] = []  # tf.Variables, None for the gradients that are None

    def _variable(self, name: str, shape: Any, dtype: tf.DType) -> tf.Variable:
        if tf.compat.v1.executing_eagerly_outside_functions():
            return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)
        # A TF1 graph: a local variable, which local_variables_initializer() initializes.
        with tf.compat.v1.variable_scope(self.scope, reuse=tf.compat.v1.AUTO_REUSE):
            return tf.compat.v1.get_variable(
                name, shape=shape, dtype=dtype, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])

    def __call__(self, grads: Sequence[Any], variables: list[Any],
                 reduce: _Reduce) -> list[Any]:
        """The all-reduced sums at every N-th call, the running sums at the others."""
        dense = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError("backward_passes_per_step > 1 needs sparse_as_dense=True "
                                     "for sparse gradients (tf.IndexedSlices)")
                g = tf.convert_to_tensor(g)
            dense.append(g)
        if self.counter is None:
            self.counter = self._variable("counter", (), tf.int32)
            self.sums = [None if g is None else self._variable(f"sum_{i}", g.shape, g.dtype)
                         for i, g in enumerate(dense)]
        counter = self.counter
        added = [s.assign_add(g) for s, g in zip(self.sums, dense) if g is not None]
        with tf.control_dependencies(added):
            count = counter.assign_add(1)
        sums = [None if s is None else s.read_value() for s in self.sums]
        present = [i for i, s in enumerate(sums) if s is not None]

        def reduce_and_reset() -> list[tf.Tensor]:
            with tf.control_dependencies([count]):
                scale = 1.0 / self.passes if self.average else 1.0
                reduced = reduce([None if s is None else s * scale for s in sums], variables)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                resets = [s.assign(tf.zeros_like(s)) for s in self.sums if s is not None]
                resets.append(counter.assign(0))
            with tf.control_dependencies(resets):
                return [tf.identity(reduced[i]) for i in present]

        def keep() -> list[tf.Tensor]:
            with tf.control_dependencies([count]):
                return [tf.identity(sums[i]) for i in present]

        chosen = tf.cond(tf.equal(count, self.passes), reduce_and_reset, keep)
        out: list[Any] = [None] * len(sums)
        for i, value in zip(present, chosen):
            out[i] = value
        return out

    def applies_now(self) -> tf.Tensor:
        """True at the calls whose sums were all-reduced (the counter was reset)."""
        return tf.equal(self.counter, 0)
