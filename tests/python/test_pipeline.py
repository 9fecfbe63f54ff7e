"""Pipelines from Python: torch.distributed.pipelining on backend "dtrain", stages cut by
dtrain.pipeline. The example trains as the C++ runner's does, as 2 stages and as 2 stages x 2
replicas; a killed stage fails every rank within seconds; a batch of another shape is named; the
schedules and the verifier are the C++ ones (`dtrain pipeline-plan`). Every torch schedule's
gradients are checked against one process in test_torch_parallel.py."""
import json
import os
import subprocess

import pytest

import harness
import dtrain
import dtrain.pipeline

DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(harness.HERE, "../../build/bin/dtrain"))
EXAMPLE = os.path.join(harness.HERE, "../../examples/python/pipeline_fashion_mnist.py")


def run(world, name, *args, timeout=120):
    return harness.run(world, name, *args, backend=None, timeout=timeout,
                       script="pipeline_workers.py")


def test_a_killed_stage_fails_every_rank_within_seconds():
    results = run(4, "killed_stage", timeout=90)
    for r in results:
        if r.rank == 2:
            assert r.code == -9, r.out
        else:
            assert r.code == 3 and "FAILED AS EXPECTED" in r.out, f"rank {r.rank}:\n{r.out}"


def test_a_batch_of_another_shape_is_refused_naming_both_sizes():
    for r in run(2, "changed_shape", timeout=90):
        assert r.code == 3 and "FAILED AS EXPECTED" in r.out, f"rank {r.rank}:\n{r.out}"


def test_the_schedules_are_the_ones_dtrain_pipeline_plan_prints(tmp_path):
    s = dtrain.pipeline.schedule("zb-h1", 4, 8)
    out = tmp_path / "s.json"
    subprocess.run([DTRAIN, "pipeline-plan", "--schedule", "zb-h1", "--stages", "4",
                    "--microbatches", "8", "--json", str(out), "--quiet"], check=True,
                   capture_output=True)
    written = json.loads(out.read_text())
    assert [[(a["op"], a["stage"], a["microbatch"]) for a in row] for row in written["actions"]] \
        == [list(row) for row in s["actions"]]
    report = dtrain.pipeline.verify(dtrain.pipeline.schedule("1f1b", 4, 8))
    assert report["ok"] and round(report["bubble"], 3) == 0.273
    assert report["peak_microbatches"] == [4, 3, 2, 1]
    # A corrupted schedule is refused, naming the action.
    written["actions"][1] = [a for a in written["actions"][1] if a["op"] != "recv_activation"]
    bad = dtrain.pipeline.verify(json.dumps(written))
    assert not bad["ok"] and bad["error"].startswith("rank 1, action 0 (F0 of stage 1)"), bad
    names = [n for n, _, _ in dtrain.pipeline.schedules()]
    assert names == ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
    assert dtrain.pipeline.balance([0, 5, 0, 1, 1, 1, 1, 1, 0], 2) == [0, 3, 9]
    with pytest.raises(dtrain.InvalidArgumentError, match="unknown"):
        dtrain.pipeline.schedule("2f2b", 2, 4)


def _result(argv):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(not os.path.exists("/usr/share/datasets/fashion-mnist"),
                    reason="dataset-fashion-mnist is not installed")
@pytest.mark.parametrize("world,schedule", [(2, "1F1B"), (4, "GPipe")])
def test_the_example_trains_as_the_cpp_runner_does(world, schedule):
    flags = ["--stages", "2", "--train-samples", "6000"]
    result = _result([DTRAIN, "run", "-n", str(world), "--no-prefix", "--", harness.PYTHON,
                      EXAMPLE, *flags, "--schedule", schedule])
    assert result["stages"] == 2 and result["replicas"] == world // 2
    assert result["test_accuracy"] > 0.6, result
    assert result["final_loss"] < 1.2, result
    # The same model, seed, data order and schedule in C++ (examples/train_pipeline.cc): LibTorch
    # and torch draw the same numbers, so the two train alike, to rounding.
    cpp = os.path.join(os.path.dirname(DTRAIN), "train_pipeline")
    if os.path.exists(cpp):
        theirs = _result([DTRAIN, "run", "-n", str(world), "--no-prefix", "--", cpp,
                          "--threads", "1", *flags, "--schedule", schedule.lower()])
        assert theirs["steps"] == result["steps"], (theirs, result)
        assert abs(theirs["final_loss"] - result["final_loss"]) < 1e-4, (theirs, result)
        assert abs(theirs["test_accuracy"] - result["test_accuracy"]) < 0.005, (theirs, result)
