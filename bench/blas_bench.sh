#!/usr/bin/env bash
# blas_bench.sh - the BLAS libraries installed here on the GEMMs of a GPT-2
# small step (bench/blas_bench.c), on all cores: how the artifact's BLAS was
# chosen (docs/runtime.md, "The BLAS"). Debian: apt-get install libopenblas0
# libblis4-pthread. Not a test: timings depend on the machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
threads=$(nproc 2>/dev/null || echo 2)
exe=$(mktemp)
trap 'rm -f "$exe"' EXIT
cc -O2 -o "$exe" bench/blas_bench.c -ldl
found=0
for lib in /usr/lib/*/libopenblas.so.0 /usr/lib/*/blis-pthread/libblis.so.4 /usr/lib/*/blis-openmp/libblis.so.4; do
  [ -e "$lib" ] || continue
  found=1
  OPENBLAS_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$exe" "$lib"
done
[ $found = 1 ] || { echo "blas_bench: no OpenBLAS or BLIS found" >&2; exit 1; }
