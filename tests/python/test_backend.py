"""The torch.distributed backend "dtrain" in real processes over real sockets (tests/python/harness.py):
every operation against values computed locally, sub-groups, DDP against gloo, failures."""
import json
import os
import re
import subprocess

import pytest

import harness


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_operation_every_dtype(world):
    harness.check_ok(harness.run(world, "ops", timeout=240))


@pytest.mark.parametrize("world", [3, 4])
def test_sub_groups(world):
    harness.check_ok(harness.run(world, "subgroups", timeout=300))


def test_ranks_on_two_hosts_find_each_other_by_the_route_to_the_master():
    # Two hosts of two ranks each (network namespaces): each rank must tell its peers an address
    # they can reach. Torch's store does not say which interface it used, and the host's name is
    # the same in every namespace here, resolving to none of the hosts' addresses.
    with harness.EmulatedHosts(2) as hosts:
        if hosts.skip:
            pytest.skip(hosts.skip)
        harness.check_ok(hosts.run(2, "ops"))


def test_mp_spawn_with_world_size_in_the_environment_and_no_rank():
    # The tutorials' pattern: import dtrain.torch must not read the launcher's variables (here
    # WORLD_SIZE without RANK); init_process_group gets rank and world size as arguments.
    env = harness.env_for(0, 2, 0)
    for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run(harness.command("workers.py", "spawned", "dtrain", [harness.free_port(), 2]),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every spawned rank checked" in p.stdout


@pytest.mark.parametrize("method", ["tcp", "file", "store"])
def test_init_methods(tmp_path, method):
    harness.check_ok(harness.run(3, "init_methods", method, tmp_path, timeout=120))


def test_under_srun_the_slurm_variables_are_enough(tmp_path):
    # What srun gives each task (no RANK, WORLD_SIZE or MASTER_*): import dtrain.torch fills
    # torch's env:// variables from them.
    port = harness.free_port()
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
             "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost",
             "MASTER_PORT": str(port)} for r in range(2)]
    results = harness.run_with_envs(envs, "ddp", tmp_path / "out.json", "plain",
                                    drop=("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR"))
    harness.check_ok(results)


def test_a_killed_rank_fails_the_others_with_its_name():
    results = harness.run(3, "killed", 2, timeout=90)
    assert results[2].code != 0
    for r in results[:2]:
        assert r.code == 3, f"rank {r.rank} exited {r.code}:\n{r.out}"
        # The error names the dead peer.
        assert re.search(r"rank 2\b", r.out), r.out


def test_a_mismatched_collective_fails_every_rank_naming_both_calls():
    results = harness.run(3, "mismatch", timeout=90)
    for r in results:
        assert r.code == 3, f"rank {r.rank} exited {r.code}:\n{r.out}"
        assert "all_reduce(f32, 64, max)" in r.out and "all_reduce(f32, 64, sum)" in r.out, r.out


def test_the_nccl_backend_where_no_gpu_is_visible_fails_every_rank_at_once_saying_so():
    # DTRAIN_BACKEND=nccl puts CUDA tensors on NCCL (a native group beside it for host ones).
    # Without a GPU, init must fail on every rank within seconds, not wait for the peers.
    results = harness.run(2, "nccl_without_gpu", timeout=60,
                          env={"DTRAIN_BACKEND": "nccl", "CUDA_VISIBLE_DEVICES": ""})
    for r in results:
        assert r.code == 3, f"rank {r.rank} exited {r.code}:\n{r.out}"
        assert f"rank {r.rank}: failed after" in r.out and "backend nccl" in r.out, r.out


def test_destroying_the_group_while_a_future_callback_runs_does_not_hang():
    results = harness.run(2, "destroy_during_callback", timeout=60)
    harness.check_ok(results)
    for r in results:
        assert "while the callback ran" in r.out, r.out


