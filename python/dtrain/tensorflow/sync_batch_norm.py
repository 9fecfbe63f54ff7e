"""SyncBatchNormalization: Keras' batch normalization with the statistics of every rank's batch
together, as Horovod's (one all-reduce of the sums, sums of squares and counts per call)."""
import keras
import tensorflow as tf

from dtrain.tensorflow.collectives import Sum, allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training-time mean and variance are the whole
    job's batch's; at inference it is the plain layer (its moving statistics are the same on
    every rank)."""

    def _moments(self, inputs, mask):
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not take a mask")
        # In float32 at least: sums of squares of halves overflow.
        wide = inputs.dtype if inputs.dtype.size >= 4 else tf.float32
        x = tf.cast(inputs, wide)
        axes = self._reduction_axes
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), wide)
        local = tf.concat([tf.reshape(tf.reduce_sum(x, axes), [-1]),
                           tf.reshape(tf.reduce_sum(tf.square(x), axes), [-1]),
                           tf.reshape(count, [1])], axis=0)
        total = allreduce(local, op=Sum, name=f"SyncBatchNormalization.{self.name}")
        channels = (tf.shape(local)[0] - 1) // 2
        n = total[-1]
        mean = total[:channels] / n
        variance = tf.maximum(total[channels:2 * channels] / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
