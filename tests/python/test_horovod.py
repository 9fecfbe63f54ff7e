"""The Horovod-compatible API (`import dtrain.torch as hvd`) in real processes over real sockets
(tests/python/harness.py): every function against values computed locally at world sizes 1-4,
the DistributedOptimizer against plain SGD on locally combined gradients, join, errors, and a
Horovod-style training script under dtrain run and mpirun."""
import copy
import json
import os
import re
import subprocess
import threading

import pytest
import torch

import harness

ROOT = os.path.normpath(os.path.join(harness.HERE, "..", ".."))
DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build/bin/dtrain"))
EXAMPLE = os.path.join(ROOT, "examples/python/horovod_fashion_mnist.py")


def hvd(world, name, *args, timeout=180, env=None):
    return harness.run(world, name, *args, backend=None, script="hvd_workers.py",
                       timeout=timeout, env=env)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_collective_matches_local_values(world):
    results = hvd(world, "collectives")
    harness.check_ok(results)
    assert all("every collective checked" in r.out for r in results)


@pytest.mark.parametrize("variant", ["average", "sum", "accumulate", "fp16", "predivide",
                                     "subclass"])
def test_distributed_optimizer_steps_as_sgd_on_the_combined_gradients(variant):
    harness.check_ok(hvd(3, "optimizer", variant))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_distributed_optimizer_at_other_world_sizes(world):
    harness.check_ok(hvd(world, "optimizer", "average"))


def test_the_api_on_a_device_trains_as_one_process():
    # device_workers.py's horovod: the collectives, and the DistributedOptimizer with the state
    # broadcast, against one process. The GPU check (scripts/gpu_check.sh) runs it with cuda.
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "device_workers.py"), "horovod", "cpu"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert f"rank {r}: horovod on cpu checked" in p.stdout, p.stdout


def test_the_timeline_records_the_coordinator_and_the_optimizer(tmp_path):
    trace = tmp_path / "trace.json"
    harness.check_ok(hvd(2, "optimizer", "average", env={"DTRAIN_TIMELINE": str(trace)}))
    for r in range(2):
        events = json.loads((tmp_path / f"trace.rank{r}.json").read_text())
        names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict)
                                          else events)}
        assert "synchronize gradients" in names, names
        assert any(n and n.startswith("allreduce of") for n in names), names


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_that_run_out_of_data_join(world):
    harness.check_ok(hvd(world, "join"))


@pytest.mark.parametrize("world", [1, 3])
def test_wrong_use_fails_with_the_cause(world):
    harness.check_ok(hvd(world, "errors"))


@pytest.mark.parametrize("world", [2, 3])
def test_calls_that_differ_fail_on_every_rank_and_the_session_goes_on(world):
    results = hvd(world, "negotiation")
    harness.check_ok(results)
    assert all("negotiation checked" in r.out for r in results)


@pytest.mark.parametrize("world", [2, 3])
def test_a_joined_rank_takes_part_in_blocking_allreduces(world):
    harness.check_ok(hvd(world, "joined_calls"))


def test_sparse_gradients_reduce_through_the_distributed_optimizer():
    harness.check_ok(hvd(2, "sparse_optimizer"))


def test_a_tensor_missing_on_other_ranks_fails_every_rank_naming_it():
    harness.check_ok(hvd(2, "stall", env={"DTRAIN_STALL_TIMEOUT": "1"}, timeout=60))


@pytest.mark.parametrize("kind", ["blocking", "async"])
def test_ctrl_c_interrupts_a_wait(kind):
    code, out, seconds = harness.interrupt_rank0("hvd_workers.py", "interrupted", kind)
    assert code == 0 and "interrupted" in out, out
    assert seconds < 5, out


@pytest.mark.parametrize("variable,value,says", [
    ("DTRAIN_CYCLE_TIME_MS", "nan", "is out of range"),
    ("DTRAIN_CYCLE_TIME_MS", "1e300", "is out of range"),
    ("HOROVOD_FUSION_THRESHOLD", "64M", "is not a number"),
    ("DTRAIN_STALL_TIMEOUT", "-1", "is out of range"),
])
def test_bad_tuning_variables_are_refused_by_name(variable, value, says):
    results = hvd(1, "collectives", env={variable: value}, timeout=60)
    assert results[0].code != 0
    assert f"{variable}={value!r} {says}" in results[0].out, results[0].out


