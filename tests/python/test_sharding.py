"""dtrain.sharding: ZeRO stages 1-3 for torch modules over real processes. Every stage trains as
one process on the whole batch (SGD with momentum, Adam, AdamW, clipping), no_sync accumulates,
a module is one unit, different models are refused, a killed rank fails the others naming it."""
import pytest

import harness


def run(world, name, *args, timeout=120):
    return harness.run(world, name, *args, backend=None, timeout=timeout,
                       script="sharding_workers.py")


@pytest.mark.parametrize("stage,kind", [(1, "sgd"), (2, "adam"), (3, "adamw"), (3, "adam")])
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_stage_trains_as_one_process(stage, kind, ranks):
    for r in run(ranks, "matches_one_process", stage, kind):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_clipping_by_the_global_norm():
    for r in run(2, "matches_one_process", 3, "sgd", "0.05"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_no_sync_accumulation_equals_the_larger_batch():
    for r in run(2, "no_sync"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_a_module_is_one_unit():
    for r in run(2, "one_unit"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_different_models_and_frozen_parameters_are_refused_on_every_rank():
    for r in run(2, "refusals"):
        assert r.code == 0 and "OK" in r.out, f"rank {r.rank}:\n{r.out}"


def test_a_killed_rank_fails_the_others_naming_it():
    results = run(3, "killed_rank", timeout=60)
    for r in results:
        if r.rank == 2:
            assert r.code == -9, r.out
        else:
            assert r.code == 3 and "FAILED AS EXPECTED" in r.out, f"rank {r.rank}:\n{r.out}"
