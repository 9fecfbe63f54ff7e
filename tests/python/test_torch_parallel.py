"""torch 2.x's own parallelism on backend "dtrain" (tests/python/parallel_workers.py): FSDP2,
ZeRO's stages with torch's tools, DTensor tensor and sequence parallelism, 2-D meshes, redistribution, every pipelining schedule,
distributed checkpoints saved at one world size and layout and loaded at another, DDP around
torch.compile. Each run reaches the losses and weights of one process trained on the whole batch;
FSDP2 runs on gloo too, the path where gloo once summed gradients instead of averaging them
(pytorch#162338), to show the reference agrees."""
import json
import os
import subprocess
import time

import pytest

import harness


def run(world, name, *args, backend="dtrain", timeout=300):
    return harness.run(world, name, *args, backend=backend, timeout=timeout,
                       script="parallel_workers.py")


def check_all(results, text):
    harness.check_ok(results)
    for r in results:
        assert f"rank {r.rank}: {text} checked" in r.out, r.out


@pytest.mark.parametrize("backend", ["dtrain", "gloo"])
@pytest.mark.parametrize("variant", ["reshard", "keep", "bf16", "accumulate"])
def test_fsdp2_trains_as_one_process(variant, backend):
    check_all(run(2, "fsdp2", variant, backend=backend), f"fsdp2 {variant}")


@pytest.mark.parametrize("stage,kind,clip", [(1, "sgd", "0.5"), (1, "adam", "0"), (2, "adam", "0"),
                                             (3, "adamw", "0.5"), (3, "sgd", "0")])
def test_zero_stages_with_torchs_tools_train_as_one_process(stage, kind, clip):
    # ZeRO from Python (docs/python.md): 1 is DDP with ZeroRedundancyOptimizer, 2 and 3 FSDP2
    # keeping or resharding parameters after forward; clip > 0 clips the global norm.
    check_all(run(2, "zero", stage, kind, clip), f"zero {stage} {kind}")


def test_hsdp_on_a_2d_mesh_trains_as_one_process():
    check_all(run(4, "fsdp2", "hsdp"), "fsdp2 hsdp")


@pytest.mark.parametrize("variant", ["tp", "sp"])
def test_tensor_and_sequence_parallel_train_as_one_process(variant):
    check_all(run(2, "tp", variant), variant)


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh():
    check_all(run(4, "fsdp_tp"), "fsdp+tp")


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_redistributes_between_placements(world):
    check_all(run(world, "redistribute"), "redistribute")


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                      "InterleavedZeroBubble", "ZBVZeroBubble"])
def test_pipelining_schedules_train_as_one_process(schedule):
    check_all(run(2, "pipeline", schedule), f"pipeline {schedule}")


def test_distributed_checkpoints_reload_at_another_world_size_and_layout(tmp_path):
    # Saved by FSDP2 on 2 ranks (dcp.save, and dcp.async_save while training goes on); loaded by
    # FSDP2 on 4 ranks, tensor parallelism on 2, and one process holding whole tensors.
    saved = run(2, "dcp_save", tmp_path)
    harness.check_ok(saved)
    assert all(f"rank {r.rank}: dcp saved" in r.out for r in saved), [r.out for r in saved]
    for world, which, layout in [(4, "sync", "fsdp"), (4, "async", "fsdp"), (2, "async", "tp"),
                                 (1, "sync", "plain")]:
        check_all(run(world, "dcp_load", tmp_path, which, layout),
                  f"dcp {which} into {layout} on {world}")


def test_ddp_around_torch_compile_trains_as_one_process():
    check_all(run(2, "compiled_ddp"), "compiled ddp")


def test_a_dtype_the_backend_cannot_reduce_fails_naming_op_dtype_and_rank():
    results = run(2, "partial_dtype", "uint16")
    for r in results:
        assert r.code != 0, r.out
        assert (f"all_reduce on rank {r.rank} of group world cannot reduce UInt16 tensors"
                in r.out), r.out
    # complex tensors travel as pairs of reals (torch views them so): they reduce.
    check_all(run(2, "partial_dtype", "complex64"), "partial complex64")


def test_ranks_that_build_different_meshes_fail_within_the_timeout():
    # Rank 0 builds a 2x2 mesh, the others a 1-D one: rank 0's sub-group never meets its peer,
    # the others' all_gather never meets rank 0. Every rank fails within init's 10 s, naming
    # what it waited for.
    start = time.monotonic()
    results = run(4, "mismatched_mesh", timeout=120)
    took = time.monotonic() - start
    assert all(r.code != 0 for r in results), [r.out for r in results]
    assert took < 60, f"took {took:.0f} s"
    assert "group 1[0,2] rendezvous: rank(s) 1 did not connect" in results[0].out, results[0].out
    for r in results[1:]:
        assert "as collective #1 of group world failed" in r.out, r.out


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                      "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_dtrain_pipeline_plan_checks_torchs_schedules(tmp_path, schedule):
    # dtrain.torch.pipelining exports torch's own description of the schedule (pipeline_order)
    # for 4 ranks and 8 micro-batches; dtrain's verifier runs it.
    plan = tmp_path / "plan.json"
    subprocess.run([harness.PYTHON, "-m", "dtrain.torch.pipelining", schedule, "--ranks", "4",
                    "--microbatches", "8", "-o", str(plan)], check=True, timeout=120,
                   env=harness.env_for(0, 1, 0))
    exported = json.loads(plan.read_text())
    assert exported["ranks"] == 4 and exported["microbatches"] == 8
    p = subprocess.run([os.environ.get("DTRAIN_BIN", "dtrain"), "pipeline-plan", "--check",
                        str(plan), "--quiet"], capture_output=True, text=True, timeout=60)
    # torch 2.15's Schedule1F1B describes its last rank forwarding micro-batches 1..8 (its runtime
    # runs 0..7): the verifier must name that; every other order must verify.
    beyond = [(r, i, a) for r, acts in enumerate(exported["actions"]) for i, a in enumerate(acts)
              if a["microbatch"] >= 8]
    if beyond:
        r, i, a = beyond[0]
        assert p.returncode != 0, p.stdout
        assert f"action {i} of rank {r} has microbatch {a['microbatch']}" in p.stderr, p.stderr
    else:
        assert p.returncode == 0, p.stdout + p.stderr
        assert "bubble" in p.stdout and "peak micro-batches held per rank" in p.stdout, p.stdout
