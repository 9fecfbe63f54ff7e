"""Checkpoints from Python (dtrain.torch.CheckpointManager, the C++ format and guarantees) and
exact resume with dtrain.torch.DistributedSampler: a run killed mid-training and resumed ends
bit-identical to one never interrupted; resumed on another number of ranks, every sample of the
epoch is still trained exactly once; the files are plain safetensors."""
import json
import os
import struct

import pytest
import torch

import harness


def run(world, tmp, out, kill_at, kind):
    return harness.run(world, "train", tmp / "ckpt", out, kill_at, kind, backend=None,
                       script="resume_workers.py", timeout=180)


@pytest.mark.parametrize("kind", ["adam", "sgd", "adam-background"])
def test_a_killed_run_resumes_bit_identical(tmp_path, kind):
    straight = tmp_path / "straight"
    straight.mkdir()
    harness.check_ok(run(2, straight, straight / "w.pt", 0, kind))

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    killed = run(2, resumed, resumed / "w.pt", 11, kind)
    assert all(r.code == 17 for r in killed), [(r.code, r.out) for r in killed]
    again = run(2, resumed, resumed / "w.pt", 0, kind)
    harness.check_ok(again)
    assert "resumed from" in again[0].out, again[0].out

    a, b = torch.load(straight / "w.pt"), torch.load(resumed / "w.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {(a[k].float() - b[k].float()).abs().max()}"


def _trained(out, world):
    seen = {}
    for r in range(world):
        path = f"{out}.samples.{r}"
        if os.path.exists(path):
            for line in open(path):
                epoch, *batch = map(int, line.split())
                for i in batch:
                    seen.setdefault(epoch, []).append(i)
    return seen


def test_resuming_on_fewer_ranks_trains_every_sample_once(tmp_path):
    out = tmp_path / "w.pt"
    # 3 ranks, 4 steps of 5 samples each per epoch: the checkpoint of step 3 holds 45 samples of
    # epoch 0; steps 4 and 5 (the first of epoch 1) are lost with the kill.
    killed = run(3, tmp_path, out, -5, "sgd")
    assert all(r.code == 17 for r in killed)
    # What the lost steps trained does not count: keep the samples up to the checkpoint.
    for r in range(3):
        lines = open(f"{out}.samples.{r}").read().splitlines()[:3]
        open(f"{out}.samples.{r}", "w").write("".join(line + "\n" for line in lines))
    resumed = run(1, tmp_path, out, 0, "sgd")  # the other 15 on one rank, then epoch 1
    harness.check_ok(resumed)
    assert "(step 3, epoch 0, 45 samples of it done, saved at world size 3)" in resumed[0].out, \
        resumed[0].out
    seen = _trained(out, 3)
    for epoch in (0, 1):
        counts = {i: seen[epoch].count(i) for i in set(seen[epoch])}
        assert sorted(counts) == list(range(60)), (epoch, sorted(counts))
        assert set(counts.values()) == {1}, (epoch, {i: c for i, c in counts.items() if c != 1})


def test_the_model_file_is_plain_safetensors(tmp_path):
    harness.check_ok(run(1, tmp_path, tmp_path / "w.pt", 0, "adam"))
    newest = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step-"))[-1]
    raw = (newest / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    weights = torch.load(tmp_path / "w.pt")
    # The last checkpoint (step 24 of 24) holds the final weights, under PyTorch's names.
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["step"] == 24, manifest
    for name, tensor in weights.items():
        entry = header[name]
        start, end = entry["data_offsets"]
        dtype = {"F32": torch.float32, "I64": torch.int64}[entry["dtype"]]
        got = torch.frombuffer(bytearray(data[start:end]), dtype=dtype).reshape(entry["shape"])
        assert torch.equal(got, tensor), name