def _launcher_env():
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _accuracy(text):
    found = re.findall(r"test accuracy ([0-9.]+)", text)
    assert found, text
    return float(found[-1])


def _small_elastic_state(optimizer="sgd"):
    """In one process (save() and restore() need no group): a model with buffers (BatchNorm's),
    its optimizer (SGD with momentum, or _DataSGD), their TorchState, and a forward and backward
    pass on random data."""
    import dtrain.torch as hvd
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else _DataSGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model, opt, step=0)

    def forward_backward():
        opt.zero_grad()
        model(torch.randn(8, 4)).square().sum().backward()

    return model, opt, state, forward_backward


def test_elastic_state_commits_into_its_last_copy_and_restores_it_after_two_failures():
    model, opt, state, forward_backward = _small_elastic_state()

    def train_step():
        forward_backward()
        opt.step()
        state.step += 1

    def snapshot():
        return ({k: v.clone() for k, v in model.state_dict().items()},
                [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()])

    train_step()
    state.save()
    first = [t.data_ptr() for t in state._saved.model.values()]
    train_step()
    state.save()
    committed, step = snapshot(), state.step
    # The second commit went into the first one's tensors.
    assert [t.data_ptr() for t in state._saved.model.values()] == first
    for _ in range(2):  # fails twice before the next commit
        train_step()
        state.restore()
        now = snapshot()
        assert state.step == step
        for k, v in committed[0].items():
            assert torch.equal(now[0][k], v), k
        for a, b in zip(now[1], committed[1]):
            assert torch.equal(a, b)


