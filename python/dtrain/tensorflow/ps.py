"""Keras models trained against dtrain's parameter servers: the TensorFlow ps/worker design, with
dtrain's servers (src/ps) holding the parameters and applying the optimizer.

    dtrain run --servers 2 -n 2 -- python3 train.py

    import dtrain.tensorflow.ps as ps
    model = keras.Sequential([keras.Input((10,), dtype="int64"),
                              ps.Embedding("ids", width=16),        # rows live on the servers
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=ps.ServerOptimizer("sgd", lr=0.1, consistency="sync"), loss="mse")
    model.fit(x, y)                                                  # each worker its own data

``ServerOptimizer`` keeps every dense variable of the model in a dense table of the servers
(created from the first worker's values, so every worker starts from the same) and replaces
Keras' update by one push_pull per variable per step: the servers apply their optimizer to the
workers' gradients (``consistency``: "sync" averages every worker's push of a step, "async"
applies each on arrival, "bounded" lets a worker run ``staleness`` steps ahead). ``Embedding``
keeps no table in the worker: each step pulls the rows of its batch's ids and pushes their
gradients back, so a table can be far larger than a worker's memory. Errors (a server or a
worker gone, a timeout) arrive as TensorFlow errors carrying dtrain's text.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

from dtrain import ps as _ps

__all__ = ["Embedding", "ServerOptimizer", "client"]

_client: _ps.Client | None = None


def client() -> _ps.Client:
    """This worker's connection to the job's servers (one per process)."""
    global _client
    if _client is None:
        _client = _ps.Client()
    return _client


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


class Embedding(keras.layers.Layer):
    """Rows of `width` float32 keyed by int64 ids, held in a sparse table of the servers (rows
    created on first touch: init "zeros", "uniform" between a and b, "normal" of mean a and
    deviation b). The table is updated by the servers' optimizer with the options given here
    (lr, and optimizer_options: momentum, beta1, beta2, eps, weight_decay,
    initial_accumulator)."""

    # The rows start as Keras' own Embedding starts them (uniform in [-0.05, 0.05]), not at C++'s
    # zeros; the rest is C++'s default (dtrain.ps).
    def __init__(self, table: str, width: int, init: str = "uniform", a: float = -0.05,
                 b: float = 0.05, seed: int = _ps._SPARSE.seed,
                 optimizer: str = _ps._SPARSE.table.optimizer,
                 consistency: str = _ps._SPARSE.table.consistency,
                 staleness: int = _ps._SPARSE.table.staleness,
                 lr: float = _ps._SPARSE.table.optimizer_options["lr"],
                 optimizer_options: dict[str, float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table, self.width = table, width
        self.spec: dict[str, Any] = dict(init=init, a=a, b=b, seed=seed, optimizer=optimizer,
                         consistency=consistency, staleness=staleness,
                         options=dict(optimizer_options or {}, lr=lr))
        self.created = False

    def build(self, input_shape: Any) -> None:
        # Carries the push: its gradient is computed by pushing the rows' gradients, so that no
        # graph leaves the push out (ServerOptimizer has nothing to apply to it).
        self.anchor = self.add_weight(name="anchor", shape=(), initializer="zeros",
                                      trainable=True)

    def _rows(self, ids: NDArray[Any]) -> NDArray[np.float32]:
        if not self.created:
            spec = self.spec
            client().create_sparse(self.table, self.width, spec["init"], spec["a"], spec["b"],
                                   spec["seed"], spec["optimizer"],
                                   consistency=spec["consistency"],
                                   staleness=spec["staleness"], **spec["options"])
            self.created = True
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.width), np.float32)
        client().pull_rows(self.table, ids, out).wait()
        return out

    def _push(self, ids: NDArray[Any], grads: NDArray[Any]) -> np.float32:
        client().push_rows(self.table, np.ascontiguousarray(ids, dtype=np.int64),
                           np.ascontiguousarray(grads, dtype=np.float32)).wait()
        return np.float32(0)

    def call(self, ids: Any) -> tf.Tensor:
        ids = tf.cast(ids, tf.int64)
        unique, index = tf.unique(tf.reshape(ids, [-1]))
        table = self

        @tf.custom_gradient
        def lookup(anchor: tf.Tensor) -> Any:
            rows = tf.numpy_function(table._rows, [unique], tf.float32, stateful=True)
            rows = tf.reshape(rows, [-1, table.width]) + anchor * 0

            def grad(upstream: tf.Tensor) -> tf.Tensor:
                pushed = tf.numpy_function(table._push, [unique, upstream], tf.float32,
                                           stateful=True)
                return tf.reshape(pushed, [])
            return rows, grad

        rows = lookup(tf.convert_to_tensor(self.anchor))
        out = tf.gather(rows, index)
        return tf.reshape(out, tf.concat([tf.shape(ids), [self.width]], axis=0))

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return tuple(input_shape) + (self.width,)


class ServerOptimizer(keras.optimizers.Optimizer):
    """Keras' optimizer slot: the servers hold the dense variables and apply `optimizer` ("sgd",
    "momentum", "adam", "adagrad") with its options (lr, momentum, beta1, beta2, eps,
    weight_decay); each step pushes the gradients and pulls the new values."""
    built: bool  # Keras' attribute

    def __init__(self, optimizer: str = _ps._DENSE.optimizer,
                 consistency: str = _ps._DENSE.consistency, staleness: int = _ps._DENSE.staleness,
                 name: str = "ServerOptimizer", **options: float) -> None:
        super().__init__(learning_rate=options.get("lr", _ps._DENSE.optimizer_options["lr"]),
                         name=name)
        self.kind, self.consistency, self.staleness = optimizer, consistency, staleness
        self.options = options
        self._tables: dict[int, str] = {}

    def build(self, variables: Any) -> None:
        super().build(variables)
        # Keras may build the optimizer while it traces the training step: the tables are made
        # from the variables' values, outside the graph.
        with tf.init_scope():
            for v in variables:
                if v.path.endswith("anchor"):
                    continue
                name = _name(v)
                values = np.ascontiguousarray(v.numpy(), dtype=np.float32)
                client().create_dense(name, values.reshape(-1), self.kind,
                                      consistency=self.consistency, staleness=self.staleness,
                                      **self.options)
                # The first creator's values win: every worker starts from them.
                client().pull(name, values.reshape(-1)).wait()
                v.assign(values)
                self._tables[id(v)] = name

    def _push_pull(self, name: str, grad: NDArray[Any]) -> NDArray[np.float32]:
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        out = np.empty_like(grad)
        client().push_pull(name, grad.reshape(-1), out.reshape(-1)).wait()
        return out

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        variables = list(trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
        if not self.built:
            self.build(variables)
            self.built = True
        for g, v in zip(grads, variables):
            name = self._tables.get(id(v))
            if g is None or name is None:
                continue
            g = tf.convert_to_tensor(g)
            new = tf.numpy_function(lambda x, name=name: self._push_pull(name, x), [g],
                                    tf.float32, stateful=True)
            v.assign(tf.reshape(new, tf.shape(g)))
        self.iterations.assign_add(1)

    def get_config(self) -> dict[str, Any]:
        return {"optimizer": self.kind, "consistency": self.consistency,
                "staleness": self.staleness, "name": self.name, **self.options}
