#!/usr/bin/env bash
# run.sh - builds and runs the libFuzzer targets; scripts/test.sh (a minute
# in all) and bench/fuzz_long.sh (hours) both go through it.
#
#   fuzz/run.sh build                    configure and build them with clang
#   fuzz/run.sh seeds BIN_DIR            the seed corpora (fuzz/seeds.sh), from
#                                        the tools in BIN_DIR (a release build)
#   fuzz/run.sh run SECONDS TARGET...    each TARGET for SECONDS, one after the other
#
# Folders, under HPDL_FUZZ_BUILD_DIR (default build-fuzz): bin/fuzz_<target>,
# seeds/<target>/, corpus-<target>/ (what the fuzzer found; kept between
# runs), artifacts-<target>/ (the input of a failure), fuzz-<target>.log.
# A crash, a sanitizer report, a leak, a hang (10 s on one input) or 2 GB
# of memory fails the target: `run` then prints the end of its log and
# exits 1, after running the others.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzz_build=${HPDL_FUZZ_BUILD_DIR:-build-fuzz}
targets=(frontend ckpt data artifact cluster metrics trace)

find_clang() {
  if command -v clang >/dev/null 2>&1; then
    command -v clang
    return
  fi
  compgen -c clang- | grep -E '^clang-[0-9]+$' | sort -t- -k2 -n | tail -n 1
}

build() {
  local cc
  cc=$(find_clang)
  if [ -z "$cc" ]; then
    echo "fuzz: no clang found; libFuzzer needs it (scripts/setup.sh installs it)" >&2
    return 1
  fi
  # Every object is instrumented for coverage and checked by ASan and UBSan.
  # Warnings are not errors here: the gcc builds are the warning gate.
  CC=$cc cmake -S . -B "$fuzz_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHPDL_FUZZ=ON \
    -DHPDL_WERROR=OFF \
    "-DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" &&
    cmake --build "$fuzz_build" -j "$(nproc 2>/dev/null || echo 2)" --target hpdl-fuzzers
}

# run_one TARGET SECONDS
run_one() {
  local t=$1 seconds=$2 corpus=$fuzz_build/corpus-$1 artifacts=$fuzz_build/artifacts-$1
  local dict=fuzz/$1.dict log=$fuzz_build/fuzz-$1.log seeds=$fuzz_build/seeds/$1 status execs
  [ "$t" = frontend ] && dict=fuzz/hpd.dict
  if [ ! -x "$fuzz_build/bin/fuzz_$t" ]; then
    echo "fuzz: no $fuzz_build/bin/fuzz_$t (fuzz/run.sh build makes it)" >&2
    return 1
  fi
  # the front end's corpus of earlier versions of scripts/test.sh
  if [ "$t" = frontend ] && [ -d "$fuzz_build/corpus" ] && [ ! -d "$corpus" ]; then
    mv "$fuzz_build/corpus" "$corpus"
  fi
  mkdir -p "$corpus" "$artifacts" "$seeds"
  rm -f "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*
  echo "fuzz: $t for ${seconds}s: $(find "$seeds" -type f | wc -l) seeds, $(find "$corpus" -type f | wc -l) inputs in $corpus"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$fuzz_build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -dict="$dict" -artifact_prefix="$artifacts/" "$corpus" "$seeds" >"$log" 2>&1
  status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz: $t FAILED after ${execs:-?} executions; the input that broke it is in $artifacts/:"
    ls -l "$artifacts"
    echo "fuzz: reproduce with: $fuzz_build/bin/fuzz_$t $artifacts/<file>"
    echo "fuzz: then save it as fuzz/regressions/$t/<name> (tests/reliability.cmake replays it)"
    return 1
  fi
  echo "fuzz: $t: ${execs:-?} executions in ${seconds}s, $(find "$corpus" -type f | wc -l) inputs in the corpus"
}

case ${1:-} in
build) build ;;
seeds)
  [ $# -eq 2 ] || { echo "usage: $0 seeds BIN_DIR" >&2; exit 2; }
  bash fuzz/seeds.sh "$2" "$fuzz_build/seeds"
  ;;
run)
  [ $# -ge 3 ] || { echo "usage: $0 run SECONDS TARGET... (targets: ${targets[*]})" >&2; exit 2; }
  seconds=$2
  shift 2
  failed=0
  for t in "$@"; do run_one "$t" "$seconds" || failed=1; done
  exit "$failed"
  ;;
*)
  echo "usage: $0 build | seeds BIN_DIR | run SECONDS TARGET... (targets: ${targets[*]})" >&2
  exit 2
  ;;
esac
