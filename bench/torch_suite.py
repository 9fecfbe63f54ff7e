"""PyTorch's own distributed test suite on a backend: dtrain and gloo, same selection, same run.

    /opt/dtrain/venv/bin/python bench/torch_suite.py --world-size 2 --json suite.json
    /opt/dtrain/venv/bin/python bench/torch_suite.py --backends dtrain -k allreduce

Runs torch's generic suite (`torch.testing._internal.distributed.distributed_test`, the one
PyTorch runs for gloo and NCCL through test/distributed/test_distributed_spawn.py) once per
backend, with dtrain declared as a plugin that serves DDP and sub-groups (unittest's report of
each backend goes to torch_suite_BACKEND.log), and prints one table:
passed, skipped and failed for each backend, then every test whose outcome differs between them
(with the first line of dtrain's error). docs/pytorch.md records the figures and explains each
difference. Each backend runs in a process of its own; each test spawns WORLD_SIZE ranks.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

_CHILD = os.environ.get("DTRAIN_TORCH_SUITE_CHILD") == "1"

if __name__ == "__main__" and not _CHILD:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="gloo,dtrain")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("-k", dest="pattern", default="",
                        help="only tests whose name holds one of these (comma-separated)")
    parser.add_argument("--json", default="", help="write every test's outcome here")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per backend")
    args = parser.parse_args()
    outcomes = {}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "outcomes.json")
            env = dict(os.environ, DTRAIN_TORCH_SUITE_CHILD="1", BACKEND=backend,
                       WORLD_SIZE=str(args.world_size), TEMP_DIR=tmp,
                       DTRAIN_TORCH_SUITE_OUT=out, DTRAIN_TORCH_SUITE_PATTERN=args.pattern)
            start = time.monotonic()
            print(f"torch_suite: {backend} at world size {args.world_size} ...", flush=True)
            log = f"torch_suite_{backend}.log"  # unittest's own report of every test
            with open(log, "w") as f:
                subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                               timeout=args.timeout, stdout=f, stderr=subprocess.STDOUT)
            if not os.path.exists(out):
                sys.exit(f"torch_suite: the {backend} run ended without its results: see {log}")
            with open(out) as f:
                outcomes[backend] = json.load(f)
            print(f"torch_suite: {backend} took {time.monotonic() - start:.0f} s", flush=True)
    import torch
    print(f"\ntorch {torch.__version__}, world size {args.world_size}"
          + (f", tests matching {args.pattern!r}" if args.pattern else ""))
    print("| backend | passed | skipped | failed |\n|---|---|---|---|")
    for backend, res in outcomes.items():
        kinds = [r["outcome"] for r in res.values()]
        print(f"| {backend} | {kinds.count('passed')} | {kinds.count('skipped')} | "
              f"{kinds.count('failed')} |")
    names = list(outcomes)
    if len(names) == 2:
        a, b = names
        print(f"\nDifferences ({a} -> {b}):")
        for test in sorted(set(outcomes[a]) | set(outcomes[b])):
            ra, rb = outcomes[a].get(test, {}), outcomes[b].get(test, {})
            if ra.get("outcome") != rb.get("outcome"):
                why = (rb.get("detail") or ra.get("detail") or "").strip().splitlines()
                print(f"  {test}: {ra.get('outcome')} -> {rb.get('outcome')}"
                      f"  ({why[-1][:200] if why else ''})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "world_size": args.world_size,
                       "outcomes": outcomes}, f, indent=1)
    sys.exit(0)

# One backend's run (and each rank it spawns, which imports this file again): declare dtrain a
# plugin before torch's suite is imported, since its decorators read the declaration then.
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ.get("BACKEND") == "dtrain":
    import dtrain.torch  # noqa: F401,E402  registers the backend in every rank
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("dtrain")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Record(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}

    def _set(self, test, outcome, detail=""):
        self.outcomes[test.id().split(".")[-1]] = {"outcome": outcome, "detail": detail}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._set(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skipped", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, "failed", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._set(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set(test, "failed", "unexpected success")


if __name__ == "__main__":
    loader = unittest.TestLoader()
    pattern = os.environ.get("DTRAIN_TORCH_SUITE_PATTERN", "")
    if pattern:
        loader.testNamePatterns = [f"*{p}*" for p in pattern.split(",")]
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    runner = unittest.TextTestRunner(resultclass=_Record, verbosity=2, stream=sys.stderr)
    result = runner.run(suite)
    with open(os.environ["DTRAIN_TORCH_SUITE_OUT"], "w") as f:
        json.dump(result.outcomes, f)
