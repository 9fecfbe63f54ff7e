"""Ranks of tests/python/test_pipeline.py: `python3 pipeline_workers.py NAME ARGS...` under the
harness (RANK, WORLD_SIZE, MASTER_ADDR/PORT set). Each prints OK on success."""
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import dtrain
import dtrain.pipeline


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


def my_stages(model, p, v, rank):
    cuts = dtrain.pipeline.balance_by_parameters(model, p * v)
    return [model[cuts[s]:cuts[s + 1]] for s in range(rank, p * v, p)]


def reference(x, y):
    ref = make_model()
    loss = F.cross_entropy(ref(x), y)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in ref.named_parameters()}


def check_grads(stages, ref, what):
    checked = 0
    for stage in stages:
        for name, p in stage.named_parameters():
            want = ref[name]
            diff = (p.grad - want).abs().max().item()
            scale = max(want.abs().max().item(), 1e-6)
            assert diff <= 1e-5 * scale, f"{what}: {name} differs by {diff} (largest {scale})"
            checked += 1
    assert checked > 0, f"{what}: no parameters on this rank"


def grads_match(schedule, virtual_stages):
    """One step of `schedule` for 1, 3 and 8 micro-batches against the unsplit model."""
    v = int(virtual_stages)
    world = dtrain.init()
    for m in (1, 3, 8):
        stages = my_stages(make_model(), world.size, v, world.rank)
        pipe = dtrain.pipeline.Pipeline(stages, world, schedule=schedule, microbatches=m,
                                        virtual_stages=v)
        x, y = batch(7, 16)
        loss = pipe.step(x, y, F.cross_entropy)
        ref_loss, ref = reference(x, y)
        check_grads(stages, ref, f"{schedule} m={m}")
        if pipe.holds_last_stage():
            assert abs(loss.item() - ref_loss) < 1e-5, (loss.item(), ref_loss)
        else:
            assert loss is None
    # Forward only, rows changing: the unsplit model's output on the last stage.
    for rows in (5, 2):
        x, _ = batch(rows, rows)
        out = pipe.forward(x)
        if pipe.holds_last_stage():
            with torch.no_grad():
                assert torch.allclose(out, make_model()(x), atol=1e-6)
        else:
            assert out is None
    print("OK", flush=True)


def pipeline_times_data():
    """4 ranks = 2 stages x 2 replicas, each replica half the batch: one process's training."""
    world = dtrain.init()
    layout = dtrain.ParallelLayout(world, pipeline_stages=2)
    assert (layout.stage, layout.replica) == (world.rank // 2, world.rank % 2), repr(layout)
    stages = my_stages(make_model(), 2, 1, layout.stage)
    pipe = dtrain.pipeline.Pipeline(stages, layout.pipeline_group, schedule="zb-h1",
                                    microbatches=4, data_group=layout.data_group)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x, y = batch(100 + step, 16)
        half = slice(8 * layout.replica, 8 * layout.replica + 8)
        opt.zero_grad()
        pipe.step(x[half], y[half], F.cross_entropy)
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    want = dict(ref.named_parameters())
    for name, p in stages[0].named_parameters():
        diff = (p - want[name]).abs().max().item()
        assert diff < 1e-5, f"{name} differs from one process by {diff}"
    print("OK", flush=True)


def killed_stage():
    """Rank 2 of 4 dies before its second step: every other rank raises, naming it, at once."""
    world = dtrain.init(timeout=60)
    stages = my_stages(make_model(), 4, 1, world.rank)
    pipe = dtrain.pipeline.Pipeline(stages, world, schedule="1f1b", microbatches=4)
    x, y = batch(1, 16)
    pipe.step(x, y, F.cross_entropy)
    # Under 1F1B the first stages end a step last: every rank is done with step 0 before rank 2
    # dies, so that every failure is in step 1.
    world.barrier()
    if world.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        pipe.step(x, y, F.cross_entropy)
    except dtrain.Error as e:
        took = time.monotonic() - started
        text = str(e)
        assert took < 15, f"failed after {took:.1f} s: {text}"
        assert "rank 2" in text and "step 1" in text, text
        print(f"FAILED AS EXPECTED after {took:.2f} s: {text}", flush=True)
        sys.exit(3)
    raise AssertionError("the step after rank 2 died succeeded")


def mismatched_options():
    world = dtrain.init()
    stages = my_stages(make_model(), 2, 1, world.rank)
    try:
        dtrain.pipeline.Pipeline(stages, world, schedule="1f1b",
                                 microbatches=4 if world.rank == 0 else 8)
    except dtrain.InvalidArgumentError as e:
        assert "give every rank the same options" in str(e), str(e)
    else:
        raise AssertionError("different micro-batch counts were accepted")
    pipe = dtrain.pipeline.Pipeline(stages, world, schedule="gpipe", microbatches=4)
    x, y = batch(3, 3)
    try:
        pipe.step(x, y, F.cross_entropy)
    except dtrain.Error as e:
        assert "has 3 rows: it cannot make 4 micro-batches" in str(e), str(e)
    else:
        raise AssertionError("3 rows for 4 micro-batches were accepted")
    print("OK", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
