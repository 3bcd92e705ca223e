#!/usr/bin/env bash
# pipeline_bench.sh - tokens/s of a pp=2 pipeline running its schedule
# (several micro-batches in flight) against one micro-batch in flight.
#
#   bash bench/pipeline_bench.sh [BUILD] [STEPS] [SCHEDULE]
#
# Compiles samples/gpt2-tiny.hpd at a mid size (C=128, T=64, L=4, H=4; the
# train block's 4 micro-batches of 8) for pp=2 with SCHEDULE (default 1f1b)
# and native kernels, then trains it STEPS steps (default 20) with hpdlrun,
# alternately as compiled and with HPDL_PIPELINE_ORDER=sequential (forward and
# backward of each micro-batch back to back: the order before schedules ran),
# three times each, and prints the median tokens/s over steps 6.. of each
# run. The losses of the two orders must be equal (same numbers, other
# order). Not a test: timings depend on the machine and its load. BUILD
# defaults to build-rel.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-rel}
steps=${2:-20}
sched=${3:-1f1b}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bin/hpdl-data" --synthetic 400000 --seed 3 -o "$work/tiny" >/dev/null
"$build/bin/hpdlc" compile samples/gpt2-tiny.hpd -D C=128 -D T=64 -D L=4 -D H=4 --pp 2 --schedule "$sched" -o "$work/art" | head -1
python3 - "$build" "$work" "$steps" <<'PY'
import json, os, statistics, subprocess, sys
build, work, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def run(order, k):
    m = os.path.join(work, f"{order}{k}.jsonl")
    env = dict(os.environ)
    if order == "sequential":
        env["HPDL_PIPELINE_ORDER"] = "sequential"
    subprocess.run([os.path.join(build, "bin", "hpdlrun"), os.path.join(work, "art"), "--data",
                    os.path.join(work, "tiny_train_*.bin"), "--steps", str(steps), "--metrics", m, "--progress", "quiet",
                    "--checkpoint-dir", os.path.join(work, f"ckpt-{order}{k}")],
                   check=True, env=env, capture_output=True)
    rows = [json.loads(l) for l in open(m)]
    return statistics.median(r["tokens_per_s"] for r in rows[5:]), [r["loss"] for r in rows]
res = {"schedule": [], "sequential": []}
losses = {}
for k in range(3):
    for order in ("schedule", "sequential"):
        t, l = run(order, k)
        res[order].append(t)
        losses[order] = l
for order, ts in res.items():
    print(f"{order:10s}: {statistics.median(ts):9.0f} tokens/s (runs: {', '.join(f'{t:.0f}' for t in ts)})")
print(f"speed-up {statistics.median(res['schedule']) / statistics.median(res['sequential']):.2f}x; "
      f"losses {'equal' if losses['schedule'] == losses['sequential'] else 'DIFFER'}")
PY
