"""Recovery of a transformer language model's training from the same faults, three ways
(bench/fault_recovery.sh runs them under `dtrain chaos`; docs/fault_tolerance.md): the model of
bench/transformer_lm.py at --layers 14 (52.5M parameters), SGD with momentum, --batch sequences of
--seq tokens per rank per step from a synthetic corpus of --corpus sequences, --epochs epochs.

    dtrain run -n 4 --live --replace 1000 -- python bench/transformer_recovery.py live
        Horovod's elastic API on dtrain (`import dtrain.torch as hvd`): the survivors re-form
        and go on from the step's commit, a replacement takes the state from them
    torchrun --standalone --nproc-per-node 4 --max-restarts 1000 \\
            bench/transformer_recovery.py torchrun
        DDP on gloo; every worker restarts from a torch.save checkpoint in /dev/shm, written
        every --checkpoint-every steps (torch_elastic_fashion_mnist.py's way)
    python bench/transformer_recovery.py torchft
        torchft's Manager and DDP, replica groups of one process each restarted by torchrun and
        healed from a live one (torchft_fashion_mnist.py's launcher; needs torchft)

With DTRAIN_SAMPLE_LOG set (dtrain chaos sets it) every rank appends a line per sample it trains,
`epoch index step attempt` (the attempt: the live world's generation, torchrun's restart count,
torchft's quorum). The first rank prints one `RESULT {json}` line at the end: `final_loss` is
the mean of its last 20 batches' losses, `eval_loss` the trained model's mean loss over the
corpus's first --eval sequences, the same data for every run (the corpus is random tokens: the
loss falls as the model learns them by heart, so there is nothing held out to learn from).
--seed changes the initial weights and the order of the samples, for the spread of fault-free
runs that a faulted run's eval_loss is compared with.
"""
import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import TransformerLM, parameters  # noqa: E402


def arguments():
    import torchft_fashion_mnist
    p = argparse.ArgumentParser()
    p.add_argument("recovery", choices=["live", "torchrun", "torchft"])
    p.add_argument("--layers", type=int, default=14)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    p.add_argument("--corpus", type=int, default=512, help="sequences per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--checkpoint-every", type=int, default=10, help="torchrun: steps")
    p.add_argument("--commit-every", type=int, default=1, help="live: steps")
    p.add_argument("--seed", type=int, default=0, help="initial weights and sample order")
    p.add_argument("--eval", type=int, default=128, help="sequences the final loss is taken on")
    torchft_fashion_mnist.add_launch_arguments(p)
    return p.parse_args()


def sequence(i, seq, vocab=8192):
    """Sequence i of the synthetic corpus: its inputs and next-token targets."""
    t = torch.randint(0, vocab, (seq + 1,), generator=torch.Generator().manual_seed(i))
    return t[:-1], t[1:]


def batch_of(indices, seq):
    pairs = [sequence(int(i), seq) for i in indices]
    return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def sequence_losses(model, x, y):
    """Each sequence's mean token loss."""
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape) \
        .mean(dim=1)


class SampleLog:
    def __init__(self):
        path = os.environ.get("DTRAIN_SAMPLE_LOG")
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None

    def write(self, epoch, indices, step, attempt):
        if self.fd is not None:
            os.write(self.fd, "".join(f"{epoch} {int(i)} {step} {attempt}\n"
                                      for i in indices).encode())


