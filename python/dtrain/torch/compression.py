"""Gradient compression, as Horovod spells it: ``Compression.none`` and ``Compression.fp16``.

``hvd.allreduce(t, compression=...)`` calls ``compress``/``decompress`` around the reduction.
``DistributedOptimizer`` hands the choice to dtrain's C++ gradient hooks, which do the same
conversion in C++ (half the bytes on the wire; the reduction itself runs in fp32 inside dtrain's
half-precision kernels).
"""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """compress(tensor) -> (tensor, context); decompress(tensor, context) -> tensor."""
    name: str = "custom"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    name = "none"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: object) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; others as they are."""
    name = "fp16"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype | None) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressions DistributedOptimizer and allreduce accept."""
    none: type[Compressor] = NoneCompressor
    fp16: type[Compressor] = FP16Compressor
