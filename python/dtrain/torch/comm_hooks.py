"""DDP communication hooks of dtrain's own, for ``DistributedDataParallel.register_comm_hook``.

``int8_compress_hook`` averages each gradient bucket with int8 on the wire: every value as one
byte, with one f32 scale per block of 256 (3.9x fewer bytes than f32, 2x fewer than
``fp16_compress_hook``), and error feedback, so that what one step's rounding loses is added to
the next step's gradients instead of being dropped (as in 1-bit Adam and ZeRO++'s qgZ). Every
replica ends with the same gradients. It runs dtrain's C++ int8 all-reduce (``Wire::kInt8``), so
the DDP's group must be a dtrain group::

    from dtrain.torch.comm_hooks import Int8CompressState, int8_compress_hook
    model = DistributedDataParallel(model)              # on init_process_group("dtrain")
    model.register_comm_hook(Int8CompressState(), int8_compress_hook)

It pays where bytes cost more than arithmetic (links of 10 Gb/s and slower; docs/performance.md
has the measurements); on one host the exact all-reduce over shared memory is as fast.

(No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.)
"""
import torch
import torch.distributed as dist

from dtrain import _torch
from dtrain.torch.backend import backend_of

__all__ = ["Int8CompressState", "int8_compress_hook"]


class Int8CompressState:
    """What ``int8_compress_hook`` keeps between steps: the group (``None``: the DDP's default,
    the world) and each bucket's error feedback."""

    def __init__(self, process_group: "dist.ProcessGroup | None" = None) -> None:
        self.process_group = process_group
        self.errors: dict[int, torch.Tensor] = {}

    def error_of(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The bucket's error-feedback buffer: zeros when it is new, or its size changed (DDP
        rebuilds its buckets after the first step)."""
        buffer = bucket.buffer()
        error = self.errors.get(bucket.index())
        if error is None or error.shape != buffer.shape or error.device != buffer.device:
            error = torch.zeros_like(buffer)
            self.errors[bucket.index()] = error
        return error


def int8_compress_hook(state: Int8CompressState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket``'s gradients over the group with int8 on the wire and error feedback."""
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise TypeError(f"int8_compress_hook: the bucket's gradients are {buffer.dtype}; it "
                        "compresses float32 gradients (use fp16_compress_hook or none for others)")
    backend = backend_of(state.process_group)
    if backend is None:
        raise ValueError("int8_compress_hook: the DDP's group is not a dtrain group; int8 on the "
                         "wire is dtrain's own algorithm: init_process_group(\"dtrain\"), or "
                         "Int8CompressState(new_group(backend=\"dtrain\"))")
    work = _torch.allreduce_int8(backend, buffer, state.error_of(bucket))
    return work.get_future().then(lambda fut: fut.value()[0])
