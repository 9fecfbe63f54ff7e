"""The example's training as a torchft user writes it: the Fashion-MNIST ConvNet of
build/bin/train_fashion_mnist (bench/torch_ddp_fashion_mnist.py's), SGD with momentum, batch 100
per replica, in replica groups of one process each. torchft's Manager forms a quorum every step
through its lighthouse; its DistributedDataParallel all-reduces the gradients over its gloo group
of the quorum's members; a step whose all-reduce failed is not committed. A replica group that
torchrun restarts fetches the model and optimizer state from a live one (torchft's HTTP
transport) and takes part from the next step. As torchft's own sampler does, each group keeps
its shard of the data: the shard of a group that is down is not trained meanwhile (torchft
calls its sampler "inherently lossy"); a group that comes back resumes its shard at the quorum's
step. bench/fault_recovery.sh runs it under `dtrain chaos` beside dtrain's own recovery
(docs/fault_tolerance.md).

    dtrain chaos --schedule kill:20s --seed 1 -- python bench/torchft_fashion_mnist.py \\
        --replica-groups 4 --epochs 2

Without REPLICA_GROUP_ID in its environment it is the launcher: it runs the lighthouse and one
`torchrun --max-restarts` per replica group, and ends when they have. With DTRAIN_SAMPLE_LOG set
(dtrain chaos sets it) every replica appends a line per sample of each step it committed,
`epoch index step quorum` (samples of a step that was not committed were not trained). Replica
group 0 prints one `RESULT {json}` line at the end, as train_fashion_mnist does.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.nn.functional as F

from torch_ddp_fashion_mnist import DATA, ConvNet, read_idx


def arguments():
    p = argparse.ArgumentParser()
    add_launch_arguments(p)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def launch(a, script=__file__):
    """Runs the lighthouse and one `torchrun --max-restarts` per replica group of `script`
    (with this process's arguments); returns the highest exit status. Shared with
    bench/transformer_recovery.py."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1,
                                  join_timeout_ms=a.join_timeout_ms,
                                  quorum_tick_ms=a.quorum_tick_ms)
    # Where the groups meet at start and say that training is over.
    job = tempfile.mkdtemp(prefix="torchft-job-")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    groups = []
    for g in range(a.replica_groups):
        env = dict(os.environ, REPLICA_GROUP_ID=str(g), NUM_REPLICA_GROUPS=str(a.replica_groups),
                   TORCHFT_LIGHTHOUSE=lighthouse.address(), TORCHFT_JOB_DIR=job)
        groups.append(subprocess.Popen(
            [torchrun, "--standalone", "--nproc-per-node", "1",
             "--max-restarts", str(a.max_restarts), script] + sys.argv[1:], env=env))
    codes = [p.wait() for p in groups]
    lighthouse.shutdown()
    shutil.rmtree(job, ignore_errors=True)
    return max(codes)


def add_launch_arguments(p):
    p.add_argument("--replica-groups", type=int, default=4)
    p.add_argument("--max-restarts", type=int, default=1000)
    # torchft's README starts its lighthouse with these.
    p.add_argument("--join-timeout-ms", type=int, default=10000)
    p.add_argument("--quorum-tick-ms", type=int, default=100)


def comm_hook(manager, bucket):
    """torchft's DistributedDataParallel hook, but for a failed all-reduce: torchft 0.2.0's
    asserts there (meta-pytorch/torchft#304), and every survivor of a death crashed with it and
    was restarted. The step is not committed (should_commit says so): any value will do."""
    work = manager.allreduce(bucket.buffer())
    work.wait()
    fut = getattr(work.get_future(), "_fut", None)
    if fut is None:
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
    return fut


def join_replica_groups(net, opt, name):
    """This replica group's Manager, with torchft's train_ddp.py's timeouts (5 s for gloo, 30 s
    for the manager), and `net` in torchft's DistributedDataParallel with comm_hook; at the
    job's start, once the other groups' managers are up too."""
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    class Fixed(DistributedDataParallel):
        _comm_hook = staticmethod(comm_hook)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
        load_state_dict=lambda s: (net.load_state_dict(s["model"]),
                                   opt.load_state_dict(s["optimizer"])),
        state_dict=lambda: {"model": net.state_dict(), "optimizer": opt.state_dict()},
        replica_id=f"{name}_{os.environ['REPLICA_GROUP_ID']}", timeout=timedelta(seconds=30))
    model = Fixed(manager, net)
    start_together()
    return manager, model


def finished():
    """Whether a group finished training: one that torchrun restarts after the others finished
    would form a quorum of its own and train from step 0."""
    return os.path.exists(os.path.join(os.environ["TORCHFT_JOB_DIR"], "done"))


def finish():
    open(os.path.join(os.environ["TORCHFT_JOB_DIR"], "done"), "w").close()


def start_together(limit=120):
    """At the job's start (not at a restart), waits until every group's manager heartbeats to
    the lighthouse: the first quorum then waits for all of them. Without it the group that
    imports torch first trains the first steps alone, and those of the others' shards are lost,
    in a run without faults too."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    job, group = os.environ["TORCHFT_JOB_DIR"], os.environ["REPLICA_GROUP_ID"]
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    open(os.path.join(job, f"ready-{group}"), "w").close()
    deadline = time.monotonic() + limit
    while not all(os.path.exists(os.path.join(job, f"ready-{g}")) for g in range(groups)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica group {group}: the other groups' managers did not start "
                               f"within {limit} s (no ready-G files in {job})")
        time.sleep(0.05)


def train(a):
    from torchft import DistributedSampler

    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    if finished():
        return
    torch.set_num_threads(1)
    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz").float().div_(255).unsqueeze(1)
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").long()
    torch.manual_seed(1)
    net = ConvNet()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    manager, model = join_replica_groups(net, opt, "fashion_mnist")
    sampler = DistributedSampler(range(len(images)), replica_rank=group,
                                 num_replica_groups=groups, group_rank=0, num_replicas=1,
                                 shuffle=True, seed=a.seed)
    batches = (len(sampler) + a.batch_size - 1) // a.batch_size
    total = a.epochs * batches
    log_path = os.environ.get("DTRAIN_SAMPLE_LOG")
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log_path else None
    start, trained, recent, epoch, order = time.perf_counter(), 0, [], -1, None
    while manager.current_step() < total:
        # The step decides the batch: a group that healed jumps to the quorum's step.
        step = manager.current_step()
        if step // batches != epoch:
            epoch = step // batches
            sampler.set_epoch(epoch)
            order = torch.tensor(list(sampler))
        b = step % batches
        idx = order[b * a.batch_size:(b + 1) * a.batch_size]
        manager.start_quorum()
        opt.zero_grad()
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        participating = manager.is_participating()
        if not manager.should_commit():
            continue
        opt.step()
        if participating:
            trained += len(idx) * manager.num_participants()
            recent = (recent + [loss.item()])[-20:]
            if log is not None:  # manager._quorum_id: the same on every member of the step
                os.write(log, "".join(f"{epoch} {i} {step + 1} {manager._quorum_id}\n"
                                      for i in idx.tolist()).encode())
    finish()
    seconds = time.perf_counter() - start
    if group == 0:
        print("RESULT " + json.dumps({"strategy": "torchft-ddp", "backend": "gloo",
                                      "world_size": groups, "steps": manager.current_step(),
                                      "images_per_sec": trained / max(seconds, 1e-9),
                                      "final_loss": sum(recent) / max(len(recent), 1)}),
              flush=True)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    args = arguments()
    if "REPLICA_GROUP_ID" in os.environ:
        train(args)
    else:
        sys.exit(launch(args))
