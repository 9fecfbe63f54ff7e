"""Horovod's gradient compression for TensorFlow: Compression.none, Compression.fp16 (floating
tensors travel as float16 and come back in their own dtype)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """compress(tensor) -> (tensor, context); decompress(tensor, context) -> tensor."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, None]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: object) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.DType | None]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: tf.DType | None) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    none: type[Compressor] = NoneCompressor
    fp16: type[Compressor] = FP16Compressor