class _DataSGD(torch.optim.Optimizer):
    """Plain SGD written through `.data`, as older optimizers are: no version counter moves."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.data.add_(p.grad, alpha=-group["lr"])


@pytest.mark.parametrize("optimizer", ["sgd", "data"])
def test_elastic_state_under_live_commits_light_and_goes_back_to_a_whole_commit_when_stepped(
        monkeypatch, optimizer):
    # In one process, as under `dtrain run --live`: the first commit copies the whole state, the
    # next ones (a step apart) only the buffers and settings. A failure before the optimizer step
    # returns to the light commit with nothing copied; one after it, to the whole commit.
    monkeypatch.setenv("DTRAIN_LIVE", "1")
    model, opt, state, forward_backward = _small_elastic_state(optimizer)

    def commit():
        state._commit_count += 1  # as commit() does, without its launcher
        state.save()

    def snapshot():
        return {k: v.clone() for k, v in model.state_dict().items()}, copy.deepcopy(
            opt.state_dict()["state"])

    forward_backward()
    opt.step()
    state.step = 1
    commit()
    whole, whole_state = snapshot()
    assert state._saved.versions is None
    for step in (2, 3):
        forward_backward()
        opt.step()
        state.step = step
        commit()
    light, light_state = snapshot()
    assert state._saved.versions is not None and state._saved.number == 3
    assert set(state._saved.model) == {k for k, _ in model.named_buffers()}

    forward_backward()  # fails before the step: the buffers moved, the parameters did not
    state.step = 99
    params = [p.data_ptr() for p in model.parameters()]
    state.restore()
    assert (state.step, state._commit_count) == (3, 3)
    assert [p.data_ptr() for p in model.parameters()] == params
    now, now_state = snapshot()
    for k, v in light.items():
        assert torch.equal(now[k], v), k

    forward_backward()
    opt.step()  # fails after the step: back to the whole commit
    state.restore()
    assert (state.step, state._commit_count) == (1, 1)
    now, now_state = snapshot()
    for k, v in whole.items():
        assert torch.equal(now[k], v), k
    assert now_state.keys() == whole_state.keys()
    for i, kept in whole_state.items():
        for name, v in kept.items():
            assert torch.equal(now_state[i][name], v), (i, name)
    # This loop changes the state before its commits: they are whole from now on.
    forward_backward()
    opt.step()
    commit()
    assert state._saved.versions is None


def test_elastic_state_that_received_its_state_commits_light_and_is_stale_once_stepped(
        monkeypatch):
    # A newcomer (a spare taken in) receives the state in sync() from the ranks holding the
    # newest commit: its commit there is light, with no whole one of its own to go back to. A
    # failure before its optimizer step returns to it; one after leaves it stale (-1, as a rank
    # taken in again), for the holders to give it the state again. Its first whole commit comes
    # at the next multiple of WHOLE_EVERY, with the others'.
    import dtrain.torch as hvd
    monkeypatch.setenv("DTRAIN_LIVE", "1")
    model, opt, state, forward_backward = _small_elastic_state()
    forward_backward()
    opt.step()  # its optimizer state, as sync() hands it over
    state.step = 27
    state._commit_count = hvd.elastic.WHOLE_EVERY * 2 + 7
    state._save(received=True)
    assert state._saved.versions is not None and state._whole is None
    buffers = {k: v.clone() for k, v in model.named_buffers()}

    forward_backward()  # fails before the step: back to the light commit
    state.step = 99
    state.restore()
    assert (state.step, state._commit_count) == (27, hvd.elastic.WHOLE_EVERY * 2 + 7)
    for k, v in model.named_buffers():
        assert torch.equal(v, buffers[k]), k

    for _ in range(2):  # light, then whole at the multiple
        forward_backward()
        opt.step()
        state._commit_count += 1
        state.save()
    assert state._saved.versions is not None and state._whole is None
    forward_backward()
    opt.step()
    state._commit_count += 1
    state.save()
    assert state._saved.versions is None and state._whole is state._saved
    assert state._saved.number == hvd.elastic.WHOLE_EVERY * 3

    state = hvd.elastic.TorchState(model, opt, step=0)
    state._commit_count = 5
    state._save(received=True)
    forward_backward()
    opt.step()  # fails after the step: stale, and nothing to load
    params = [p.clone() for p in model.parameters()]
    state.restore()
    assert state._commit_count == -1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    forward_backward()
    opt.step()
    state._commit_count = 6
    state.save()  # whole from now on: its loop changes the state before committing
    assert state._saved.versions is None


def test_elastic_state_resumes_a_restarted_job_from_its_commit(tmp_path):
    # Uninterrupted: no elastic launcher, commits stay in the process.
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "hvd_workers.py"), "elastic",
                        str(tmp_path / "straight.pt"), "0"],
                       env=_launcher_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # Rank 1 dies after step 7; dtrain run restarts both, which resume from the newest commit,
    # the sampler's position with it: the same batches as the straight run, the same weights.
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--max-restarts", "1", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "hvd_workers.py"), "elastic",
                        str(tmp_path / "restarted.pt"), "7"],
                       env=_launcher_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resumed from commit" in p.stdout, p.stdout + p.stderr
    # The agent learns it from the round's store (dtrain.torch.elastic announces it).
    assert re.search(r"round 1: rank [01] resumed from commit [0-9]+ .*, training again "
                     r"[0-9.]+ s after round 0 stopped", p.stderr), p.stderr
    a = torch.load(tmp_path / "straight.pt")
    b = torch.load(tmp_path / "restarted.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _live_reference(worlds):
    """The live worker's weights and steps, computed in one process: for each (world size,
    steps) of `worlds`, that many steps over the world's shares of the rest of the epoch (steps
    None: to its end), each step averaging the ranks' gradients."""
    import hvd_workers
    from dtrain import _torch
    x, y = hvd_workers.live_dataset()
    model = hvd_workers._model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    position = done = 0
    for world, steps in worlds:
        samplers = [_torch.DistributedSampler(hvd_workers.LIVE_SAMPLES, world, r, True, 3, False)
                    for r in range(world)]
        for sampler in samplers:
            sampler.set_epoch(0, position)
        batches = [hvd_workers.live_batches(list(s.indices())) for s in samplers]
        steps = len(batches[0]) if steps is None else steps
        for k in range(steps):
            grads = []
            for own in batches:
                model.zero_grad()
                torch.nn.functional.mse_loss(model(x[own[k]]), y[own[k]]).backward()
                grads.append([p.grad.clone() for p in params])
            for i, p in enumerate(params):
                p.grad = torch.stack([g[i] for g in grads]).mean(0)
            opt.step()
        position = samplers[0].consumed(steps * hvd_workers.LIVE_BATCH)
        done += steps
    return model.state_dict(), done


