# ir.cmake - golden dumps of the IR stages: `hpdlc emit grad` of small models
# is compared with tests/ir/NAME.grad (one CTest test per case, named
# ir.NAME), and must exit 0 (the appended graphs verify).
#
# To (re)generate the expected output after a deliberate change:
#   cmake --build build --target ir-golden-update
# then read every changed file (git diff) before committing it.

set(HPDL_IR_UPDATE_COMMANDS)

# hpdl_ir_stage(STAGE NAME FILE [hpdlc arguments...]): `emit STAGE` compared
# with tests/ir/NAME.STAGE
function(hpdl_ir_stage stage name file)
  string(REPLACE ";" " " args_text "${ARGN}")
  set(golden ${HPDL_TEST_DIR}/ir/${name}.${stage})
  add_test(NAME ir.${name}.${stage}
           COMMAND bash -c "set -o pipefail; \"$1\" emit ${stage} ${args_text} \"$2\" | diff -u \"$3\" -"
                   ir-golden $<TARGET_FILE:hpdlc> ${CMAKE_SOURCE_DIR}/${file} ${golden})
  set_tests_properties(ir.${name}.${stage} PROPERTIES TIMEOUT 60 LABELS ir)
  set(HPDL_IR_UPDATE_COMMANDS ${HPDL_IR_UPDATE_COMMANDS}
      COMMAND bash -c "\"$1\" emit ${stage} ${args_text} \"$2\" > \"$3\""
              ir-golden $<TARGET_FILE:hpdlc> ${CMAKE_SOURCE_DIR}/${file} ${golden}
      PARENT_SCOPE)
endfunction()

# hpdl_ir_golden(NAME FILE [hpdlc arguments...]): the backward graphs
macro(hpdl_ir_golden name file)
  hpdl_ir_stage(grad ${name} ${file} ${ARGN})
endmacro()

set(HPDL_IR_TINY_GPT2 --micro-batch 2 --global-batch 2 -D T=8 -D C=16 -D V=32)
hpdl_ir_golden(mlp samples/mlp.hpd)
hpdl_ir_golden(gpt2-tiny-none samples/gpt2-tiny.hpd --recompute none ${HPDL_IR_TINY_GPT2})
hpdl_ir_golden(gpt2-tiny-selective samples/gpt2-tiny.hpd --recompute selective ${HPDL_IR_TINY_GPT2})
hpdl_ir_golden(gpt2-tiny-full samples/gpt2-tiny.hpd --recompute full ${HPDL_IR_TINY_GPT2})
hpdl_ir_golden(llama-selective samples/llama.hpd --recompute selective --micro-batch 1 --global-batch 1
               -D layers=2 -D hidden=16 -D heads=4 -D kv_heads=2 -D ffn=32 -D seq=8 -D vocab=32
               --cluster laptop --nodes 1 --dp 1 --tp 1 --sp off)

# recompute = act: SwiGLU's product silu(gate) x up, the down projection's input, made again
# in the backward (before the down projection's weight gradient) from the saved gate and up,
# not kept: one saved value fewer a layer, the [B, T, ffn] product (autodiff.c's gated_product)
hpdl_ir_golden(llama-act samples/llama.hpd --recompute act --micro-batch 1 --global-batch 1
               -D layers=2 -D hidden=16 -D heads=4 -D kv_heads=2 -D ffn=32 -D seq=8 -D vocab=32
               --cluster laptop --nodes 1 --dp 1 --tp 1 --sp off)

# GPT-OSS keeping its activations: the clamped SwiGLU's ops of one value and constants
# (clamps, the +1, the 1.702 scale) made again in the backward from the experts' GEMM
# outputs, not kept (autodiff.c's constant_chain_recompute: 57 saved values, 65 before)
hpdl_ir_golden(gpt-oss-none samples/gpt-oss.hpd --recompute none --micro-batch 1 --global-batch 1 -D layers=4
               -D hidden=16 -D heads=4 -D kv_heads=2 -D head_dim=8 -D experts=4 -D top_k=2 -D ffn=8 -D window=4
               -D seq=8 -D vocab=64 --cluster laptop --nodes 1 --dp 1 --tp 1 --ep 1 --pp 1)
