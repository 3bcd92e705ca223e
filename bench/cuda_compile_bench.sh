#!/usr/bin/env bash
# cuda_compile_bench.sh - what `hpdlc compile --target cuda` costs on
# samples/gpt2.hpd (124M), cold and from the NVRTC cache.
#
#   bash bench/cuda_compile_bench.sh [HPDLC | BUILD_DIR] [ARCH]
#
# Compiles three times into a temporary folder with a fresh cache
# ($HPDL_CACHE): cold (NVRTC compiles every kernel), then twice warm (the
# cache answers). Prints the whole compile's wall time, NVRTC's share
# (stage0.kernels.json's nvrtc_seconds), the goals (cold under 10 s and
# cached NVRTC under 0.2 s on 2 cores), and `-v`'s per kernel table:
# registers, shared memory, spills, launch shape. Not a test: timings
# depend on the machine. HPDLC defaults to build/bin/hpdlc (built when
# missing); ARCH to sm_80. Needs NVRTC ($CUDA_HOME or /usr/local/cuda).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
hpdlc=${1:-build/bin/hpdlc}
# a build folder, as the other benches take: its bin/hpdlc
if [ -d "$hpdlc" ]; then hpdlc=$hpdlc/bin/hpdlc; fi
arch=${2:-sm_80}
if [ ! -x "$hpdlc" ]; then
  echo "bench: building $hpdlc (Release)"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target hpdlc >/dev/null
  hpdlc=build/bin/hpdlc
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HPDL_CACHE=$tmp/cache

run() { # run LABEL: one compile; prints wall and NVRTC seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$hpdlc" compile samples/gpt2.hpd --target cuda --arch "$arch" -o "$tmp/art" -q -v 2>"$tmp/v.txt"
  t1=$(date +%s.%N)
  python3 - "$1" "$t0" "$t1" "$tmp/art/stage0.kernels.json" <<'PY'
import json, sys
label, t0, t1, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
k = json.load(open(path))
n = sum(1 for l in k["launches"] if l["kind"] != "gemm")
print(f"{label:7s} compile {t1 - t0:6.2f} s, NVRTC {k['nvrtc_seconds']:6.3f} s{' (cache hit)' if k['cache_hit'] else ''}, "
      f"{n} kernels, NVRTC {k['nvrtc']}, {k['arch']}")
PY
}

echo "hpdlc compile --target cuda samples/gpt2.hpd, $(nproc 2>/dev/null || echo '?') cores, $("$hpdlc" --version)"
run cold
run cached
run cached
echo "goals: cold compile under 10 s; cached NVRTC under 0.2 s"
echo
echo "per kernel (hpdlc compile -v):"
cat "$tmp/v.txt"
