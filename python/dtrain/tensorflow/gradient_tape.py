"""DistributedGradientTape: a tf.GradientTape whose gradient() returns the gradients all-reduced
across ranks, as Horovod's; PartialDistributedGradientTape keeps some layers' gradients local."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf

from dtrain.tensorflow.collectives import Average
from dtrain.tensorflow.compression import Compression, Compressor
from dtrain.tensorflow.gradients import GradientReducer

if TYPE_CHECKING:
    from tensorflow import GradientTape as _Tape
else:  # at run time the wrapped tape's class follows in the MRO
    _Tape = object

# (source, gradient) pairs
_Pairs = list[tuple[Any, Any]]


class _Distributed(_Tape):
    """Mixed in before the tape's own class: gradient() all-reduces what the tape computed."""
    _dtrain_reducer: GradientReducer

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        reduced = self._dtrain_reducer(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source: Any) -> None:
        """`source`'s gradient stays on this rank (a model-parallel part, say)."""
        self._dtrain_reducer.register_local(source)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       unconnected_gradients: Any = tf.UnconnectedGradients.NONE
                                       ) -> tuple[_Pairs, _Pairs]:
        """([(source, gradient)] of the local sources, [(source, gradient)] of the others), each
        in `sources`' order, as Horovod's."""
        grads = self.gradient(target, sources, output_gradients, unconnected_gradients)
        local: _Pairs = []
        others: _Pairs = []
        for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            is_local = id(source) in self._dtrain_reducer.local
            (local if is_local else others).append((source, grad))
        return local, others


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "",
                            compression: type[Compressor] = Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: object = None,
                            scale_local_gradients: bool = True) -> Any:
    """Wraps `gradtape` (before or after its recording) so that gradient() all-reduces."""
    if process_set is not None:
        raise ValueError("DistributedGradientTape: process sets are not supported by "
                         "dtrain.tensorflow; every call spans the whole job")
    cls: Any = type(gradtape.__class__.__name__, (_Distributed, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__ = gradtape.__dict__  # the same recording: wrapping copies nothing
    tape._dtrain_reducer = GradientReducer("DistributedGradientTape", compression,
                                           sparse_as_dense, op, gradient_predivide_factor,
                                           scale_local_gradients)
    return tape


def local_variables_of(local_layers: Any) -> list[Any]:
    """The trainable variables of `local_layers` (one Keras layer, Keras 3's or 2's, a list of
    them, or None)."""
    if local_layers is None:
        return []
    if hasattr(local_layers, "trainable_weights"):
        local_layers = [local_layers]
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("local_layers: every local layer must be a Keras layer")
    return [v for layer in local_layers for v in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: type[Compressor] = Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: object = None,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> Any:
    """A DistributedGradientTape that leaves the gradients of `local_layers` on this rank."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for v in local_variables_of(local_layers):
        tape.register_local_source(v)
    return tape
