"""Ranks of tests/python/test_pipeline.py: `python3 pipeline_workers.py NAME ARGS...` under the
harness (RANK, WORLD_SIZE, MASTER_ADDR/PORT set): torch.distributed.pipelining on backend
"dtrain", stages cut by dtrain.pipeline. Each prints OK, or exits 3 after the expected failure."""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
import torch.nn.functional as F

import dtrain.pipeline
import dtrain.torch  # noqa: F401  (registers backend "dtrain")


def make_model():
    """8 Linear layers of changing widths with Tanh between them, from one seed."""
    torch.manual_seed(42)
    widths = [6, 12, 9, 16, 7, 10, 8, 11, 4]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def batch(seed, rows):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 4, (rows,), generator=g)


def pipeline(name="1F1B"):
    """This rank's stage of make_model() cut into one stage per rank, and torch's schedule."""
    dist.init_process_group("dtrain", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    cuts = dtrain.pipeline.balance_by_parameters(model, world)
    stage = pp.PipelineStage(model[cuts[rank]:cuts[rank + 1]], rank, world, torch.device("cpu"))
    schedule = getattr(pp, f"Schedule{name}")(stage, n_microbatches=4, loss_fn=F.cross_entropy)
    return rank, world, schedule


def step(schedule, rank, world, x, y):
    schedule.step(x if rank == 0 else None, target=y if rank == world - 1 else None)


def expect_failure(what, run, says=()):
    started = time.monotonic()
    try:
        run()
    except dist.DistBackendError as e:
        took, text = time.monotonic() - started, str(e)
        assert took < 15, f"{what}: failed after {took:.1f} s: {text}"
        for s in says:
            assert s in text, f"{what}: {s!r} not in: {text}"
        print(f"FAILED AS EXPECTED after {took:.2f} s: {text}", flush=True)
        os._exit(3)  # the group's peers are gone: no orderly shutdown
    raise AssertionError(f"{what} succeeded")


def killed_stage():
    """Rank 2 of 4 dies between steps: every other rank raises within seconds."""
    rank, world, schedule = pipeline("1F1B")
    x, y = batch(1, 16)
    step(schedule, rank, world, x, y)
    dist.barrier()  # every rank is done with the first step before rank 2 dies
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    # Ranks 1 and 3 exchange with rank 2 and name it; rank 0 learns it from rank 1.
    says = ("rank 2",) if rank in (1, 3) else ()
    expect_failure("the step after rank 2 died", lambda: step(schedule, rank, world, x, y), says)


def changed_shape():
    """torch's schedules keep the shapes of their first step; a batch of another size is
    refused on the receiving rank naming both sizes, and every rank fails."""
    rank, world, schedule = pipeline("GPipe")
    x, y = batch(2, 16)
    step(schedule, rank, world, x, y)
    x, y = batch(3, 12)
    # 4 rows of 16 activations expected per micro-batch, 3 sent.
    says = ("256 bytes does not match", "rank 0 sent 192 bytes") if rank == 1 else ()
    expect_failure("a step of 12 rows after one of 16",
                   lambda: step(schedule, rank, world, x, y), says)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
