#!/usr/bin/env bash
# demo.sh - builds hpdl (Release, in ./build) and runs it on the GPT-2 sample:
# `hpdlc check` (as given, resized with -D, and with a deliberate mistake to
# show the diagnostics) and `hpdlc plan`; then compiles the tiny GPT-2
# (samples/gpt2-tiny.hpd) for 2 CPU ranks and trains it for 300 steps on
# generated English-like text (hpdl-data --synthetic, no download), the loss
# falling from ln 256 = 5.5 to about 1.5. Its files go to build/demo/.
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

# ---- compile and train the tiny GPT-2 on 2 CPU ranks ----
tiny=samples/gpt2-tiny.hpd
work=$build/demo
hpdlrun=$build/bin/hpdlrun
ranks=2
layout=(--dp 2)
if ! command -v "${HPDL_MPIRUN:-mpirun}" >/dev/null 2>&1 || ! "$hpdlrun" --version | grep -q "collectives: mpi"; then
  echo "(no MPI here: training on one rank instead; scripts/setup.sh installs Open MPI)"
  ranks=1
  layout=()
fi
rm -rf "$work/gpt2-tiny" "$work/ckpt"
mkdir -p "$work/data"

step "Compiling $tiny for $ranks CPU rank(s): partitioned, differentiated, memory-planned, code-generated"
run "$hpdlc" compile "$tiny" "${layout[@]}" -o "$work/gpt2-tiny"
if grep -q '"executor": "interp"' "$work/gpt2-tiny/manifest.json"; then
  # Without the CPU back end (no LLVM) the reference executor runs the job,
  # about 10x slower: a smaller model keeps the demo within two minutes.
  echo "(no CPU back end in this build: the reference executor runs it, so the model shrinks to -D C=32 -D T=16)"
  run "$hpdlc" compile "$tiny" -D C=32 -D T=16 "${layout[@]}" -o "$work/gpt2-tiny"
fi

step "Generating 2 MB of English-like text as byte tokens (no download)"
if [ ! -f "$work/data/tiny_train_000000.bin" ]; then
  run "$build/bin/hpdl-data" --synthetic 2000000 --seed 1 -o "$work/data/tiny"
else
  echo "(already there: $work/data/tiny_train_000000.bin)"
fi

step "Training it: 300 steps on $ranks CPU rank(s), the loss falling from ln 256 = 5.55"
run "$hpdlrun" -np "$ranks" "$work/gpt2-tiny" --data "$work/data/tiny_train_*.bin" --steps 300 --log-every 25 \
  --checkpoint-dir "$work/ckpt"
