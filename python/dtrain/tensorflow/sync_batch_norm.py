"""SyncBatchNormalization: Keras' batch normalization with the statistics of every rank's batch
together, as Horovod's (one all-reduce of the sums, sums of squares and counts per call), for the
Keras tf.keras is: Keras 3, or Keras 2 (tf_keras) under TF_USE_LEGACY_KERAS=1."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dtrain.tensorflow.collectives import Sum, allreduce


def _global_moments(layer: Any, inputs: tf.Tensor, axes: Any,
                    keepdims: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """The mean and (biased) variance over `axes` of every rank's `inputs` together."""
    # In float32 at least: sums of squares of halves overflow.
    wide = inputs.dtype if inputs.dtype.size >= 4 else tf.float32
    x = tf.cast(inputs, wide)
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), wide)
    sums = tf.reduce_sum(x, axes, keepdims=True)
    squares = tf.reduce_sum(tf.square(x), axes, keepdims=True)
    shape = tf.shape(sums)
    local = tf.concat([tf.reshape(sums, [-1]), tf.reshape(squares, [-1]),
                       tf.reshape(count, [1])], axis=0)
    total = allreduce(local, op=Sum, name=f"SyncBatchNormalization.{layer.name}")
    channels = tf.size(sums)
    n = total[-1]
    mean = tf.reshape(total[:channels] / n, shape)
    variance = tf.maximum(tf.reshape(total[channels:2 * channels] / n, shape) - tf.square(mean),
                          0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


if tf.keras.__name__.startswith("tf_keras"):
    class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
        """tf.keras.layers.BatchNormalization whose training-time mean and variance are the
        whole job's batch's; at inference it is the plain layer."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["fused"] = False  # the fused kernel computes its moments itself
            super().__init__(*args, **kwargs)

        def _calculate_mean_and_var(self, inputs: tf.Tensor, reduction_axes: Any, keep_dims: bool,
                                    mask: Any = None) -> tuple[tf.Tensor, tf.Tensor]:
            if mask is not None:
                raise NotImplementedError("SyncBatchNormalization does not take a mask")
            return _global_moments(self, inputs, reduction_axes, keep_dims)
else:
    import keras

    class SyncBatchNormalization(keras.layers.BatchNormalization):  # type: ignore[no-redef]
        """keras.layers.BatchNormalization whose training-time mean and variance are the whole
        job's batch's; at inference it is the plain layer (its moving statistics are the same on
        every rank)."""

        def _moments(self, inputs: tf.Tensor, mask: Any) -> tuple[tf.Tensor, tf.Tensor]:
            if mask is not None:
                raise NotImplementedError("SyncBatchNormalization does not take a mask")
            return _global_moments(self, inputs, self._reduction_axes, False)
