"""Pipeline parallelism from Python: dtrain's schedules, their verifier and the cutting of a model
into stages; torch.distributed.pipelining runs the stages, on backend "dtrain".

Measured side by side (docs/pipeline.md), torch's schedules on dtrain run as fast as dtrain's own
runner did, so Python has one pipeline runner, torch's; this module holds what torch lacks::

    import torch, torch.distributed as dist, torch.distributed.pipelining as pp
    import dtrain.pipeline

    dist.init_process_group("dtrain")                   # under dtrain run -n 2
    torch.manual_seed(0)
    model = torch.nn.Sequential(...)                    # the same on every rank
    cuts = dtrain.pipeline.balance_by_parameters(model, 2)
    rank = dist.get_rank()
    stage = pp.PipelineStage(model[cuts[rank]:cuts[rank + 1]], rank, 2, torch.device("cpu"))
    schedule = pp.Schedule1F1B(stage, n_microbatches=8, loss_fn=F.cross_entropy)
    schedule.step(x if rank == 0 else None, target=y if rank == 1 else None)

``schedule``/``verify`` give dtrain's schedules and prove any schedule deadlock-free offline
(torch's own too: :mod:`dtrain.torch.pipelining`); the C++ runner (``dtrain::Pipeline``) runs
dtrain's schedules on LibTorch modules.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dtrain import _core

if TYPE_CHECKING:
    from torch.nn import Module

    from dtrain._core import Schedule, ScheduleReport

__all__ = ["schedule", "schedules", "verify", "balance", "balance_by_parameters"]


def schedule(name: str, ranks: int, microbatches: int,
             virtual_stages: int | None = None) -> Schedule:
    """The verified schedule: a dict with 'actions' ([(op, stage, microbatch), ...] per rank).
    virtual_stages (stages per rank, for the interleaved schedules) defaults to the C++
    ScheduleOptions' (include/dtrain/pipeline/schedule.h)."""
    if virtual_stages is None:
        return _core.pipeline_schedule(name, ranks, microbatches)
    return _core.pipeline_schedule(name, ranks, microbatches, virtual_stages)


def schedules() -> list[tuple[str, str, bool]]:
    """[(name, summary, interleaved)] of the registered schedules."""
    return _core.pipeline_schedules()


def verify(sched: Schedule | str, forward: float | None = None,
           backward_input: float | None = None, backward_weight: float | None = None,
           transfer: float | None = None) -> ScheduleReport:
    """Runs a schedule (a dict from schedule(), or its JSON) offline: bubble, makespan, peak
    micro-batches per rank, a text chart; 'ok' False and 'error' naming the action when wrong.
    The costs of each kind of pass and of a transfer default to the C++ verifier's
    (dtrain::pipeline::Costs, include/dtrain/pipeline/verifier.h)."""
    text = sched["json"] if isinstance(sched, dict) else sched
    given = dict(forward=forward, backward_input=backward_input, backward_weight=backward_weight,
                 transfer=transfer)
    return _core.pipeline_verify(text, **{k: v for k, v in given.items() if v is not None})


def balance(costs: Iterable[float], parts: int) -> list[int]:
    """Cut points of contiguous parts whose largest cost is the least possible (each part at
    least one item): part k is items cuts[k] .. cuts[k+1]-1. Items that cost nothing join the
    part before them. The C++ runner's cutting (dtrain/pipeline/balance.h)."""
    return _core.pipeline_balance([float(c) for c in costs], parts)


def balance_by_parameters(model: Iterable[Module], parts: int) -> list[int]:
    """balance() of an nn.Sequential's children by their parameter counts: stage k is
    ``model[cuts[k]:cuts[k + 1]]`` (a slice keeps the model's parameter names)."""
    return balance([sum(p.numel() for p in m.parameters()) for m in model], parts)
