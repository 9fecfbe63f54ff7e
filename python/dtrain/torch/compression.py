"""Gradient compression, as Horovod spells it: ``Compression.none`` and ``Compression.fp16``.

``hvd.allreduce(t, compression=...)`` calls ``compress``/``decompress`` around the reduction.
``DistributedOptimizer`` hands the choice to dtrain's C++ gradient hooks, which do the same
conversion in C++ (half the bytes on the wire; the reduction itself runs in fp32 inside dtrain's
half-precision kernels).
"""
import torch


class Compressor:
    """compress(tensor) -> (tensor, context); decompress(tensor, context) -> tensor."""
    name = "custom"

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    name = "none"

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; others as they are."""
    name = "fp16"

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressions DistributedOptimizer and allreduce accept."""
    none = NoneCompressor
    fp16 = FP16Compressor
