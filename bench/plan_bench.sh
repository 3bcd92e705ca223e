#!/usr/bin/env bash
# plan_bench.sh - how fast `hpdlc plan` is, against its budgets (issue 12):
# one layout planned in under 5 ms, the 1T-parameter GPT searched on 3072
# A100s in under 0.5 s, on one core.
#
#   bash bench/plan_bench.sh [BUILD_DIR] [RUNS]
#
# Builds the plan_bench target (bench/plan_bench.c) in BUILD_DIR (default
# build, configured as Release when it does not exist), runs it pinned to one
# core, then times the same through the command line (process start, parsing
# and checking included). Not a test: timings depend on the machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
runs=${2:-20}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target plan_bench hpdlc >/dev/null
bench=$(find "$build" -name plan_bench -type f -perm -u+x | head -n 1)
pin=()
if command -v taskset >/dev/null 2>&1; then pin=(taskset -c 0); fi
"${pin[@]}" "$bench" "$PWD" "$runs"

hpdlc=$build/bin/hpdlc
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
t0=$(date +%s%N)
"${pin[@]}" "$hpdlc" plan samples/gpt.hpd >/dev/null
echo "  command line hpdlc plan samples/gpt.hpd: $(ms "$t0") ms (process start included)"
t0=$(date +%s%N)
"${pin[@]}" "$hpdlc" plan samples/gpt.hpd -D layers=128 -D hidden=25600 -D heads=160 --nodes 384 \
  --global-batch 3072 --search --top 5 >/dev/null
echo "  command line hpdlc plan --search (1T, 3072 GPUs): $(ms "$t0") ms (process start included)"
