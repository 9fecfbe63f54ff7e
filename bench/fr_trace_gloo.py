"""The faults of tests/python/fault_workers.py on gloo, with PyTorch's own flight recorder and
fr_trace: what torch 2.x says of them, beside what `dtrain run` and `dtrain doctor` say
(docs/troubleshooting.md records both).

    /opt/dtrain/venv/bin/python bench/fr_trace_gloo.py [compute order p2p skip]

For each fault: 3 ranks under torchrun on backend gloo with a 10 s timeout and
TORCH_FR_BUFFER_SIZE=2000; a rank whose call fails dumps its recorder (gloo does not dump by
itself on a timeout, so the worker calls torch's _dump_fr_trace_file in its exception handler, as
a user would have to); then `python -m torch.distributed.flight_recorder.fr_trace` on the dumps.
Prints each rank's error and fr_trace's last lines.
"""
import datetime
import os
import subprocess
import sys
import tempfile
import time

if os.environ.get("FR_TRACE_GLOO_CHILD") == "1":
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist
    fault = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    rank = dist.get_rank()
    grad, loss = torch.ones(256), torch.ones(4)
    try:
        for step in range(1, 11):
            time.sleep(0.01)
            faulty = step == 6 and rank == 1
            if fault == "compute" and faulty:
                time.sleep(60)
            if fault == "skip" and faulty:
                dist.recv(grad, src=0, tag=7)
                continue
            if fault == "p2p" and step == 6 and rank < 2:
                dist.recv(grad, src=1 - rank)
                dist.send(grad, dst=1 - rank)
            if fault == "order" and step >= 6 and rank == 1:
                dist.all_reduce(loss)
                dist.all_reduce(grad)
                continue
            dist.all_reduce(grad)
            dist.all_reduce(loss)
    except Exception:
        c10d._dump_fr_trace_file(rank, True, True, False)
        raise
    sys.exit(0)

faults = sys.argv[1:] or ["compute", "order", "p2p", "skip"]
for fault in faults:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FR_TRACE_GLOO_CHILD="1", TORCH_FR_BUFFER_SIZE="2000",
                   TORCH_FR_DUMP_TEMP_FILE=os.path.join(tmp, "rank_"))
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                              "3", os.path.abspath(__file__), fault],
                             env=env, capture_output=True, text=True, timeout=180)
        took = time.monotonic() - start
        errors = [line for line in (run.stdout + run.stderr).splitlines()
                  if "Error:" in line or "what():" in line]
        dumps = sorted(f for f in os.listdir(tmp) if f.startswith("rank_"))
        print(f"== {fault}: exit {run.returncode} after {took:.1f} s; dumps {dumps}")
        for line in errors[:4]:
            print("   ", line.strip()[:300])
        if dumps:
            trace = subprocess.run([sys.executable, "-m",
                                    "torch.distributed.flight_recorder.fr_trace", tmp, "-p",
                                    "rank_", "--allow-incomplete-ranks"],
                                   capture_output=True, text=True, timeout=120)
            lines = [l for l in (trace.stdout + trace.stderr).splitlines()
                     if l.strip() and "tabulate" not in l]
            print("    fr_trace:", " / ".join(l.strip() for l in lines[-2:])[:400])
