#!/usr/bin/env bash
# gpu_tests_rehearsal.sh BUILD - bench/gpu_tests.py end to end without a GPU:
# `prepare` lists three of the suite's GPU tests (a layout, a resume across
# ZeRO stages, a device step) with their CPU halves' metrics into a bundle
# whose tools are this build's, and `run --device emulate` runs their device
# halves on the emulated device against those metrics: each must pass, the
# resumed run from metrics of the uninterrupted CPU run, and the list must
# name the tests it leaves out. Exit 77 where the emulated device cannot run.
set -u
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$(mktemp -d /tmp/hpdl-gpu-tests.XXXXXX)
trap 'rm -rf "$bundle"' EXIT
mkdir -p "$bundle/bin"
for t in hpdlc hpdlrun hpdl-data; do ln -s "$build/bin/$t" "$bundle/bin/$t"; done
ln -s "$build/tests/test_device" "$bundle/bin/test_device"
want='^cuda\.(layout\.cuda\.(1rank|zero3_resume)|gpu\.step\.gpt2-tiny)$'
python3 "$here/bench/gpu_tests.py" prepare --build "$build" --bundle "$bundle" -j 2 --regex "$want" > "$bundle/prepare.log" 2>&1 ||
  { cat "$bundle/prepare.log"; exit 1; }
grep -q "^gpu_tests: 3 tests listed" "$bundle/prepare.log" || { echo "prepare did not list 3 tests:"; cat "$bundle/prepare.log"; exit 1; }
[ -s "$bundle/cpu-metrics/cuda.layout.cuda.zero3_resume.jsonl" ] || { echo "no CPU metrics for the resumed layout"; exit 1; }
out=$(python3 "$here/bench/gpu_tests.py" run --bundle "$bundle" -j 2 --device emulate 2>&1)
rc=$?
echo "$out"
if echo "$out" | grep -q "skipped: no C++ compiler"; then exit 77; fi
[ $rc -eq 0 ] && echo "$out" | grep -q "^gpu_tests: 3 pass$" || { echo "expected 3 passing tests"; exit 1; }
echo "$out" | grep -q "^PASS *cuda.layout.cuda.zero3_resume .*emulate against cpu: agree within 1e-05 over 20 steps" ||
  { echo "the resumed layout did not agree with the CPU metrics"; exit 1; }
