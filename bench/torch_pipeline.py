"""torch.distributed.pipelining on backend "dtrain" against the same on gloo, on stages of
calibrated cost, in one run, alternating rounds (docs/performance.md, docs/pipeline.md).

    dtrain run -n 2 -- python3 bench/torch_pipeline.py --schedules gpipe,1f1b --rounds 5

Each rank holds one stage: a forward that takes --forward-ms and a backward that takes
--backward-ms (sleeps, so that ranks sharing cores do not slow each other and the time is the
schedule's), on activations of --width floats per sample. A step pushes --microbatches
micro-batches of --batch samples through. For each schedule, torch's (ScheduleGPipe,
Schedule1F1B) over a group on backend dtrain and over one on gloo run --steps steps after a
warm-up, the order of the backends alternating from round to round. Rank 0 prints each one's
median step time [lowest, highest round], the measured bubble (1 - the compute a rank does over
the step time) and the verifier's prediction for the same costs (dtrain pipeline-plan's bubble
with transfer 0).
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

import dtrain.pipeline
import dtrain.torch  # noqa: F401  registers the backend


class _Calibrated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, forward_s, backward_s):
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, grad.sum().reshape(1), None, None


class Stage(torch.nn.Module):
    """A stage whose forward and backward take the given times, whatever the hardware."""

    def __init__(self, forward_s, backward_s):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x):
        return _Calibrated.apply(x, self.weight, self.forward_s, self.backward_s)


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


def run_torch(name, a, rank, world, group):
    import torch.distributed.pipelining as pp
    stage = pp.PipelineStage(Stage(a.forward_ms / 1e3, a.backward_ms / 1e3), rank, world,
                             torch.device("cpu"), group=group)
    cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[name]
    schedule = cls(stage, n_microbatches=a.microbatches, loss_fn=loss_fn)
    x = torch.ones(a.batch * a.microbatches, a.width)
    times = []
    for step in range(a.steps + 1):
        dist.barrier(group=group)
        start = time.perf_counter()
        schedule.step(x if rank == 0 else None, target=x if rank == world - 1 else None)
        if step > 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default="gpipe,1f1b")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--forward-ms", type=float, default=4.0)
    p.add_argument("--backward-ms", type=float, default=8.0)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("dtrain")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {b: dist.new_group(backend=b) for b in ("dtrain", "gloo")}  # the pipeline's own
    results = {}
    for i in range(a.rounds):
        for name in a.schedules.split(","):
            backends = ["dtrain", "gloo"] if i % 2 == 0 else ["gloo", "dtrain"]
            for backend in backends:
                results.setdefault((name, backend), []).append(
                    run_torch(name, a, rank, world, groups[backend]))
    if rank == 0:
        compute = a.microbatches * (a.forward_ms + a.backward_ms) / 1e3
        print(f"# {world} stages, {a.microbatches} micro-batches of {a.batch} x {a.width} floats, "
              f"F {a.forward_ms} ms, B {a.backward_ms} ms, {a.rounds} rounds of {a.steps} steps: "
              f"median step ms [lowest, highest round], measured bubble, verifier's bubble")
        for name in a.schedules.split(","):
            plan = dtrain.pipeline.verify(dtrain.pipeline.schedule(name, world, a.microbatches),
                                          forward=a.forward_ms, backward_input=a.backward_ms,
                                          backward_weight=0.0)
            for backend in ("dtrain", "gloo"):
                v = results[(name, backend)]
                med = statistics.median(v)
                print(f"{name:>6} {backend:>6} {med * 1e3:8.1f} [{min(v) * 1e3:.1f}, "
                      f"{max(v) * 1e3:.1f}]  bubble {1 - compute / med:.3f}  "
                      f"verifier {plan['bubble']:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