def test_a_work_let_go_of_before_it_ends_keeps_its_tensor_until_then():
    # Rank 0 drops an async all_reduce's work and tensor at once and fills new tensors of that
    # size; before the works kept their tensors past their own end, rank 1 received those
    # tensors' values and rank 0 crashed.
    results = harness.run(2, "dropped_work", timeout=60)
    harness.check_ok(results)
    for r in results:
        assert "dropped work checked" in r.out, r.out


def test_a_callback_may_drop_the_last_reference_to_its_group():
    results = harness.run(2, "group_dropped_in_callback", timeout=60)
    harness.check_ok(results)
    for r in results:
        assert "destroyed in its callback" in r.out, r.out


@pytest.mark.parametrize("variant", ["plain", "unused", "no_sync", "hook", "powersgd", "all"])
def test_ddp_on_dtrain_trains_as_ddp_on_gloo(tmp_path, variant):
    runs = {}
    for backend in ("gloo", "dtrain"):
        out = tmp_path / f"{backend}.json"
        harness.check_ok(harness.run(2, "ddp", out, variant, backend=backend, timeout=180))
        runs[backend] = json.loads(out.read_text())
    gloo, ours = runs["gloo"], runs["dtrain"]
    assert len(ours["losses"]) == len(gloo["losses"]) > 0
    for step, (a, b) in enumerate(zip(ours["losses"], gloo["losses"])):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"step {step}: loss {a} on dtrain, {b} on gloo"
    for name, want in gloo["state"].items():
        got = ours["state"][name]
        flat_w = want if isinstance(want, list) else [want]
        flat_g = got if isinstance(got, list) else [got]
        assert json.dumps(got) == json.dumps(want) or _close(flat_g, flat_w), name


@pytest.mark.parametrize("variant", ["int8", "int4", "bf16_wire", "fp16_wire"])
def test_ddp_with_fewer_bytes_on_the_wire_trains_close_to_exact_ddp(tmp_path, variant):
    # dtrain's hooks (int8 and int4 values with a scale per 256, bf16 and fp16; error feedback
    # for all but fp16, given torch's kind of state) against exact DDP on gloo: the same losses to within the rounding, and (checked
    # in the worker) the same weights on every rank.
    runs = {}
    for backend, v in (("gloo", "plain"), ("dtrain", variant)):
        out = tmp_path / f"{backend}.json"
        harness.check_ok(harness.run(2, "ddp", out, v, backend=backend, timeout=180))
        runs[backend] = json.loads(out.read_text())
    exact, rounded = runs["gloo"]["losses"], runs["dtrain"]["losses"]
    assert len(rounded) == len(exact) > 0
    assert rounded[0] == pytest.approx(exact[0], rel=1e-6)  # the first step's loss precedes any
    for step, (a, b) in enumerate(zip(rounded, exact)):
        assert abs(a - b) <= 0.02 * abs(b), f"step {step}: loss {a} with {variant}, {b} exact"
    assert rounded != exact  # the hook ran: rounding shows in the later losses


def test_the_int8_hook_on_a_gloo_group_says_what_to_use(tmp_path):
    results = harness.run(2, "ddp", tmp_path / "x.json", "int8", backend="gloo", timeout=120)
    assert all(r.code != 0 for r in results), [r.out for r in results]
    for r in results:
        assert "int8_compress_hook: the DDP's group is not a dtrain group" in r.out, r.out


def _close(a, b, tol=1e-5):
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    return abs(a - b) <= tol * max(1.0, abs(b))


@pytest.mark.parametrize("name", ["collectives", "ddp", "fsdp2"])
def test_training_through_torch_2_tools_matches_one_process(name):
    # device_workers.py: DDP and FSDP2 (fully_shard per layer, resharding after forward or not)
    # on dtrain reach the losses and weights of one process trained on the whole batch. The GPU
    # check (scripts/gpu_check.sh) runs the same file with cuda.
    env = harness.env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([os.environ.get("DTRAIN_BIN", "dtrain"), "run", "-n", "2", "--",
                        harness.PYTHON, os.path.join(harness.HERE, "device_workers.py"), name, "cpu"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert f"rank {r}: {name} on cpu checked" in p.stdout, p.stdout
