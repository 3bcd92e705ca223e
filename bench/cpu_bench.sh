#!/usr/bin/env bash
# cpu_bench.sh - the CPU speed goals (issues #5 and 16), measured on this machine:
#
#   1. samples/gpt2.hpd (124M) at B=4, T=64, fp32, AdamW, one rank: ms per
#      training step of `hpdlc compile --target cpu` + `hpdlrun`, against
#      PyTorch eager on the same model and thread count (bench/torch_gpt2.py;
#      $HPDL_TORCH_PYTHON names a Python with the torch to compare with, e.g.
#      a virtual environment with PyPI's newest). Goal: >= 3x.
#   2. That step's model FLOP/s (the planner's flops_per_step / step time)
#      as a fraction of an OpenBLAS sgemm measured in the same run (the
#      `hpdlc plan --measure-cpu` benchmark, compiler/plan/cpubench.c). Goal >= 75%.
#   2b. Start-up of that run: `hpdlrun --steps 0` (initial values, first
#      touch of the arena). Goal < 2 s.
#   2c. The same model at B=1, T=1024 (attention-heavy): FLOP/s against the
#      same sgemm. Goal >= 60%.
#   3. Weak scaling with one thread per rank: tokens/s of dp=2 on 2 ranks
#      against one rank (a mid-size GPT-2, 3.2M parameters, where compute
#      dominates). Goal >= 1.9x.
#   5. samples/resnet18.hpd (torchvision's resnet18) at B=32 on 3x32x32
#      synthetic images: ms per step against PyTorch eager (bench/torch_resnet.py),
#      same threads. Goal: faster than PyTorch (ratio >= 1).
#   4. Wall time of `hpdlc compile samples/gpt2.hpd --target cpu`. Goal < 2 s.
#
#   bash bench/cpu_bench.sh [BUILD_DIR] [--quick] [--no-coretype]
#
# Builds hpdlc, hpdlrun and the CPU program in BUILD_DIR (default build,
# configured as Release when it does not exist) and prints one table:
# measure, value, baseline, ratio, goal, met. Rows 1 and 2 are measured twice
# when the CPU has AVX-512: with OpenBLAS as Debian ships it (its run-time
# detection falls back to generic kernels on CPUs it does not know) and with
# OPENBLAS_CORETYPE=SkylakeX (the AVX-512 kernels), labelled. PyTorch comes
# from `python3 -c 'import torch'` (Debian: apt-get install python3-torch);
# without it the PyTorch ratio is skipped with a note. --quick times fewer
# steps. Not a test: timings depend on the machine and on what else runs on
# it (the load average is printed before and after).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
extra=()
for a in "$@"; do
  case "$a" in
    --*) extra+=("$a") ;;
    *) build=$a ;;
  esac
done
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "bench: configuring $build (Release)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target hpdlc hpdlrun hpdl-data hpdl_program >/dev/null
exec python3 bench/cpu_bench.py --bin "$build/bin" "${extra[@]}"
