"""DistributedGradientTape: a tf.GradientTape whose gradient() returns the gradients all-reduced
across ranks, as Horovod's."""
import tensorflow as tf

from dtrain.tensorflow.collectives import Average
from dtrain.tensorflow.compression import Compression
from dtrain.tensorflow.gradients import GradientReducer, names_of


class _Distributed:
    """Mixed in before the tape's own class: gradient() all-reduces what the tape computed."""

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._dtrain_reducer(flat_grads, names_of(flat_sources))
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True):
    """Wraps `gradtape` (before or after its recording) so that gradient() all-reduces."""
    if process_set is not None:
        raise ValueError("DistributedGradientTape: process sets are not supported by "
                         "dtrain.tensorflow; every call spans the whole job")
    cls = type(gradtape.__class__.__name__, (_Distributed, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__ = gradtape.__dict__  # the same recording: wrapping copies nothing
    tape._dtrain_reducer = GradientReducer("DistributedGradientTape", compression,
                                           sparse_as_dense, op, gradient_predivide_factor)
    return tape