# the forward IR, and the per-rank programs of partitioned layouts
hpdl_ir_stage(ir mlp samples/mlp.hpd)
hpdl_ir_stage(ir gpt2-tiny samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2})
# Qwen3's QK-norm and rotary embedding run on [B, T, H, D], the heads' transposes after
# them (lower.c's sink_rope_transposes), so the attention reads three transposes
# its edges: the rotation of the split itself and of a QK-norm-like chain moved, a split
# read elsewhere too and a per-head scale kept; and their gradients
hpdl_ir_stage(ir rope-sink tests/ir/rope-sink.hpd)
hpdl_ir_stage(grad rope-sink tests/ir/rope-sink.hpd)
# compiler/ir/moepack.c's edges: a dropless layer over its routed rows (grouped_mm, a
# per-expert bias, a clamp and a scale between), one that drops tokens and one whose
# slots are read elsewhere kept over slots; emit ir shows the IR as written
hpdl_ir_stage(ir moe-pack tests/ir/moe-pack.hpd)
hpdl_ir_stage(grad moe-pack tests/ir/moe-pack.hpd)
# dropless at cp 2: each context rank routes its own tokens (topk, moe_expert_ids, the
# packed dispatch, the grouped GEMMs and the combine on [B, T / 2, ...] and its rows)
hpdl_ir_stage(spmd moe-dropless-cp2 samples/moe-tiny.hpd -D drop=false -D L=1 --cp 2 --gpus 2 --dp 1)
# expert parallelism's slots expert-major (moepack.c, moe_expert_major): the all-to-all
# along the rows (split=0 concat=1, back split=1 concat=0), one GEMM an expert over
# [E/ep, ep B cap, C], its weight gradient with no sum_to; at tp 2 the f marker on the
# tokens before the dispatch and the pending sum made after the combine; a long dropless
# layer (T = 128 slots an expert, 64 wide) left in [B, E, cap, C] (major_pays)
hpdl_ir_stage(grad moe-major-ep2 samples/moe-tiny.hpd -D L=1 --dp 2 --ep 2 --gpus 2)
hpdl_ir_stage(spmd moe-major-ep2-tp2 samples/moe-tiny.hpd -D L=1 --dp 2 --ep 2 --tp 2 --gpus 4)
hpdl_ir_stage(spmd moe-long-ep2 samples/moe-tiny.hpd -D L=1 -D T=128 -D drop=false --dp 2 --ep 2 --gpus 2)
hpdl_ir_stage(ir qwen3-tiny samples/qwen3.hpd --tp 1 --dp 1 --gpus 1 -D layers=1 -D hidden=64 -D heads=2
              -D kv_heads=1 -D head_dim=16 -D ffn=64 -D seq=8 -D vocab=32)
hpdl_ir_stage(spmd gpt2-tiny-tp2-sp-pp2 samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2} --tp 2 --sp on --pp 2)
hpdl_ir_stage(spmd llama-tp2-cp2 samples/llama.hpd --micro-batch 1 --global-batch 1
              -D layers=2 -D hidden=16 -D heads=4 -D kv_heads=2 -D ffn=32 -D seq=8 -D vocab=32
              --cluster laptop --gpus 4 --dp 1 --tp 2 --cp 2 --sp off)
# cp_comm = ring (spmd.c, ring_attention): keys and values packed into one message a step,
# its send before the first block's attention (block=0/2), its receive after, the second
# block's attention (block=1/2) and attn_merge of the two
hpdl_ir_stage(spmd llama-tp2-cp2-ring samples/llama.hpd --micro-batch 1 --global-batch 1
              -D layers=2 -D hidden=16 -D heads=4 -D kv_heads=2 -D ffn=32 -D seq=8 -D vocab=32
              --cluster laptop --gpus 4 --dp 1 --tp 2 --cp 2 --sp off --cp-comm ring)
# an extern (tests/extern/ext_lm.hpd; printing needs no library): its table, the call and
# the gradient function's one call sliced per argument; at tp=2 its arguments gathered whole
set(HPDL_IR_EXT_LM tests/extern/ext_lm.hpd --micro-batch 1 --global-batch 1 -D V=16 -D T=4 -D C=8 -D L=1)
hpdl_ir_golden(ext-lm ${HPDL_IR_EXT_LM})
hpdl_ir_stage(spmd ext-lm-tp2 ${HPDL_IR_EXT_LM} --gpus 2 --tp 2)

# the data-parallel synchronisation (dpsync.h): all-reduce, reduce-scatter of
# flat pieces, and ZeRO-3's parameter pieces gathered at their use
set(HPDL_IR_TINY_GPT2_DP2 --micro-batch 2 --global-batch 4 -D T=8 -D C=16 -D V=32 --dp 2)
hpdl_ir_stage(dp gpt2-tiny-dp2-zero0 samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2_DP2} --zero 0)
hpdl_ir_stage(dp gpt2-tiny-dp2-zero2 samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2_DP2} --zero 2)
hpdl_ir_stage(dp gpt2-tiny-dp2-zero3 samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2_DP2} --zero 3)
# three ranks: the pieces are padded
hpdl_ir_stage(dp mlp-dp3-tp2-zero2 samples/mlp.hpd --micro-batch 4 --global-batch 12 --dp 3 --tp 2 --zero 2 --gpus 6)
hpdl_ir_stage(dp mlp-dp3-zero3 samples/mlp.hpd --micro-batch 4 --global-batch 12 --dp 3 --zero 3 --gpus 3)

hpdl_ir_stage(schedule gpt2-tiny-interleaved samples/gpt2-tiny.hpd -D L=4 --pp 2 --virtual-stages 2 --schedule interleaved
              --micro-batch 1 --global-batch 4 --gpus 2)

# each pipeline chunk's step cut into forward and backward, and the stash between
hpdl_ir_stage(stash gpt2-tiny-pp2-selective samples/gpt2-tiny.hpd ${HPDL_IR_TINY_GPT2} --pp 2 --recompute selective)

add_custom_target(ir-golden-update ${HPDL_IR_UPDATE_COMMANDS}
                  DEPENDS hpdlc
                  COMMENT "Rewriting tests/ir/*.grad from the current hpdlc"
                  VERBATIM)
