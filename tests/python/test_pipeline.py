"""dtrain.pipeline: torch modules as pipeline stages over real processes. Every schedule's
gradients equal the unsplit model's; pipeline x data parallel trains as one process; a killed
stage fails every rank naming it; the schedules are the C++ ones (`dtrain pipeline-plan`)."""
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


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_gradients_equal_the_unsplit_models(schedule, ranks):
    v = 2 if schedule == "interleaved-1f1b" else 1
    for r in run(ranks, "grads_match", schedule, v):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_pipeline_times_data_parallel_trains_as_one_process():
    for r in run(4, "pipeline_times_data"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_a_killed_stage_fails_every_rank_naming_it():
    results = run(4, "killed_stage", timeout=60)
    for r in results:
        if r.rank == 2:
            assert r.code == -9, r.out
        else:
            assert r.code == 3 and "FAILED AS EXPECTED" in r.out, f"rank {r.rank}:\n{r.out}"


def test_mismatched_options_and_small_batches_are_named():
    for r in run(2, "mismatched_options"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


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
def test_the_example_learns_as_two_stages_and_as_the_cpp_example_does():
    flags = ["--stages", "2", "--train-samples", "6000"]
    result = _result([DTRAIN, "run", "-n", "2", "--no-prefix", "--", harness.PYTHON, EXAMPLE,
                      *flags])
    assert result["stages"] == 2 and result["replicas"] == 1
    assert result["test_accuracy"] > 0.65, result
    assert result["final_loss"] < 1.2, result
    # The same model, seed, data order and schedule in C++ (examples/train_pipeline.cc): LibTorch
    # and torch draw the same numbers, so the two train alike, to rounding.
    cpp = os.path.join(os.path.dirname(DTRAIN), "train_pipeline")
    if os.path.exists(cpp):
        theirs = _result([DTRAIN, "run", "-n", "2", "--no-prefix", "--", cpp, "--threads", "1",
                          *flags])
        assert abs(theirs["final_loss"] - result["final_loss"]) < 1e-4, (theirs, result)
        assert abs(theirs["test_accuracy"] - result["test_accuracy"]) < 0.005, (theirs, result)
