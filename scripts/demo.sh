#!/usr/bin/env bash
# demo.sh - builds hpdl (Release, in ./build) and runs it on the GPT-2 sample:
# `hpdlc check` (as given, resized with -D, and with a deliberate mistake to
# show the diagnostics), then `hpdlc plan` once the planner exists.
#
# Run it from anywhere; it works in the repository root. Set HPDL_BUILD_DIR
# to build somewhere else than ./build.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${HPDL_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
sample=samples/gpt2.hpd

step() { printf '\n==> %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# quiet CMD...: runs CMD with its output in a log, shown only when it fails.
quiet() {
  local log
  log=$(mktemp)
  printf '$ %s\n' "$*"
  if ! "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    rm -f "$log"
    printf 'demo: failed: %s\n' "$*" >&2
    exit 1
  fi
  rm -f "$log"
}

step "Configuring and building hpdl (Release) in $build/"
quiet cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
quiet cmake --build "$build" -j "$jobs"
hpdlc=$build/bin/hpdlc
run "$hpdlc" --version

if [ ! -f "$sample" ]; then
  printf 'demo: %s is missing; nothing to demonstrate\n' "$sample" >&2
  exit 1
fi

step "Checking $sample: syntax, names, types, shapes and the parallel layout"
run "$hpdlc" check "$sample"

step "The same file as GPT-2 medium: -D overrides the model's parameters"
run "$hpdlc" check -D L=24 -D C=1024 -D H=16 "$sample"

step "A mistake on purpose: 10 heads do not divide a width of 768"
status=0
run "$hpdlc" check -D H=10 "$sample" || status=$?
echo "(exit status $status: 1 means errors in the input, as expected here)"

if "$hpdlc" plan --help >/dev/null 2>&1; then
  step "Planning $sample: memory per GPU, communication, step time, MFU"
  run "$hpdlc" plan "$sample"
else
  step "hpdlc plan is not built yet; skipping the plan of $sample"
fi
