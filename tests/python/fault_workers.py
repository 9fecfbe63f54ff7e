"""A job with one fault in it, for test_doctor.py (run under `dtrain run` with
DTRAIN_HANG_SECONDS): each step all-reduces a gradient and a loss, through torch.distributed on
backend "dtrain" or through the Horovod API (`import dtrain.torch as hvd`: the gradient with the
blocking allreduce, the loss with allreduce_async and synchronize, a metric's usual pattern).

    python fault_workers.py torch|hvd none|skip|compute|order|p2p|slow|raise [STEPS]

  skip     rank 1 skips step 6's all-reduce (torch: of the gradient, and waits for a message from
           rank 0 instead; hvd: of the loss, and goes on to the next step's gradient)
  compute  rank 1 computes (sleeps) for 10 minutes before step 6's all-reduce
  order    from step 6, rank 1 calls its two all-reduces in the other order
  p2p      (torch) at step 6, ranks 0 and 1 both receive from each other first: a deadlock
  slow     rank 1 computes 3x as long as the others every step (30 ms against 10 ms)
  raise    rank 1 raises an exception before step 6's all-reduce

Each rank prints "HANG <time>" when it reaches step 6, and rank 0 "DONE" at the end.
"""
import sys
import time

import torch


def main(frontend, fault, steps=10):
    if frontend == "hvd":
        import dtrain.torch as hvd
        hvd.init()
        rank = hvd.rank()

        def reduce(t, name):
            if name == "loss":
                hvd.synchronize(hvd.allreduce_async(t, name=name))
            else:
                hvd.allreduce(t, name=name)

        def receive(t):
            raise ValueError("the Horovod API has no point to point")
    else:
        import torch.distributed as dist
        import dtrain.torch  # noqa: F401  registers the backend
        dist.init_process_group("dtrain")
        rank = dist.get_rank()

        def reduce(t, name):
            dist.all_reduce(t)

        def receive(t, src, tag=0):
            dist.recv(t, src=src, tag=tag)
    grad, loss = torch.ones(256), torch.ones(4)
    for step in range(1, steps + 1):
        time.sleep(0.03 if fault == "slow" and rank == 1 else 0.01)
        if step == 6:
            print(f"HANG {time.time():.3f}", flush=True)
        faulty = step == 6 and rank == 1
        if fault == "compute" and faulty:
            time.sleep(600)
        if fault == "raise" and faulty:
            raise RuntimeError("rank 1 gives up")
        if fault == "skip" and faulty:
            if frontend == "torch":
                receive(grad, 0, 7)
            else:
                reduce(grad, "grad")
            continue
        if fault == "p2p" and step == 6 and rank < 2:
            receive(grad, 1 - rank)
            dist.send(grad, dst=1 - rank)
        if fault == "order" and step >= 6 and rank == 1:
            reduce(loss, "loss")  # out of order
            reduce(grad, "grad")
            continue
        reduce(grad, "grad")  # in order
        reduce(loss, "loss")
    if rank == 0:
        print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