def _trained_once(tmp_path, logs, dead, resumed_at):
    """Every sample of the epoch, once, in the steps the job kept: the lines of `logs`, of the
    dead rank's only up to `resumed_at` (its last commit may be one the others never made, and
    is then trained again by them); a step trained again after a re-forming counts in its newest
    generation only."""
    steps = {}  # step: {generation: samples trained}
    for name in logs:
        for line in (tmp_path / f"samples.{name}").read_text().splitlines():
            step, generation, samples, padding = re.fullmatch(
                r"step ([0-9]+) generation ([0-9]+) samples ([0-9,]+) padding ([0-9,]*)",
                line).groups()
            if name == str(dead) and int(step) > resumed_at:
                continue
            kept = [int(i) for i in samples.split(",")]
            for i in (int(i) for i in padding.split(",") if i):
                kept.remove(i)
            steps.setdefault(int(step), {}).setdefault(int(generation), []).extend(kept)
    trained = [i for by_generation in steps.values()
               for i in by_generation[max(by_generation)]]
    assert sorted(trained) == list(range(90)), sorted(trained)


def _live_run(tmp_path, *args, step_ms=0, late=(-1, 0), metric=False, spare_first=False):
    env = _launcher_env()
    if spare_first:  # rank 1 dies only once the spare is ready (hvd_workers._wait_for_the_spare)
        env["HVD_TEST_SPARE_FIRST"] = "1"
    return subprocess.run([DTRAIN, "run", "-n", "3", "--live", *args, "--", harness.PYTHON,
                           os.path.join(harness.HERE, "hvd_workers.py"), "live_elastic",
                           str(tmp_path), "1", "4", str(step_ms), *map(str, late),
                           "1" if metric else "0"],
                          env=env, capture_output=True, text=True, timeout=300)


def test_hvd_elastic_recovers_live_when_a_rank_dies(tmp_path):
    # Rank 1 of 3 SIGKILLs itself after its commit of step 4: ranks 0 and 2 re-form without
    # restarting, go on from the newest commit over the rest of the epoch, and end with the
    # weights of a run whose first steps had 3 ranks and the rest 2, each sample trained once.
    # Their commits of steps 3 and 4 were light (no parameter copied): the survivors hold the
    # state they went on from.
    p = _live_run(tmp_path)
    resumed_at = harness.survivors_went_on(p)
    text = p.stdout + p.stderr
    expected, steps = _live_reference([(3, resumed_at), (2, None)])
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 2, text
    a, b = (torch.load(tmp_path / f"weights.{r}") for r in (0, 2))
    for k in expected:
        assert torch.equal(a[k], b[k]), k
        assert torch.allclose(a[k], expected[k], rtol=1e-5, atol=1e-6), (k, a[k], expected[k])
    _trained_once(tmp_path, ["0", "1", "2"], 1, resumed_at)


def test_hvd_elastic_survivors_that_stepped_past_a_light_commit_go_back_to_a_whole_one(tmp_path):
    # Each step all-reduces a metric after the optimizer step; rank 1 dies just before that in
    # step 5, so both survivors fail having stepped past their commit of step 4, a light one
    # (its parameters not copied): they go back to the last whole commit (at start, the
    # first of every WHOLE_EVERY) and train on from it, each sample once.
    p = _live_run(tmp_path, metric=True)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "2 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text
    resets = re.findall(r"at start: reset at step ([0-9]+), now rank [0-9] of 2", p.stdout)
    assert resets == ["0", "0"], text
    expected, steps = _live_reference([(2, None)])
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 2, text
    a, b = (torch.load(tmp_path / f"weights.{r}") for r in (0, 2))
    for k in expected:
        assert torch.equal(a[k], b[k]), k
        assert torch.allclose(a[k], expected[k], rtol=1e-5, atol=1e-6), (k, a[k], expected[k])
    _trained_once(tmp_path, ["0", "2"], 1, 0)


def _can_leave_idle_priority():
    """Whether a thread of this process may go from SCHED_IDLE back to SCHED_OTHER."""
    can = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            can.append(True)
        except OSError:
            can.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return can[0]


@pytest.mark.parametrize("how,preload", [("replace", False), ("spares", False),
                                         ("replace", True), ("spares", True)])