def evaluation_loss(model, a):
    """The mean token loss over the corpus's first a.eval sequences."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for k in range(0, a.eval, 32):
            x, y = batch_of(range(k, min(k + 32, a.eval)), a.seq)
            total += float(sequence_losses(model, x, y).sum())
    return total / max(a.eval, 1)


def result(a, model, world, steps, samples, seconds, recent):
    print("RESULT " + json.dumps({
        "strategy": f"transformer-{a.recovery}", "parameters": parameters_of(a),
        "world_size": world, "steps": steps, "samples_per_sec": samples / max(seconds, 1e-9),
        "final_loss": sum(recent) / max(len(recent), 1),
        "eval_loss": evaluation_loss(model, a)}), flush=True)


def parameters_of(a):
    return parameters(TransformerLM(layers=a.layers))


def model_and_optimizer(a):
    torch.manual_seed(1 + a.seed)
    model = TransformerLM(layers=a.layers)
    return model, torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)


def train_live(a):
    import dtrain.torch as hvd
    from dtrain.torch import live
    hvd.init()
    model, opt = model_and_optimizer(a)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(a.corpus, shuffle=True, seed=a.seed)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0)
    log, recent, trained = SampleLog(), [], [0]

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, a.epochs):
            mine = list(state.sampler)
            for k in range(0, len(mine), a.batch):
                indices = mine[k:k + a.batch]
                # Padding evens out the ranks' last batches after a re-forming: no weight.
                keep = torch.tensor([not state.sampler.is_padding(k + j)
                                     for j in range(len(indices))], dtype=torch.float32)
                x, y = batch_of(indices, a.seq)
                opt.zero_grad()
                loss = (sequence_losses(model, x, y) * keep).sum() / len(indices)
                log.write(state.epoch, [i for i, w in zip(indices, keep) if w], state.step + 1,
                          live.generation())  # before its gradients leave (the example's rule)
                loss.backward()
                opt.step()
                state.sampler.record_batch(k // a.batch, a.batch)
                state.step += 1
                trained[0] += int(keep.sum()) * hvd.size()
                recent[:] = (recent + [loss.item()])[-20:]
                if state.step % a.commit_every == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    start = time.perf_counter()
    train(state)
    if hvd.rank() == 0:
        result(a, model, hvd.size(), state.step, trained[0], time.perf_counter() - start,
               recent)


def train_torchrun(a):
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torch_elastic_fashion_mnist.py says why the store is prefixed by attempt.
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"/attempt_{restart}", agent),
                            rank=rank, world_size=world)
    model, opt = model_and_optimizer(a)
    path = os.path.join("/dev/shm", "transformer-" + os.environ.get("TORCHELASTIC_RUN_ID", "none"),
                        "checkpoint.pt")
    epoch, done, step, recent = 0, 0, 0, []
    if os.path.exists(path):
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        epoch, done, step, recent = state["epoch"], state["batch"], state["step"], state["recent"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    sampler = torch.utils.data.DistributedSampler(range(a.corpus), num_replicas=world, rank=rank,
                                                  shuffle=True, seed=a.seed)
    if rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    log, start, trained = SampleLog(), time.perf_counter(), 0
    while epoch < a.epochs:
        sampler.set_epoch(epoch)
        order = list(sampler)
        batches = (len(order) + a.batch - 1) // a.batch
        for b in range(done, batches):
            indices = order[b * a.batch:(b + 1) * a.batch]
            x, y = batch_of(indices, a.seq)
            opt.zero_grad()
            loss = sequence_losses(ddp, x, y).mean()
            log.write(epoch, indices, step + 1, restart)
            loss.backward()
            opt.step()
            step += 1
            trained += len(indices) * world
            recent = (recent + [loss.item()])[-20:]
            last = b + 1 == batches
            if rank == 0 and (step % a.checkpoint_every == 0 or last):
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "epoch": epoch + 1 if last else epoch, "batch": 0 if last else b + 1,
                            "step": step, "recent": recent}, path + ".tmp")
                os.replace(path + ".tmp", path)
        epoch, done = epoch + 1, 0
    if rank == 0:
        result(a, model, world, step, trained, time.perf_counter() - start, recent)
    dist.destroy_process_group()


def train_torchft(a):
    from torchft import DistributedSampler
    from torchft_fashion_mnist import finish, finished, join_replica_groups

    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    if finished():
        return
    model, opt = model_and_optimizer(a)
    manager, ddp = join_replica_groups(model, opt, "transformer")
    sampler = DistributedSampler(range(a.corpus), replica_rank=group, num_replica_groups=groups,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=a.seed)
    batches = (len(sampler) + a.batch - 1) // a.batch
    log, start, trained, recent, epoch, order = SampleLog(), time.perf_counter(), 0, [], -1, None
    while manager.current_step() < a.epochs * batches:
        step = manager.current_step()  # a group that healed jumps to the quorum's step
        if step // batches != epoch:
            epoch = step // batches
            sampler.set_epoch(epoch)
            order = list(sampler)
        indices = order[(step % batches) * a.batch:(step % batches + 1) * a.batch]
        x, y = batch_of(indices, a.seq)
        manager.start_quorum()
        opt.zero_grad()
        loss = sequence_losses(ddp, x, y).mean()
        loss.backward()
        participating = manager.is_participating()
        if not manager.should_commit():
            continue
        opt.step()
        if participating:  # manager._quorum_id: the same on every member of the step
            log.write(epoch, indices, step + 1, manager._quorum_id)
            trained += len(indices) * manager.num_participants()
            recent = (recent + [loss.item()])[-20:]
    finish()
    if group == 0:
        result(a, model, groups, manager.current_step(), trained, time.perf_counter() - start,
               recent)
    manager.shutdown(wait=False)


def main():
    a = arguments()
    torch.set_num_threads(1)
    if a.recovery == "live":
        train_live(a)
    elif a.recovery == "torchrun":
        train_torchrun(a)
    elif "REPLICA_GROUP_ID" in os.environ:
        train_torchft(a)
    else:
        from torchft_fashion_mnist import launch
        sys.exit(launch(a, script=os.path.abspath(__file__)))


if __name__ == "__main__":
    main()
