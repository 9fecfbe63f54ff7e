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
from dtrain import _core

__all__ = ["schedule", "schedules", "verify", "balance", "balance_by_parameters"]


def schedule(name, ranks, microbatches, virtual_stages=1):
    """The verified schedule: a dict with 'actions' ([(op, stage, microbatch), ...] per rank)."""
    return _core.pipeline_schedule(name, ranks, microbatches, virtual_stages)


def schedules():
    """[(name, summary, interleaved)] of the registered schedules."""
    return _core.pipeline_schedules()


def verify(sched, forward=1.0, backward_input=1.0, backward_weight=1.0, transfer=0.0):
    """Runs a schedule (a dict from schedule(), or its JSON) offline: bubble, makespan, peak
    micro-batches per rank, a text chart; 'ok' False and 'error' naming the action when wrong."""
    text = sched["json"] if isinstance(sched, dict) else sched
    return _core.pipeline_verify(text, forward, backward_input, backward_weight, transfer)


def balance(costs, parts):
    """Cut points of contiguous parts whose largest cost is the least possible (each part at
    least one item): part k is items cuts[k] .. cuts[k+1]-1. Items that cost nothing join the
    part before them. The C++ runner's cutting (dtrain/pipeline/balance.h)."""
    return _core.pipeline_balance([float(c) for c in costs], parts)


def balance_by_parameters(model, parts):
    """balance() of an nn.Sequential's children by their parameter counts: stage k is
    ``model[cuts[k]:cuts[k + 1]]`` (a slice keeps the model's parameter names)."""
    return balance([sum(p.numel() for p in m.parameters()) for m in model], parts)
