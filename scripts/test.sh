#!/usr/bin/env bash
# test.sh - the whole test suite, as CI runs it (.ci/run calls this script):
#
#   1. scripts/setup.sh (installs whatever is missing)
#   2. Release build in ./build, then ctest
#   3. AddressSanitizer + UndefinedBehaviorSanitizer build in ./build-asan,
#      then ctest with leak detection on, less the tests of the CUDA emulation
#      harness and of the optimizer kernel (cuda_emu.*, cuda.optim.*): they
#      compile and run their own C++ programs, the same under either build;
#      and of the device layouts but one (label cuda_layouts: the emulated
#      kernels are the same C++ under either build, and they are slow), and
#      the cases whose code paths others cover (label sanitize_redundant:
#      NVRTC's sm_80 beside sm_90 and most sm_90 samples, the attention
#      kernels' mutants, layouts and oracle cases that others contain)
#   4. the libFuzzer targets (fuzz/: the front end and every reader of
#      outside bytes), built with clang in ./build-fuzz and run one after
#      the other for HPDL_FUZZ_SECONDS in all: the front end a third, the
#      readers the rest in equal shares, each over its seeds (fuzz/seeds.sh,
#      from the release build's tools) and its corpus build-fuzz/corpus-<target>;
#      any crash, sanitizer report, leak or hang fails
#
# A step whose build fails skips its tests; the other steps still run. The
# script prints a summary and exits non-zero when anything failed.
# Knobs (environment): HPDL_BUILD_DIR, HPDL_ASAN_BUILD_DIR, HPDL_FUZZ_BUILD_DIR
# (build folders), HPDL_FUZZ_SECONDS (default 60), HPDL_SKIP_SETUP=1.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${HPDL_BUILD_DIR:-build}
asan_build=${HPDL_ASAN_BUILD_DIR:-build-asan}
fuzz_build=${HPDL_FUZZ_BUILD_DIR:-build-fuzz}
export HPDL_FUZZ_BUILD_DIR=$fuzz_build # fuzz/run.sh
fuzz_seconds=${HPDL_FUZZ_SECONDS:-60}
jobs=$(nproc 2>/dev/null || echo 2)
ctest_jobs=2

summary=()
failed=0
t_start=$(date +%s)

step() { printf '\n==> %s\n' "$*"; }

# timed NAME CMD...: runs CMD, records its verdict and duration for the summary.
timed() {
  local name=$1 t0 status verdict=ok
  shift
  t0=$(date +%s)
  "$@"
  status=$?
  if [ "$status" -ne 0 ]; then
    verdict=FAILED
    failed=1
  fi
  summary+=("$(printf '  %-28s %-7s %5ss' "$name" "$verdict" $(($(date +%s) - t0)))")
  return "$status"
}

skipped() {
  summary+=("$(printf '  %-28s %-7s' "$1" skipped)")
  failed=1
}

build_dir() { # build_dir DIR [CMAKE_ARGS...]: configure and build everything
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" && cmake --build "$dir" -j "$jobs"
}

# ---- 1. dependencies --------------------------------------------------------
if [ "${HPDL_SKIP_SETUP:-0}" != 1 ]; then
  step "Installing whatever is missing (scripts/setup.sh)"
  if ! timed "setup" bash scripts/setup.sh; then
    echo "test: setup failed; nothing else can run" >&2
    exit 1
  fi
fi

# ---- 2. release build and tests ---------------------------------------------
step "Release build in $build/"
if timed "build (Release)" build_dir "$build" -DCMAKE_BUILD_TYPE=Release; then
  step "ctest in $build/"
  timed "ctest (Release)" ctest --test-dir "$build" --output-on-failure -j "$ctest_jobs"
else
  skipped "ctest (Release)"
fi

# ---- 3. sanitizer build and tests -------------------------------------------
step "AddressSanitizer + UndefinedBehaviorSanitizer build in $asan_build/"
if timed "build (ASan+UBSan)" build_dir "$asan_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHPDL_SANITIZE=ON; then
  step "ctest in $asan_build/"
  # intercept_tls_get_addr=0: tests/CMakeLists.txt says why
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timed "ctest (ASan+UBSan)" ctest --test-dir "$asan_build" --output-on-failure \
    -j "$ctest_jobs" -LE 'cuda_emu|cuda_layouts|sanitize_redundant' -E '^cuda[.]optim[.]'
else
  skipped "ctest (ASan+UBSan)"
fi

# ---- 4. fuzzing ---------------------------------------------------------------
# fuzz/run.sh builds and runs the targets; the time is split so that the
# step costs what the front end's minute alone did.
fuzz_readers=(ckpt data artifact cluster metrics trace)
run_fuzzers() {
  local t0 left front each status=0
  t0=$(date +%s)
  # seeds from the release build's tools (step 2); without them, from the
  # repository's files and the corpora alone. Their few seconds come out of
  # the fuzzing time.
  bash fuzz/run.sh seeds "$build/bin"
  left=$((fuzz_seconds - ($(date +%s) - t0)))
  front=$((left / 3))
  [ "$front" -lt 1 ] && front=1
  each=$(((left - front) / ${#fuzz_readers[@]}))
  [ "$each" -lt 1 ] && each=1
  bash fuzz/run.sh run "$front" frontend || status=1
  bash fuzz/run.sh run "$each" "${fuzz_readers[@]}" || status=1
  return "$status"
}

step "libFuzzer targets in $fuzz_build/"
if timed "build (fuzzers)" bash fuzz/run.sh build; then
  step "Fuzzing for ${fuzz_seconds}s: the front end, then ${fuzz_readers[*]}"
  timed "fuzz (${fuzz_seconds}s)" run_fuzzers
else
  skipped "fuzz"
fi

# ---- summary ------------------------------------------------------------------
step "Summary ($(($(date +%s) - t_start))s in all)"
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "test: FAILED"
  exit 1
fi
echo "test: all passed"
