#!/usr/bin/env bash
# gpu_bundle.sh - a folder to take to a GPU machine that has the NVIDIA driver
# and CUDA's libraries but none of this project's build dependencies (no
# jansson, libffi, Open MPI, LLVM): hpdlc, hpdlrun, hpdl-data and test_device
# built here without the LLVM back end (the CUDA target needs none of it),
# Debian's packages of the run-time libraries, and env.sh, which unpacks them
# under /tmp and sets the paths (Open MPI relocated with OPAL_PREFIX).
#
#   bench/gpu_bundle.sh [OUT]          (default OUT: .gpubundle, git-ignored)
# then, on the GPU machine, from the repository root:
#   source OUT/env.sh
#   OUT/bin/hpdlrun --info
#   BUNDLE=OUT bash bench/gpu_bench.sh OUT/bin/test_device LOGS
#   bash bench/gpu_train_bench.sh OUT
#   bash bench/gpu_session.sh OUT LOGS [BUDGET_S]   (all of it in one budgeted visit)
#   HPDL_SOURCE_DIR=$PWD OUT/bin/test_device --device cuda --kernels gpt2-tiny.hpd
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/.gpubundle}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$here/build-gpu
echo "gpu_bundle: building into $build (no LLVM back end)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHPDL_WITH_LLVM=OFF > "$out/cmake.log"
cmake --build "$build" -j "$(nproc)" --target hpdlc hpdlrun hpdl-data test_device hpdl_program >> "$out/cmake.log"
mkdir -p "$out/bin" "$out/lib" "$out/debs"
cp "$build/bin/hpdlc" "$build/bin/hpdlrun" "$build/bin/hpdl-data" "$build/tests/test_device" "$out/bin/"
cp "$build/lib/hpdl-program.so" "$out/lib/"
# The suite's GPU tests (bench/gpu_tests.py): their list and the CPU halves'
# metrics, from the full build, where there is one (the GPU machine's hpdlc,
# without LLVM, compiles no CPU target); the extern model's files beside them
if [ -x "$here/build/bin/hpdlc" ] && "$here/build/bin/hpdlc" compile --help 2>&1 | grep -- "--target" > /dev/null; then
  if [ -f "$here/build/tests/extern/libhpdl_testops.so" ]; then
    mkdir -p "$out/extern"
    cp "$here/build/tests/extern/ext_lm.hpd" "$here/build/tests/extern/libhpdl_testops.so" "$out/extern/"
  fi
  echo "gpu_bundle: the GPU tests' list and their CPU halves (from $here/build)"
  python3 "$here/bench/gpu_tests.py" prepare --build "$here/build" --bundle "$out" -j "$(nproc)" > "$out/gpu_tests.log" 2>&1 ||
    { echo "gpu_bundle: a CPU half failed:"; grep -E "FAILED|^    " "$out/gpu_tests.log" | head -20; exit 1; }
  grep -E "^gpu_tests: [0-9]+ tests" "$out/gpu_tests.log"
else
  echo "gpu_bundle: no full build in $here/build: no GPU tests' list (gpu_bench.sh runs the device-layer tests alone)"
fi
echo "gpu_bundle: Debian's run-time libraries"
(cd "$out/debs" && apt-get download -q libjansson4 libffi8 libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 \
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 > /dev/null)
cat > "$out/env.sh" <<'EOF'
# Source from the repository root on the GPU machine: the bundle's libraries
# unpacked under /tmp/hpdl-root, the paths set, Open MPI relocated there.
b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
r=/tmp/hpdl-root
mkdir -p "$r"
for f in "$b"/debs/*.deb; do dpkg -x "$f" "$r"; done
export LD_LIBRARY_PATH=$r/usr/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$b/bin:$r/usr/bin:$PATH OPAL_PREFIX=$r/usr
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1
export HPDL_STDLIB=$PWD/stdlib HPDL_KERNELS_DIR=$PWD/kernels HPDL_SOURCE_DIR=$PWD HPDL_CACHE=/tmp/hpdl-nvrtc-cache
EOF
echo "gpu_bundle: $out ($(du -sh "$out" | cut -f1)); on the GPU machine: source $(basename "$out")/env.sh"