def test_hvd_elastic_takes_in_a_replacement_for_a_dead_rank(tmp_path, how, preload):
    # As above, with `--replace 1`: a new rank 1 starts, is taken in at a commit, receives the
    # state from the others and trains the rest of the epoch with them: 3 ranks, 2, then 3. With
    # `--spares 1` the new rank 1 is a process started with the others, its model built, which
    # waited for a place. With `--preload torch` either is forked from a process that imported
    # torch (launch/fork_server.h), and its script finds torch imported.
    args = [f"--{how}", "1"] + (["--preload", "torch"] if preload else [])
    p = _live_run(tmp_path, *args, step_ms=600,  # time for a Python process to start
                  spare_first=how == "spares")
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert ("the fork server (pid" in p.stderr) == preload, text
    if how == "replace":
        assert "started a replacement for rank 1" in p.stderr, text
        assert ("rank 1 at start, a replacement: in the world after init(): False, torch "
                f"imported before the script: {preload}") in p.stdout, text
    else:
        assert re.search(r"spare 1 \(pid [0-9]+\) takes the place of rank 1; the others take it "
                         r"in at a step boundary", p.stderr), text
        assert ("[spare 1] spare 1: built its model, in the world: False, torch imported before "
                f"the script: {preload}") in p.stdout, text
        # Its place's: RANK and LOCAL_RANK, for Python's readers too.
        assert "[rank 1] spare 1: now rank 1 at start, local rank 1, rank 1 of 3" in p.stdout, text
        # It got ready at the idle CPU priority, which the launcher raises when it gives it a
        # place (launch/idle_priority.h); a launcher without that right never lowers it.
        waiting = "['idle']" if _can_leave_idle_priority() else "['other']"
        assert f"[spare 1] spare 1: its threads' CPU policies while it waits: {waiting}" in \
            p.stdout, text
        assert "[rank 1] spare 1: its threads' CPU policies in its place: ['other']" in \
            p.stdout, text
    assert "3 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text
    resumed_at = harness.resumed_at(p)
    taken = set(re.findall(r"took in rank\(s\) \[1\] at start at commit ([0-9]+); now rank "
                           r"[0-9] of 3", p.stdout))
    assert len(taken) == 1, text
    taken_at = int(taken.pop())
    expected, steps = _live_reference([(3, resumed_at), (2, taken_at - resumed_at), (3, None)])
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 3, text
    weights = [torch.load(tmp_path / f"weights.{r}") for r in (0, 1, 2)]
    for k in expected:
        assert torch.equal(weights[0][k], weights[1][k]), k
        assert torch.equal(weights[0][k], weights[2][k]), k
        assert torch.allclose(weights[0][k], expected[k], rtol=1e-5, atol=1e-6), k
    _trained_once(tmp_path, ["0", "1", "1r", "2"], 1, resumed_at)


