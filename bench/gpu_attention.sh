#!/usr/bin/env bash
# gpu_attention.sh - on a machine with a GPU: GPT-2 124M's forward + backward with flash
# and with materialised attention at longer sequences (where flash attention's memory
# and time should win), and Nsight Compute's view of the three attention kernels (speed
# of light, warp stalls, occupancy) where ncu can read the counters.
#
#   bench/gpu_attention.sh [TEST_DEVICE] [OUT_DIR]
# TEST_DEVICE: the test_device binary (default build/tests/test_device); logs go to
# OUT_DIR (default .). With TF32 GEMMs (HPDL_GEMM_TF32=1, so one TF32 product a term in
# the attention kernels), as the faster of the two benches' settings.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/tests/test_device}
out=${2:-.}
export HPDL_SOURCE_DIR=$here HPDL_STDLIB=$here/stdlib HPDL_GEMM_TF32=1
export HPDL_CACHE=${HPDL_CACHE:-/tmp/hpdl-nvrtc-cache}
for tm in "2048 2" "4096 1"; do
  set -- $tm
  for attn in flash materialized; do
    echo "== GPT-2 124M at T = $1, micro batch $2, $attn attention, TF32"
    timeout 300 "$bin" --device cuda --bench 5 --micro "$2" --attention $attn gpt2.hpd -D T="$1" 2>&1 |
      tee "$out/long.$1.$attn.log" | grep -E "^bench:|error|out of memory" | head -3
  done
done
if command -v ncu > /dev/null; then
  echo "== ncu: the attention kernels of one layer (forward, dkdv, dq), T = 1024, micro batch 4"
  timeout 240 ncu --clock-control none --kernel-name regex:'hpd_blocks_(fwd_k17|grad_k33_s1|grad_k33_s2)$' \
    --launch-count 3 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    "$bin" --device cuda --bench 1 --micro 4 gpt2.hpd > "$out/ncu.log" 2>&1
  echo "   exit $?"
  grep -E "hpd_blocks|Throughput|Duration|Stall|Achieved Occupancy|Registers|Warp Cycles|Theoretical Occ|Block Limit|==PROF==|==ERROR==" \
    "$out/ncu.log" | head -90
else
  echo "gpu_attention: no ncu here"
fi
