"""DDP communication hooks of dtrain's own, for ``DistributedDataParallel.register_comm_hook``.

Each averages a gradient bucket with fewer bytes on the wire than f32, run by dtrain's C++
all-reduce (``AllreduceOptions::wire``), so the DDP's group must be a dtrain group:

- ``int8_compress_hook``: every value as one byte, with one f32 scale per block of 256 (3.9x
  fewer bytes than f32, 2x fewer than the 16-bit hooks);
- ``int4_compress_hook``: every value in 4 bits, from -7 to 7 times its block's scale (7.8x fewer
  bytes than f32; the format of ZeRO++'s gradients), meant with error feedback;
- ``bf16_compress_hook`` and ``fp16_compress_hook``: every value in 16 bits (2x fewer). Unlike
  torch's hooks of the same names, which cast the bucket down, all-reduce it and cast it back
  (two passes of their own), the casts here are part of the exchange's own passes, and the sum is
  taken in f32.

With a ``CompressState`` (the default), what one step's rounding loses is added to the next
step's gradients instead of being dropped (error feedback, as in 1-bit Adam and ZeRO++'s qgZ).
Every replica ends with the same gradients::

    from dtrain.torch.comm_hooks import CompressState, int8_compress_hook
    model = DistributedDataParallel(model)              # on init_process_group("dtrain")
    model.register_comm_hook(CompressState(), int8_compress_hook)

The 16-bit hooks also take torch's kind of state, a process group or ``None`` (then with no error
feedback), so they replace torch's in place:
``model.register_comm_hook(None, dtrain.torch.comm_hooks.bf16_compress_hook)``.

They pay where bytes cost more than arithmetic (links of 10 Gb/s and slower; docs/performance.md
has the measurements); on one host the exact all-reduce over shared memory is as fast or faster.

(No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.)
"""
from typing import Union

import torch
import torch.distributed as dist

from dtrain import _torch
from dtrain.torch.backend import backend_of

__all__ = ["CompressState", "Int8CompressState", "int8_compress_hook", "int4_compress_hook",
           "bf16_compress_hook", "fp16_compress_hook"]


class CompressState:
    """What the hooks keep between steps: the group (``None``: the DDP's default, the world) and,
    with ``error_feedback``, each bucket's error-feedback buffer (f32, one value a gradient)."""

    def __init__(self, process_group: "dist.ProcessGroup | None" = None,
                 error_feedback: bool = True) -> None:
        self.process_group = process_group
        self.error_feedback = error_feedback
        self.errors: dict[int, torch.Tensor] = {}

    def error_of(self, bucket: dist.GradBucket) -> "torch.Tensor | None":
        """The bucket's error-feedback buffer (``None`` without error feedback): zeros when it is
        new, or its size changed (DDP rebuilds its buckets after the first step)."""
        if not self.error_feedback:
            return None
        buffer = bucket.buffer()
        error = self.errors.get(bucket.index())
        if error is None or error.shape != buffer.shape or error.device != buffer.device:
            error = torch.zeros_like(buffer)
            self.errors[bucket.index()] = error
        return error


# The name of the first release, kept for the scripts that use it.
Int8CompressState = CompressState

_State = Union[CompressState, dist.ProcessGroup, None]


def _compressed(wire: str, hook: str, state: _State,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if not isinstance(state, CompressState):
        state = CompressState(state, error_feedback=False)
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise TypeError(f"{hook}: the bucket's gradients are {buffer.dtype}; it compresses float32 "
                        "gradients (torch.distributed.algorithms.ddp_comm_hooks.default_hooks "
                        "has hooks for others)")
    backend = backend_of(state.process_group)
    if backend is None:
        raise ValueError(f"{hook}: the DDP's group is not a dtrain group; {wire} on the wire is "
                         "dtrain's own algorithm: init_process_group(\"dtrain\"), or "
                         "CompressState(new_group(backend=\"dtrain\"))")
    work = _torch.allreduce_compressed(backend, buffer, wire, state.error_of(bucket))
    return work.get_future().then(lambda fut: fut.value()[0])


def int8_compress_hook(state: CompressState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket``'s gradients over the group with int8 on the wire."""
    return _compressed("int8", "int8_compress_hook", state, bucket)


def int4_compress_hook(state: CompressState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket``'s gradients over the group with int4 on the wire."""
    return _compressed("int4", "int4_compress_hook", state, bucket)


def bf16_compress_hook(state: _State,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket``'s gradients over the group with bf16 on the wire."""
    return _compressed("bf16", "bf16_compress_hook", state, bucket)


def fp16_compress_hook(state: _State,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket``'s gradients over the group with fp16 on the wire: magnitudes above
    65504 become infinite, as with torch's hook of the name."""
    return _compressed("fp16", "fp16_compress_hook", state, bucket)
