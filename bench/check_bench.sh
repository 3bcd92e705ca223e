#!/usr/bin/env bash
# check_bench.sh - how long `hpdlc check` takes on every sample.
#
#   bash bench/check_bench.sh [HPDLC] [RUNS]
#
# Runs `hpdlc check` RUNS times (default 20) on each samples/*.hpd after one
# warm-up run and prints the median and the fastest wall time in
# milliseconds (process start included, as a user sees it). The goal is
# under 20 ms for samples/gpt2.hpd. HPDLC defaults to build/bin/hpdlc, which
# is built (Release) when missing. Not a test: timings depend on the machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
hpdlc=${1:-build/bin/hpdlc}
runs=${2:-20}
if [ ! -x "$hpdlc" ]; then
  echo "bench: building $hpdlc (Release)"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target hpdlc >/dev/null
  hpdlc=build/bin/hpdlc
fi
shopt -s nullglob
samples=(samples/*.hpd)
if [ ${#samples[@]} -eq 0 ]; then
  echo "bench: no samples/*.hpd to time" >&2
  exit 1
fi

echo "hpdlc check, $runs runs each, $(nproc 2>/dev/null || echo '?') cores, $("$hpdlc" --version)"
python3 - "$hpdlc" "$runs" "${samples[@]}" <<'EOF'
import statistics, subprocess, sys, time

hpdlc, runs, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
GOAL_MS = {"samples/gpt2.hpd": 20.0}
print("%-28s %10s %10s  %s" % ("file", "median ms", "min ms", "result"))
worst = 0
for path in files:
    cmd = [hpdlc, "check", path]
    status = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    note = "ok" if status == 0 else "exit %d (errors in the file)" % status
    goal = GOAL_MS.get(path)
    if goal is not None:
        verdict = "meets" if med < goal else "MISSES"
        note += "; %s the %.0f ms goal" % (verdict, goal)
        if med >= goal:
            worst = 1
    print("%-28s %10.2f %10.2f  %s" % (path, med, min(times), note))
sys.exit(worst)
EOF
