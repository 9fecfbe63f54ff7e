"""Training data in shard files, read by each rank record by record (dtrain's C++ readers).

    dtrain data write --fashion-mnist --out /data/fmnist/train --shards 4     # once

    import dtrain.data
    data = dtrain.data.ShardedDataset("/data/fmnist/train-*.tfrecord", seed=42, decode=parse)
    for epoch in range(epochs):
        data.set_epoch(epoch)
        for sample in data:           # parse(record bytes), or the bytes without decode
            ...

Files named *.tar are WebDataset shards: a sample is the run of members sharing a key, and comes
as {"__key__": "train/0001", "jpg": b"...", "cls": b"3"}; other files are TFRecord, whose records
come as bytes.

Every epoch visits the records in an order drawn from (seed, epoch), the same on every rank, and
rank r of W takes positions r, r + W, r + 2W, ...: equal shares whatever the files' sizes. Each
rank reads only its own records, on ``readers`` background threads that stay ahead of the loop
(at most ``prefetch_records`` records and ``prefetch_bytes`` bytes). To resume exactly once, on
any number of ranks, save ``data.consumed(taken)`` (``taken``: the samples this rank trained in
the epoch) with the epoch, and start with ``data.set_epoch(epoch, consumed)``. docs/data.md has
the details; this is the C++ class dtrain::data::ShardedDataset.

With PyTorch installed it is a ``torch.utils.data.IterableDataset``: wrap it in a DataLoader for
batching. ``num_workers=0`` is the usual choice (the readers are threads already); with
``num_workers=n`` each worker process reads its own part of this rank's records, which suits a
heavy ``decode``, and a position from ``consumed()`` is exact at the end of an epoch or after a
multiple of n batches.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from dtrain import _core

if TYPE_CHECKING:
    from torch.utils.data import IterableDataset, get_worker_info as _worker_info

    _Base = IterableDataset[Any]
else:
    try:  # an IterableDataset when torch is there, so that DataLoader treats it as one
        from torch.utils.data import IterableDataset as _Base
        from torch.utils.data import get_worker_info as _worker_info
    except ImportError:
        _Base = object

        def _worker_info():
            return None

__all__ = ["ShardedDataset"]

# A TFRecord record's bytes, or a tar sample: {"__key__": key, member's extension: bytes}.
Sample = bytes | dict[str, bytes | str]
_T = TypeVar("_T")
_Shards = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
# The keyword defaults of ShardedDataset: C++'s (dtrain::data::ShardedDatasetOptions).
_DEFAULTS = _core.ShardedDatasetOptions()


def _default_rank_and_size() -> tuple[int, int]:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    # Whichever launcher started this process (dtrain run, torchrun, mpirun, srun, ...), as
    # dtrain.init() reads it.
    identity = _core.launcher_identity()
    return identity["rank"], identity["world_size"]


def _sample(record: _core.Record) -> Sample:
    """A TFRecord record's bytes; a tar sample as WebDataset gives it: {"__key__": key, part: bytes}."""
    data, key, parts = record[0], record[4], record[5]
    if not parts:
        return data
    sample: dict[str, bytes | str] = {"__key__": key}
    view = memoryview(data)
    for name, offset, size in parts:
        sample[name] = bytes(view[offset:offset + size])
    return sample


