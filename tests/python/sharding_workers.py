"""Ranks of tests/python/test_sharding.py: `python3 sharding_workers.py NAME ARGS...` under the
harness (RANK, WORLD_SIZE, MASTER_ADDR/PORT set). Each prints OK on success."""
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import dtrain
import dtrain.sharding


def make_model(seed=7):
    """Three units of 144, 272 and 68 parameters: not multiples of 2 or 3, so padded."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step, rows=12):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 8, generator=g), torch.randint(0, 4, (rows,), generator=g)


def mine(t, rank, n):
    per = t.shape[0] // n
    return t[rank * per:(rank + 1) * per]


def optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    return torch.optim.Adam(params, lr=0.01)


def difference(full, ref):
    return max((full[n] - p).abs().max().item() for n, p in ref.named_parameters())


def matches_one_process(stage, kind, clip="0"):
    world = dtrain.init()
    rank, n, stage, clip = world.rank, world.size, int(stage), float(clip)
    sdp = dtrain.sharding.ShardedDataParallel(make_model(), world, stage=stage)
    ref = make_model()
    opt, ref_opt = optimizer(kind, sdp.parameters()), optimizer(kind, ref.parameters())
    for step in range(4):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(sdp(mine(x, rank, n)), mine(y, rank, n)).backward()
        if clip:
            norm = sdp.clip_grad_norm(clip)
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        if clip:
            ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item()
            assert abs(norm - ref_norm) < 1e-5, (norm, ref_norm)
        ref_opt.step()
    diff = difference(sdp.full_parameters(), ref)
    assert diff < 1e-5, f"stage {stage}, {kind}: {diff} from one process"
    print("OK", flush=True)


def no_sync():
    world = dtrain.init()
    rank, n = world.rank, world.size
    for stage in (1, 2, 3):
        sdp = dtrain.sharding.ShardedDataParallel(make_model(), world, stage=stage)
        ref = make_model()
        opt = torch.optim.SGD(sdp.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(2):
            opt.zero_grad()
            ref_opt.zero_grad()
            for micro in range(3):
                x, y = batch(10 * step + micro, 8)
                if micro < 2:
                    with sdp.no_sync():
                        F.cross_entropy(sdp(mine(x, rank, n)), mine(y, rank, n)).backward()
                else:
                    F.cross_entropy(sdp(mine(x, rank, n)), mine(y, rank, n)).backward()
                F.cross_entropy(ref(x), y).backward()
            opt.step()
            ref_opt.step()
        diff = difference(sdp.full_parameters(), ref)
        assert diff < 1e-5, f"stage {stage}: {diff}"
    print("OK", flush=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def one_unit():
    world = dtrain.init()
    rank, n = world.rank, world.size
    net, ref = Net(), Net()
    sdp = dtrain.sharding.ShardedDataParallel(net, world, stage=3)
    assert len(sdp.units()) == 1
    opt, ref_opt = torch.optim.Adam(sdp.parameters(), lr=0.01), torch.optim.Adam(ref.parameters(), lr=0.01)
    for step in range(3):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(sdp(mine(x, rank, n)), mine(y, rank, n)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    assert net.fc1.weight.numel() == 0, "a released parameter holds elements"
    sdp.gather_parameters()
    diff = max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))
    assert diff < 1e-5, diff
    print("OK", flush=True)


def refusals():
    world = dtrain.init()
    model = make_model() if world.rank == 0 else torch.nn.Sequential(torch.nn.Linear(8, 5))
    try:
        dtrain.sharding.ShardedDataParallel(model, world)
    except dtrain.InvalidArgumentError as e:
        assert "ranks [1] have a model that differs from rank 0's" in str(e), str(e)
    else:
        raise AssertionError("different models were accepted")
    model = make_model()
    if world.rank == 1:
        model[0].bias.requires_grad_(False)
    try:
        dtrain.sharding.ShardedDataParallel(model, world)
    except dtrain.InvalidArgumentError as e:
        want = ("parameter '0.bias' does not require grad" if world.rank == 1
                else "ranks [1] refused the model")
        assert want in str(e), str(e)
    else:
        raise AssertionError("a frozen parameter was accepted")
    print("OK", flush=True)


def killed_rank():
    world = dtrain.init()
    sdp = dtrain.sharding.ShardedDataParallel(make_model(), world, stage=3)
    opt = torch.optim.Adam(sdp.parameters(), lr=0.01)
    x, y = batch(0, 6)
    for step in range(3):
        if step == 2 and world.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        try:
            opt.zero_grad()
            F.cross_entropy(sdp(x), y).backward()
            opt.step()
        except dtrain.Error as e:
            took, text = time.monotonic() - started, str(e)
            assert step == 2, f"failed at step {step}: {text}"
            assert took < 15, f"failed after {took:.1f} s: {text}"
            assert "rank 2" in text, text
            print(f"FAILED AS EXPECTED after {took:.2f} s: {text}", flush=True)
            sys.exit(3)
    raise AssertionError("training went on without rank 2")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
