"""Variables and Python objects across ranks: broadcast_variables, broadcast_object,
allgather_object, as in Horovod."""
from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

from dtrain.tensorflow.collectives import allgather, broadcast, rank, size

_T = TypeVar("_T")


def _name_of(variable: Any, index: int) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", None) or str(index)


@tf.function(autograph=False)
def _broadcast_all(variables: list[tf.Variable], root_rank: int, prefix: str) -> None:
    # In one graph: the broadcasts run concurrently and the coordinator takes them in few cycles.
    for i, v in enumerate(variables):
        v.assign(broadcast(v, root_rank, name=f"{prefix}.{i}.{_name_of(v, i)}"))


def _tf_variable(variable: Any) -> tf.Variable:
    """A Keras 3 variable's tf.Variable (it wraps one); a tf.Variable itself."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise ValueError(f"broadcast_variables: {type(variable).__name__} is not a variable")


def model_variables(model: Any, optimizer: Any = None) -> list[Any]:
    """A Keras model's variables and its optimizer's (built now if it is not yet: its slots
    exist from the first step on, and a broadcast or a commit must see the same list every
    time), each once."""
    variables = list(model.variables)
    optimizer = optimizer or getattr(model, "optimizer", None)
    if optimizer is not None:
        if not getattr(optimizer, "built", True) and model.built:
            optimizer.build(model.trainable_variables)
        more = optimizer.variables
        # Once it has trained, a Keras 3 optimizer lists the model's variables too.
        seen = {id(v) for v in variables}
        variables += [v for v in (more() if callable(more) else more) if id(v) not in seen]
    return variables


def broadcast_variables(variables: Iterable[Any], root_rank: int, name: str | None = None,
                        process_set: object = None) -> tf.Operation | None:
    """Assigns rank `root_rank`'s values to `variables` (tf.Variable or Keras variables) on
    every rank."""
    tf_variables = [_tf_variable(v) for v in variables]
    if not tf_variables:
        return None
    if tf.executing_eagerly():
        _broadcast_all(tf_variables, root_rank, name or "broadcast_variables")
        return None
    # A TF1 graph: the assignments, as one op to run.
    return tf.group(*[v.assign(broadcast(v, root_rank, name=f"{name}.{i}" if name else None))
                      for i, v in enumerate(tf_variables)])


def broadcast_global_variables(root_rank: int) -> tf.Operation | None:
    """A TF1 graph's op that assigns rank `root_rank`'s values to every global variable. Eager
    code has no global variables: broadcast_variables(model.variables, root_rank) there."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() needs a TF1 graph (tf.compat.v1); in "
                           "eager code use broadcast_variables(variables, root_rank) or the "
                           "Keras callback BroadcastGlobalVariablesCallback")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _value(tensor: tf.Tensor, session: tf.compat.v1.Session | None) -> Any:
    """The tensor's value: at once when eager, else run in `session` (or the default one, or a
    session of its own)."""
    if tf.executing_eagerly():
        return tensor.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is not None:
        return session.run(tensor)
    with tf.compat.v1.Session() as own:
        return own.run(tensor)


def broadcast_object(obj: _T, root_rank: int = 0, session: tf.compat.v1.Session | None = None,
                     name: str | None = None, process_set: object = None) -> _T:
    """Rank `root_rank`'s picklable `obj`, on every rank (in a TF1 graph, run in `session`)."""
    name = name or type(obj).__name__
    payload = pickle.dumps(obj) if rank() == root_rank else b""
    length = _value(broadcast(tf.constant([len(payload)], dtype=tf.int64), root_rank,
                              name=f"broadcast_object.{name}.length"), session)
    data = np.zeros(int(length[0]), dtype=np.uint8)
    if rank() == root_rank:
        data = np.frombuffer(payload, dtype=np.uint8)
    data = _value(broadcast(tf.constant(data), root_rank, name=f"broadcast_object.{name}.data"),
                  session)
    received: _T = pickle.load(io.BytesIO(data.tobytes()))
    return received


def broadcast_object_fn(root_rank: int = 0, session: tf.compat.v1.Session | None = None,
                        name: str | None = None,
                        process_set: object = None) -> Callable[[_T], _T]:
    """A function that broadcasts its argument from `root_rank`, as Horovod's."""
    def fn(obj: _T) -> _T:
        return broadcast_object(obj, root_rank, session, name=name)
    return fn


def allgather_object(obj: _T, session: tf.compat.v1.Session | None = None,
                     name: str | None = None, process_set: object = None) -> list[_T]:
    """Every rank's picklable `obj`, in rank order."""
    name = name or type(obj).__name__
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = _value(allgather(tf.constant([payload.size], dtype=tf.int64),
                               name=f"allgather_object.{name}.lengths"), session)
    data = _value(allgather(tf.constant(payload), name=f"allgather_object.{name}.data"), session)
    objects: list[_T] = []
    start = 0
    for n in lengths:
        objects.append(pickle.loads(data[start:start + int(n)].tobytes()))
        start += int(n)
    assert len(objects) == size()
    return objects