class ShardedDataset(_Base, Generic[_T]):
    """This rank's records of the files ``shards`` (a path, glob or "@manifest", or a list).

    rank, world_size: default to torch.distributed's when it is initialised, else to what the
    launcher says (``dtrain run``, torchrun, mpirun, srun: as ``dtrain.init()``), else 0 and 1. decode: called on each
    sample (a record's bytes, or a tar sample's dict); what it returns is yielded. on_bad_record: "fail" (raise, naming the file,
    the record and its byte offset) or "skip" (replaced by another record of the epoch and
    listed in ``skipped``). timeout: seconds a record may take to arrive (default DTRAIN_TIMEOUT).
    """

    @overload
    def __init__(self: ShardedDataset[Sample], shards: _Shards, rank: int | None = None,
                 world_size: int | None = None, seed: int = _DEFAULTS.seed,
                 shuffle: bool = _DEFAULTS.shuffle, shuffle_window: int = _DEFAULTS.shuffle_window,
                 drop_last: bool = _DEFAULTS.drop_last, readers: int = _DEFAULTS.readers,
                 prefetch_records: int = _DEFAULTS.prefetch_records,
                 prefetch_bytes: int = _DEFAULTS.prefetch_bytes,
                 on_bad_record: str = _DEFAULTS.on_bad_record, decode: None = None,
                 timeout: float | None = None) -> None: ...

    @overload
    def __init__(self, shards: _Shards, rank: int | None = None, world_size: int | None = None,
                 seed: int = _DEFAULTS.seed, shuffle: bool = _DEFAULTS.shuffle,
                 shuffle_window: int = _DEFAULTS.shuffle_window,
                 drop_last: bool = _DEFAULTS.drop_last, readers: int = _DEFAULTS.readers,
                 prefetch_records: int = _DEFAULTS.prefetch_records,
                 prefetch_bytes: int = _DEFAULTS.prefetch_bytes,
                 on_bad_record: str = _DEFAULTS.on_bad_record,
                 decode: Callable[[Sample], _T] = ..., timeout: float | None = None) -> None: ...

    def __init__(self, shards: _Shards, rank: int | None = None, world_size: int | None = None,
                 seed: int = _DEFAULTS.seed, shuffle: bool = _DEFAULTS.shuffle,
                 shuffle_window: int = _DEFAULTS.shuffle_window,
                 drop_last: bool = _DEFAULTS.drop_last, readers: int = _DEFAULTS.readers,
                 prefetch_records: int = _DEFAULTS.prefetch_records,
                 prefetch_bytes: int = _DEFAULTS.prefetch_bytes,
                 on_bad_record: str = _DEFAULTS.on_bad_record,
                 decode: Callable[[Sample], _T] | None = None,
                 timeout: float | None = None) -> None:
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        default_rank, default_size = _default_rank_and_size()
        self._options: dict[str, Any] = dict(
            shards=[os.fspath(s) for s in shards],
            rank=default_rank if rank is None else int(rank),
            world_size=default_size if world_size is None else int(world_size),
            seed=int(seed), shuffle=bool(shuffle), shuffle_window=int(shuffle_window),
            drop_last=bool(drop_last), readers=int(readers),
            prefetch_records=int(prefetch_records), prefetch_bytes=int(prefetch_bytes),
            on_bad_record=on_bad_record, timeout=timeout)
        self._decode = decode
        self._epoch, self._consumed = 0, 0
        # (pid, workers, worker) -> the C++ dataset of that process and part
        self._readers: dict[tuple[int, int, int], _core.ShardedDataset] = {}
        self._main = self._reader(1, 0)  # opened here: bad paths fail now, in the caller's process

    def _reader(self, workers: int, worker: int) -> _core.ShardedDataset:
        key = (os.getpid(), workers, worker)
        if key not in self._readers:  # after a fork, a worker needs its own reader threads
            o = dict(self._options)
            # Worker w of n reads as sub-rank rank * n + w of world_size * n: the sub-ranks of a
            # rank together take its records, each reading only its own.
            o["rank"], o["world_size"] = o["rank"] * workers + worker, o["world_size"] * workers
            self._readers[key] = _core.ShardedDataset(**o)
        return self._readers[key]

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """The epoch the next iteration reads, from position ``consumed`` (0: all of it)."""
        self._epoch, self._consumed = int(epoch), int(consumed)

    def regroup(self, rank: int, world_size: int) -> None:
        """Makes this dataset rank ``rank`` of ``world_size``: under live recovery the world
        changed (``dtrain.torch.live``, ``hvd.elastic``), and the ranks left deal the rest of the
        epoch among themselves; the files stay open. ``set_epoch(epoch, consumed)`` must follow,
        with the position every rank agreed on (``consumed()`` of the old world). DataLoader
        workers started after it read the new dealing (not ``persistent_workers``)."""
        self._options["rank"], self._options["world_size"] = int(rank), int(world_size)
        for (pid, workers, worker), reader in self._readers.items():
            if pid == os.getpid():
                reader.regroup(int(rank) * workers + worker, int(world_size) * workers)

    def is_padding(self, k: int) -> bool:
        """Whether this rank's ``k``-th sample of the epoch (from the position set_epoch gave,
        as one process iterates it) only pads the ranks to equal counts: one of the epoch's
        first samples again, as in PyTorch's DistributedSampler. Under live recovery give it no
        weight, so that no sample is trained twice."""
        return self._main.is_padding(int(k))

    def __iter__(self) -> Iterator[_T]:
        info = _worker_info()
        reader = self._reader(info.num_workers, info.id) if info else self._main
        reader.set_epoch(self._epoch, self._consumed)
        decode = self._decode
        while True:
            record = reader.next()
            if record is None:
                return
            sample = _sample(record)
            # Without decode, _T is Sample (the first overload of __init__).
            yield decode(sample) if decode else cast(_T, sample)

    def records(self) -> Iterator[tuple[Sample, int, int, int]]:
        """This rank's records of the epoch as (sample, file number, record number, global id)."""
        self._main.set_epoch(self._epoch, self._consumed)
        while True:
            record = self._main.next()
            if record is None:
                return
            yield _sample(record), record[1], record[2], record[3]

    def __len__(self) -> int:
        """This rank's samples in the epoch (from the position set_epoch gave)."""
        left = self.size - min(self._consumed, self.size)
        world: int = self._options["world_size"]
        return left // world if self._options["drop_last"] else -(-left // world)

    def consumed(self, taken: int) -> int:
        """The epoch's position once every rank has taken ``taken`` samples of it."""
        taken = min(int(taken), len(self))
        world: int = self._options["world_size"]
        return min(self.size, min(self._consumed, self.size) + taken * world)

    @property
    def size(self) -> int:
        """Records in all the files."""
        return self._main.size

    @property
    def shards(self) -> list[str]:
        return self._main.shards

    @property
    def skipped(self) -> list[str]:
        """The bad records replaced so far (on_bad_record="skip"), each described."""
        return self._main.skipped
