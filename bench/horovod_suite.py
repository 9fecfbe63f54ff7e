"""Horovod's own tests on dtrain: test/parallel/test_torch.py with horovod.torch mapped to
dtrain.torch, or test_tensorflow.py and test_tensorflow2_keras.py with horovod.tensorflow mapped to
dtrain.tensorflow.

    git clone --depth 1 https://github.com/horovod/horovod /tmp/horovod  # not in its PyPI sdist
    /opt/dtrain/venv/bin/python -m pip install cloudpickle mock parameterized  # its test utils
    /opt/dtrain/venv/bin/python bench/horovod_suite.py --tests /tmp/horovod/test -n 2
    /opt/dtrain/venv/bin/python bench/horovod_suite.py --tests /tmp/horovod/test -n 2 \
        --framework tensorflow

Runs the selection (by default the issues': for torch the allreduce, allgather, broadcast and
alltoall tests and the optimizer's; for TensorFlow every test that needs neither GPUs nor process
sets) under `dtrain run -n N`, with a shim package `horovod` on the path whose `horovod.torch` is
`dtrain.torch` (or `horovod.tensorflow` is `dtrain.tensorflow`), plus the few helpers of Horovod's
own packages that the tests import. HOROVOD_RANK is set as horovodrun's Gloo mode sets it, so
every torch test ends with hvd.barrier() and hvd.shutdown() and the next one calls hvd.init()
again. Each rank writes a junit report; a test passes when it passed on every rank. Prints the
counts and each failure's first line; docs/pytorch.md and docs/tensorflow.md record them.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

_COMMON_SHIM = {
    "horovod/__init__.py":
        "import os\n"
        "# As horovodrun's Gloo mode: the tests shut Horovod down after each test when it is set.\n"
        "os.environ.setdefault('HOROVOD_RANK', os.environ.get('RANK', '0'))\n"
        "# The tests compare hvd.rank() and hvd.size() with these, as mpirun sets them.\n"
        "os.environ.setdefault('PMI_RANK', os.environ.get('RANK', '0'))\n"
        "os.environ.setdefault('PMI_SIZE', os.environ.get('WORLD_SIZE', '1'))\n",
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    "horovod/runner/util/threads.py":
        "import threading\n\n\n"
        "def in_thread(target, args=(), name=None, daemon=True, silent=False):\n"
        "    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)\n"
        "    thread.start()\n"
        "    return thread\n",
    "horovod/common/__init__.py": "",
    "horovod/common/util.py":
        "from packaging import version\n\n\n"
        "def is_version_greater_equal_than(ver, target):\n"
        "    return version.parse(ver) >= version.parse(target)\n",
}

# Per framework: the test files, the default selection, the shim's own modules.
SUITES = {
    "torch": (
        ["test_torch.py"],
        "(allreduce or allgather or broadcast or alltoall or optimizer or compression or "
        "model_parallelism or duplicate_names or requires_grad or clipping or "
        "synchronize_step or named_parameters or sparse) and not process_sets",
        {"horovod/torch/__init__.py": "from dtrain.torch import *  # noqa: F401,F403\n"}),
    "tensorflow": (
        ["test_tensorflow.py", "test_tensorflow2_keras.py"],
        "not gpu and not process_set",
        {"horovod/tensorflow/__init__.py":
            "import tensorflow as tf\n"
            "from dtrain.tensorflow import *  # noqa: F401,F403\n"
            "from horovod.tensorflow import util  # noqa: F401\n"
            "_executing_eagerly = tf.executing_eagerly\n",
         "horovod/tensorflow/util.py":
            "import tensorflow as tf\n\n"
            "_executing_eagerly = tf.executing_eagerly\n",
         "horovod/tensorflow/keras/__init__.py":
            "from dtrain.tensorflow.keras import *  # noqa: F401,F403\n"
            "from dtrain.tensorflow.keras import callbacks  # noqa: F401\n",
         "horovod/keras/__init__.py":
            "from dtrain.tensorflow.keras import *  # noqa: F401,F403\n"
            "from dtrain.tensorflow.keras import callbacks  # noqa: F401\n"}),
}


def outcomes(report):
    """{test name: (outcome, first line of the message)} from one rank's junit report."""
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or "").split("\n")[0]
            elif child.tag == "skipped":
                outcome, message = "skipped", (child.get("message") or "").split("\n")[0]
        # Two files may hold tests of one name (test_elastic_state): the class tells them apart.
        cls = (case.get("classname") or "").rsplit(".", 1)[-1]
        result[f"{cls}.{case.get('name')}" if cls else case.get("name")] = (outcome, message)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True,
                        help="the test/ folder of a checkout of github.com/horovod/horovod")
    parser.add_argument("-n", type=int, default=2, help="ranks")
    parser.add_argument("--framework", choices=sorted(SUITES), default="torch")
    parser.add_argument("-k", default=None, help="pytest's -k expression (default: the issue's)")
    parser.add_argument("--dtrain", default=os.environ.get("DTRAIN_BIN") or shutil.which("dtrain")
                        or "dtrain", help="the dtrain binary")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    args = parser.parse_args()
    files, selection, shim = SUITES[args.framework]
    selection = args.k if args.k is not None else selection
    suites = [os.path.join(args.tests, "parallel", f) for f in files]
    for suite in suites:
        if not os.path.exists(suite):
            sys.exit(f"horovod_suite: no {suite}; pass --tests with the test/ folder of a "
                     f"Horovod checkout")
    needed = ["cloudpickle", "mock", "pytest"] + (["parameterized"] if args.framework ==
                                                   "tensorflow" else [])
    for module in needed:
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"horovod_suite: Horovod's test utils need {module}: "
                     f"{sys.executable} -m pip install {module}")
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in {**_COMMON_SHIM, **shim}.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(tmp, path), "w") as f:
                f.write(text)
        path = os.pathsep.join(p for p in [tmp, os.environ.get("PYTHONPATH", "")] if p)
        env = dict(os.environ, PYTHONPATH=path, DTRAIN_PYTHONPATH=path)
        rank_cmd = (f"exec {sys.executable} -m pytest -q -p no:cacheprovider "
                    f"{' '.join(suites)} -k \"$SELECTION\" --junitxml={tmp}/rank-$RANK.xml")
        env["SELECTION"] = selection
        command = [args.dtrain, "run", "-n", str(args.n), "--", "sh", "-c", rank_cmd]
        log = os.path.abspath("horovod_suite.log")
        print(f"horovod_suite: {args.framework}'s selection at {args.n} ranks; each rank's "
              f"pytest output goes to {log}", flush=True)
        with open(log, "w") as f:
            subprocess.run(command, env=env, cwd=os.path.dirname(suites[0]), stdout=f,
                           stderr=subprocess.STDOUT, timeout=args.timeout)
        reports = [os.path.join(tmp, f"rank-{r}.xml") for r in range(args.n)]
        missing = [r for r in reports if not os.path.exists(r)]
        if missing:
            sys.exit(f"horovod_suite: no report from {missing}: see {log}")
        per_rank = [outcomes(r) for r in reports]
    merged = {}
    for name in per_rank[0]:
        results = [ranks.get(name, ("failed", "not run on this rank")) for ranks in per_rank]
        failed = [m for o, m in results if o == "failed"]
        if failed:
            merged[name] = ("failed", failed[0])
        elif all(o == "skipped" for o, _ in results):
            merged[name] = ("skipped", results[0][1])
        else:
            merged[name] = ("passed", "")
    kinds = [o for o, _ in merged.values()]
    ran = kinds.count("passed") + kinds.count("failed")
    print(f"\n| selected | passed | skipped | failed | passed of those that ran |\n"
          f"|---|---|---|---|---|\n"
          f"| {len(kinds)} | {kinds.count('passed')} | {kinds.count('skipped')} | "
          f"{kinds.count('failed')} | {kinds.count('passed') / max(ran, 1):.1%} |")
    for name, (outcome, message) in sorted(merged.items()):
        if outcome != "passed":
            print(f"{outcome:8} {name}: {message[:160]}")


if __name__ == "__main__":
    main()