def test_preload_leaves_out_a_module_whose_thread_goes_on_across_a_fork(tmp_path):
    # A module that starts a thread of its own at import: a fork could copy a lock that thread
    # holds. The fork server refuses it, the launcher says so, and the spare starts as the workers
    # did, then takes the dead rank's place.
    (tmp_path / "threaded_at_import.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    env = _launcher_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    env["HVD_TEST_SPARE_FIRST"] = "1"  # rank 1 dies once the spare is ready
    p = subprocess.run([DTRAIN, "run", "-n", "3", "--live", "--spares", "1", "--preload",
                        "threaded_at_import", "--", harness.PYTHON,
                        os.path.join(harness.HERE, "hvd_workers.py"), "live_elastic",
                        str(tmp_path), "1", "4", "600", "-1", "0", "0"],
                       env=env, capture_output=True, text=True, timeout=300)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert ("dtrain run: --preload: importing threaded_at_import started 1 thread(s) (python) "
            "that go on across a fork") in p.stderr, text
    assert "spares and replacements start as the workers did" in p.stderr, text
    assert ("[spare 1] spare 1: built its model, in the world: False, torch imported before "
            "the script: False") in p.stdout, text
    assert "3 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text


def test_hvd_elastic_takes_back_a_rank_left_out_with_the_others_state(tmp_path):
    # Rank 1 dies after its commit of step 4; rank 2 re-forms 6 s late (stopped or cut off
    # meanwhile): rank 0 goes on alone after the settle time (5 s), then takes rank 2 in again
    # at a commit, whose own commits are stale: 3 ranks, 1, then 2.
    p = _live_run(tmp_path, step_ms=1500, late=(2, 6000))
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "2 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text
    assert re.search(r"rank 0 at start: the job re-formed without rank\(s\) \[1, 2\] at start "
                     r"in [0-9.]+ s; now rank 0 of 1", p.stdout), text
    assert re.search(r"rank 2 at start: left out of the re-formed job and taken in again in "
                     r"[0-9.]+ s; now rank 1 of 2, going on from the others' commit", p.stdout), text
    resumed = re.findall(r"rank 0 at start: reset at step ([0-9]+), now rank 0 of 1", p.stdout)
    assert resumed and int(resumed[0]) in (3, 4), text
    taken = re.findall(r"rank 0 at start: took in rank\(s\) \[2\] at start at commit "
                       r"([0-9]+); now rank 0 of 2", p.stdout)
    assert len(taken) == 1, text
    resumed_at, taken_at = int(resumed[0]), int(taken[0])
    expected, steps = _live_reference([(3, resumed_at), (1, taken_at - resumed_at), (2, None)])
    assert p.stdout.count(f"live training finished at step {steps} as rank") == 2, text
    a, b = (torch.load(tmp_path / f"weights.{r}") for r in (0, 2))
    for k in expected:
        assert torch.equal(a[k], b[k]), k
        assert torch.allclose(a[k], expected[k], rtol=1e-5, atol=1e-6), (k, a[k], expected[k])


def test_a_replacement_asks_to_be_taken_in_when_it_first_needs_the_world():
    # init() returns at once, with no store to ask; the launcher's word (local rank) is there
    # before it joins; the first need of the world (its rank) asks for it: here, with no
    # `dtrain run --live` to host the store, it says so.
    env = dict(os.environ, DTRAIN_LIVE="1", DTRAIN_LIVE_REPLACEMENT="1", RANK="1", WORLD_SIZE="2",
               LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    script = ("import dtrain.torch as hvd, torch.distributed as dist\n"
              "hvd.init()\n"
              "print('after init', hvd.is_initialized(), dist.is_initialized(), hvd.local_rank(),"
              " hvd.local_size(), flush=True)\n"
              "hvd.rank()\n")
    p = subprocess.run([harness.PYTHON, "-c", script], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "after init True False 1 2" in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0 and "run the job under `dtrain run --live`" in p.stderr, p.stderr


def test_a_replacement_that_comes_after_training_ended_exits_cleanly(tmp_path):
    # Short steps: the survivors end the epoch before a new Python process is up; it is told so
    # and exits 0 (were it in time, it would have been taken in: also a clean end).
    p = _live_run(tmp_path, "--replace", "1")
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert ("rank 1 at start, a replacement: training ended before the others could take it in; "
            "nothing to do" in p.stdout or "took in rank(s) [1]" in p.stdout), text
    assert "3 worker(s) ended well; 1 lost along the way (--live)" in p.stderr, text


def test_the_horovod_example_trains_under_dtrain_run():
    p = subprocess.run([DTRAIN, "run", "-n", "2", "--", harness.PYTHON, EXAMPLE, "--epochs", "1"],
                       env=_launcher_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", p.stdout)]
    assert len(losses) >= 3 and losses[-1] < losses[0], p.stdout
    assert _accuracy(p.stdout) > 0.85, p.stdout


@pytest.mark.skipif(not os.path.exists("/usr/bin/mpirun"), reason="OpenMPI's mpirun is not installed")
def test_the_horovod_example_runs_under_mpirun():
    env = _launcher_env()
    env["MASTER_PORT"] = str(harness.free_port())
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                        "-x", "MASTER_PORT", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
                        harness.PYTHON, EXAMPLE, "--epochs", "1", "--limit", "6000"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "test accuracy" in p.stdout, p.stdout


def test_the_horovod_example_runs_under_srun_variables():
    port = str(harness.free_port())
    envs = []
    for r in range(2):
        env = _launcher_env()
        env.update({"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                    "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                    "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost",
                    "MASTER_PORT": port})
        envs.append(env)
    procs = [subprocess.Popen([harness.PYTHON, EXAMPLE, "--epochs", "1", "--limit", "6000"],
                              env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for e in envs]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    assert "test accuracy" in outs[0], outs[0]
