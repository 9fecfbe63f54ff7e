#!/usr/bin/env bash
# Before and after a change to a hot path: the same `dtrain bench` from two builds, invoked in
# alternation (A B A B ...) $INVOCATIONS times each (default 3) per configuration, all-reduce at
# np 2 and 4 over TCP and shared memory (CONFIGS="np:transport ...", default all four). Prints, per size, the median time of each build over
# all its invocations' rounds, the ratio before/after (above 1: the change is faster) and the
# spread of the invocations' own medians, which is what "no slower" must be judged against.
# ITERS (30) is each round's calls per size: small sizes need tens of thousands (SIZES=8
# ITERS=50000) for a round to last long enough to measure.
#   [INVOCATIONS=3] [ROUNDS=5] [SIZES=4K:64M] [ITERS=30] [CONFIGS="2:shm 4:tcp"] bash bench/compare_builds.sh BEFORE/bin/dtrain AFTER/bin/dtrain
set -euo pipefail
before=${1:?usage: compare_builds.sh BEFORE_DTRAIN AFTER_DTRAIN}
after=${2:?usage: compare_builds.sh BEFORE_DTRAIN AFTER_DTRAIN}
invocations=${INVOCATIONS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--sizes "${SIZES:-4K:64M}" --iters "${ITERS:-30}" --warmup 5 --rounds "${ROUNDS:-5}")
for config in ${CONFIGS:-2:tcp 2:shm 4:tcp 4:shm}; do
  np=${config%%:*} transport=${config#*:}
  for i in $(seq "$invocations"); do
    for build in before after; do
      dtrain=$before
      [[ $build == after ]] && dtrain=$after
      log=$out/$np-$transport-$build-$i.log
      "$dtrain" bench allreduce --np "$np" --transport "$transport" "${common[@]}" \
        --json "$out/$np-$transport-$build-$i.jsonl" >"$log" 2>&1 || { cat "$log"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, pathlib, statistics, sys
from collections import defaultdict
runs = defaultdict(list)  # (np, transport, build, bytes) -> time of each round
invocation = defaultdict(list)  # ... -> median of each invocation
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):  # NP-TRANSPORT-BUILD-I.jsonl
    np, transport, build, _ = f.stem.split("-")
    per_size = defaultdict(list)
    for line in f.read_text().splitlines():
        r = json.loads(line)
        per_size[r["bytes"]].append(r["time_us"])
    for size, times in per_size.items():
        runs[(np, transport, build, size)] += times
        invocation[(np, transport, build, size)].append(statistics.median(times))
print(f"{'np':>3} {'stream':>6} {'size(B)':>10} {'before(us)':>11} {'after(us)':>10} {'ratio':>6}  invocations' medians before | after")
for (np, transport, build, size) in sorted(runs, key=lambda k: (int(k[0]), k[1], k[3])):
    if build != "before":
        continue
    b = statistics.median(runs[(np, transport, "before", size)])
    a = statistics.median(runs[(np, transport, "after", size)])
    fmt = lambda xs: " ".join(f"{x:.1f}" for x in xs)
    print(f"{np:>3} {transport:>6} {size:>10} {b:>11.1f} {a:>10.1f} {b / a:>6.2f}  "
          f"{fmt(invocation[(np, transport, 'before', size)])} | {fmt(invocation[(np, transport, 'after', size)])}")
PY
