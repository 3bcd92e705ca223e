#!/usr/bin/env bash
# fuzz_long.sh - every fuzz target for a long time, one after the other:
#
#   bash bench/fuzz_long.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 3600 (five targets: about five hours);
# TARGETs default to all (frontend ckpt data artifact cluster metrics trace). Builds the
# fuzzers (fuzz/run.sh build, clang), makes the seeds from the release
# build's tools (built when missing), then runs each target over its corpus
# build-fuzz/corpus-<target>, which keeps growing from run to run; CI's
# short runs start from it too when they share the folder. Prints each
# target's executions; a failure leaves its input in
# build-fuzz/artifacts-<target>/ (save it under fuzz/regressions/<target>/
# with the fix, and record it in docs/reliability.md). Not a test: it runs
# for hours. Set HPDL_FUZZ_BUILD_DIR for another folder than build-fuzz.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-3600}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(frontend ckpt data artifact cluster metrics trace)

if [ ! -x build/bin/hpdlc ] || [ ! -x build/bin/hpdlrun ] || [ ! -x build/bin/hpdl-data ]; then
  echo "fuzz_long: building the tools for the seeds (build/, Release)"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target hpdlc hpdlrun hpdl-data hpdl_program >/dev/null ||
    echo "fuzz_long: the release build failed; seeds from the repository's files only" >&2
fi
bash fuzz/run.sh build >/dev/null || {
  echo "fuzz_long: the fuzzers do not build (fuzz/run.sh build)" >&2
  exit 1
}
bash fuzz/run.sh seeds build/bin
t0=$(date +%s)
failed=0
bash fuzz/run.sh run "$seconds" "${targets[@]}" || failed=1
echo "fuzz_long: ${#targets[@]} targets x ${seconds}s in $(($(date +%s) - t0))s on $(nproc 2>/dev/null || echo '?') cores"
exit "$failed"
