"""Checkpoints for exact resume, and the sampler that makes resuming mid-epoch exact: dtrain's
C++ CheckpointManager and DistributedSampler for Python models and optimizers.

    ckpt = dtrain.torch.CheckpointManager("ckpt", keep=3)
    sampler = dtrain.torch.DistributedSampler(len(dataset), seed=42)   # world from torch.distributed
    loaded = ckpt.load_latest(model, optimizer)          # collective; None on a fresh start
    epoch, consumed = (loaded.epoch, loaded.epoch_consumed) if loaded else (0, 0)
    for epoch in range(epoch, epochs):
        sampler.set_epoch(epoch, consumed); consumed = 0
        for k, batch in enumerate(batches(sampler), 1):
            ...train...
            ckpt.save(model, optimizer, step=step, epoch=epoch,
                      epoch_consumed=sampler.consumed(k * batch_size))

A checkpoint is the C++ format (include/dtrain/torch/checkpoint.h): DIR/step-000120 with
model.safetensors (parameters and buffers under PyTorch's names), optimizer.safetensors (SGD,
Adam or AdamW state), rng.safetensors (torch's default CPU generator) and a manifest with every
file's size and CRC-32; written atomically by one rank (in the background: the tensors are copied
first), verified at load (a damaged newest checkpoint is skipped, saying why), loaded by every
rank. C++ programs load checkpoints written from Python and the reverse. Resuming on another
number of ranks continues the epoch where it stopped: every sample is trained exactly once.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dtrain import _torch
from dtrain.torch.backend import backend_of

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend

    from dtrain._torch import CheckpointStats, LoadedCheckpoint

_Named = list[tuple[str, torch.Tensor]]
# The keyword defaults of CheckpointManager and DistributedSampler: C++'s
# (dtrain::CheckpointOptions, dtrain::DistributedSamplerOptions).
_CHECKPOINT = _torch.CheckpointOptions()
_SAMPLER = _torch.DistributedSamplerOptions()

__all__ = ["CheckpointManager", "Checkpoint", "DistributedSampler"]


@dataclass
class Checkpoint:
    """What load_latest() loaded: where, and where training stood."""
    path: str
    step: int
    epoch: int
    epoch_consumed: int
    epoch_size: int
    world_size: int
    values: dict[str, float] = field(default_factory=dict)
    # newer checkpoints that did not verify, and why
    skipped: list[str] = field(default_factory=list)


def _group(group: dist.ProcessGroup | None) -> Backend | None:
    if group is not None:
        pg = group
    elif dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
    else:
        return None  # a single process
    backend = backend_of(pg)
    if backend is None:
        raise ValueError("dtrain.torch checkpoints need torch.distributed on the backend 'dtrain' "
                         f"(this group's backend is {dist.get_backend(pg)!r}); or pass none and "
                         "run a single process")
    return backend


def _optimizer_type(optimizer: torch.optim.Optimizer | None) -> str:
    if optimizer is None:
        return ""
    for kind in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
        if isinstance(optimizer, kind):
            return kind.__name__
    raise ValueError(f"checkpoint: optimizer {type(optimizer).__name__} is not supported (SGD, "
                     f"Adam and AdamW are): its state could not be restored exactly")


def _model(model: torch.nn.Module) -> tuple[_Named, _Named]:
    return list(model.named_parameters()), [(n, b) for n, b in model.named_buffers()
                                            if b is not None]


def _finish_load(loaded: LoadedCheckpoint | None,
                 optimizer: torch.optim.Optimizer | None) -> Checkpoint | None:
    """The optimizer's hyper-parameters and state as the C++ load left them, into the Python
    optimizer; the rest as a Checkpoint."""
    if loaded is None:
        return None
    if optimizer is not None:
        groups, states = loaded.pop("optimizer")
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for group, options in zip(optimizer.param_groups, groups):
            group.update(options)
        for p, state in zip(params, states):
            if state is None:
                optimizer.state.pop(p, None)
                continue
            if "step" in state:  # torch 1.13's Adam keeps the step as a float tensor
                state["step"] = torch.tensor(float(state["step"]))
            optimizer.state[p] = state
    return Checkpoint(path=loaded["path"], step=loaded["step"], epoch=loaded["epoch"],
                      epoch_consumed=loaded["epoch_consumed"], epoch_size=loaded["epoch_size"],
                      world_size=loaded["world_size"], values=loaded["values"],
                      skipped=loaded["skipped"])


class CheckpointManager:
    """Saves and loads checkpoints in `dir` (see the module's documentation).

    keep: newest checkpoints kept; writer_rank: the rank that writes; async_write: write in the
    background (save() returns once the tensors are copied); copy_in_background: with
    async_write, the parameters and optimizer state are copied in the background too, while the
    next forward and backward passes run (a step then stalls for the buffers only): call
    wait_copied() before optimizer.step(); write_timeout: seconds a save or wait() waits for the
    write in flight. group: a torch.distributed group on the backend
    'dtrain' (default: the default group if torch.distributed is initialized, else a single
    process)."""

    def __init__(self, dir: str | os.PathLike[str], keep: int = _CHECKPOINT.keep,
                 writer_rank: int = _CHECKPOINT.writer_rank,
                 async_write: bool = _CHECKPOINT.async_write,
                 copy_in_background: bool = _CHECKPOINT.copy_in_background,
                 write_timeout: float = _CHECKPOINT.write_timeout.total_seconds(),
                 group: dist.ProcessGroup | None = None) -> None:
        self._manager = _torch.CheckpointManager(str(dir), int(keep), int(writer_rank),
                                                 bool(async_write), bool(copy_in_background),
                                                 timedelta(seconds=float(write_timeout)),
                                                 _group(group))

    @property
    def dir(self) -> str:
        return self._manager.dir

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
             step: int, epoch: int = 0, epoch_consumed: int = 0, epoch_size: int = 0,
             values: dict[str, float] | None = None) -> None:
        """Not collective: the writer rank copies the model, the optimizer's state and the
        generator and writes them as DIR/step-<step>; other ranks return at once. `values`: any
        other numbers to restore (a dict of floats)."""
        parameters, buffers = _model(model)
        self._manager.save(parameters, buffers, _optimizer_type(optimizer),
                           optimizer.param_groups if optimizer is not None else [],
                           optimizer.state if optimizer is not None else {},
                           dict(step=int(step), epoch=int(epoch),
                                epoch_consumed=int(epoch_consumed), epoch_size=int(epoch_size),
                                values={k: float(v) for k, v in (values or {}).items()}))

    def load_latest(self, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> Checkpoint | None:
        """Collective: loads the newest checkpoint that verifies into `model` (in place),
        `optimizer` and torch's CPU generator, on every rank; returns a Checkpoint, or None when
        `dir` holds none. Raises on every rank when none verifies or it does not fit."""
        parameters, buffers = _model(model)
        kind = _optimizer_type(optimizer)
        loaded = self._manager.load_latest(parameters, buffers, kind,
                                           optimizer.param_groups if optimizer is not None else [])
        return _finish_load(loaded, optimizer)

    def wait(self) -> None:
        """Waits for the write in flight and raises its error, if it failed."""
        self._manager.wait()

    def wait_copied(self) -> None:
        """Waits until the last save's tensors are copied (at once unless copy_in_background):
        call it before optimizer.step() changes them."""
        self._manager.wait_copied()

    def stats(self) -> CheckpointStats:
        return self._manager.stats()


class DistributedSampler(torch.utils.data.Sampler[int]):
    """This rank's samples of each epoch: PyTorch's DistributedSampler split (the same indices
    for an epoch started from its beginning), plus exact resume mid-epoch on any number of ranks:
    set_epoch(epoch, consumed) deals out the samples the job had not trained yet.

    num_replicas and rank default to torch.distributed's world."""

    def __init__(self, dataset_size: int | Sized, num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = _SAMPLER.shuffle,
                 seed: int = _SAMPLER.seed, drop_last: bool = _SAMPLER.drop_last) -> None:
        if not isinstance(dataset_size, int):
            dataset_size = len(dataset_size)
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        self._sampler = _torch.DistributedSampler(dataset_size, num_replicas, rank, shuffle,
                                                  seed, drop_last)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """The epoch's permutation (seed + epoch), from position `consumed` (samples of the
        epoch the whole job trained already)."""
        self._sampler.set_epoch(int(epoch), int(consumed))

    def consumed(self, trained: int) -> int:
        """The epoch's position once every rank trained the first `trained` of its indices:
        what set_epoch needs to resume after them."""
        return self._sampler.consumed(int(trained))

    def __iter__(self) -> Iterator[int]:
        return iter(self._sampler.indices())

    def __len__(self) -> int:
        return self._sampler.num_samples
