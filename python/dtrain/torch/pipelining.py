"""torch.distributed.pipelining's schedules as dtrain schedules, for ``dtrain pipeline-plan``.

dtrain's verifier runs a schedule's per-rank lists offline: it proves that every receive has its
send and nothing deadlocks, and measures the bubble and the micro-batches each rank holds
(docs/pipeline.md). torch describes each of its schedules the same way (``pipeline_order``: per
rank, the forward and backward passes in order), so any of them can be checked::

    python -m dtrain.torch.pipelining ZBVZeroBubble --ranks 4 --microbatches 8 -o zbv.json
    dtrain pipeline-plan --check zbv.json

or, in a script that built its schedule: ``open("plan.json", "w").write(to_json(schedule))``.
The command builds the schedule in this process alone, over torch's fake process group (the
schedule's order depends only on the ranks, stages and micro-batches).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import (PipelineScheduleMulti,
                                                        PipelineScheduleSingle, _Action)

    _Schedule = PipelineScheduleSingle | PipelineScheduleMulti

# torch's pass kinds -> dtrain's; the others (REDUCE_GRAD, UNSHARD, ...) are not passes.
_OPS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


def _passes(action: _Action | None) -> list[tuple[str, int, int | None]]:
    """The compute passes of one of torch's actions (an overlapped pair gives both, in order)."""
    if action is None:
        return []
    if action.sub_actions:
        return [p for sub in action.sub_actions for p in _passes(sub)]
    op = _OPS.get(action.computation_type.value)
    return [] if op is None else [(op, action.stage_index, action.microbatch_index)]


def to_dict(schedule: _Schedule) -> dict[str, Any]:
    """The schedule (a torch pipelining schedule object) in dtrain's JSON form, as a dict."""
    order = schedule.pipeline_order
    if not order:
        raise ValueError(f"{type(schedule).__name__} has no pipeline_order to export")
    ranks = len(order)
    actions = [[{"op": op, "stage": st, "microbatch": mb}
                for a in order[r] for op, st, mb in _passes(a)] for r in range(ranks)]
    placement = getattr(schedule, "stage_index_to_group_rank", None)
    if not placement:  # single-stage schedules: stage r on rank r
        placement = {a["stage"]: r for r, acts in enumerate(actions) for a in acts}
    stages = max(placement) + 1
    return {"schedule": type(schedule).__name__, "ranks": ranks,
            "virtual_stages": stages // ranks, "microbatches": schedule._n_microbatches,
            "placement": [placement[s] for s in range(stages)], "actions": actions}


def to_json(schedule: _Schedule) -> str:
    return json.dumps(to_dict(schedule), indent=1)


def build(name: str, ranks: int, microbatches: int, stages_per_rank: int) -> _Schedule:
    """torch's Schedule<name> for `ranks` ranks, in this process (rank 0 of a fake group)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pp
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cls = getattr(pp, f"Schedule{name}", None)
    if cls is None:
        have = sorted(n[len("Schedule"):] for n in dir(pp) if n.startswith("Schedule"))
        raise SystemExit(f"torch {torch.__version__} has no Schedule{name}; it has {', '.join(have)}")
    multi = issubclass(cls, pp.schedules.PipelineScheduleMulti)
    per = stages_per_rank if multi else 1
    n = ranks * per
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)

    def make(ids: list[int]) -> _Schedule:
        stages = [pp.PipelineStage(torch.nn.Identity(), i, n, torch.device("cpu")) for i in ids]
        made: _Schedule = cls(stages if multi else stages[0], n_microbatches=microbatches,
                              loss_fn=lambda out, target: out.sum())
        return made

    schedule = make([k * ranks for k in range(per)])  # round robin, unless it places its own
    mapping = getattr(schedule, "stage_index_to_group_rank", None)
    if mapping:
        own = sorted(s for s, r in mapping.items() if r == 0)
        if own != [k * ranks for k in range(per)]:
            schedule = make(own)
    return schedule


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("schedule", help="torch's schedule class without 'Schedule': GPipe, 1F1B, "
                                    "Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
                                    "ZBVZeroBubble, DualPipeV ...")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--stages-per-rank", type=int, default=2,
                   help="for the schedules with several stages per rank")
    p.add_argument("-o", "--output", help="write here (default: standard output)")
    a = p.parse_args(argv)
    text = to_json(build(a.schedule, a.ranks, a.microbatches, a.stages_per_rank))
    if a.output:
        with open(a.output, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
