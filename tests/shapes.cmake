# shapes.cmake - shape inference and overrides, checked through the one-line
# summary of `hpdlc check` (model, exact parameter count, layout), and the
# parse -> print -> parse round trip of every sample and stdlib file.
#
#   shapes.<name>     hpdlc check ARGS... must exit 0 and print exactly the
#                     expected line (tests/shapes/check_summary.sh); run from
#                     the source root, so the path in the line is samples/...
#   roundtrip.<file>  emit source twice gives the same text, and emit ast of
#                     the file and of its printed source agree once spans are
#                     removed (tests/shapes/roundtrip.sh)
#
# Every expected count below is derived by hand from the architecture (see the
# comments), not copied from hpdlc's output.

# hpdl_shape_test(NAME EXPECTED_LINE ARGS...)
function(hpdl_shape_test name expected)
  add_test(NAME shapes.${name}
           COMMAND bash ${HPDL_TEST_DIR}/shapes/check_summary.sh $<TARGET_FILE:hpdlc>
                   ${CMAKE_SOURCE_DIR} "${expected}" ${ARGN})
  set_tests_properties(shapes.${name} PROPERTIES TIMEOUT 60 LABELS shapes
                       ENVIRONMENT "HPDL_STDLIB=${HPDL_STDLIB_DIR}")
endfunction()

# ---- GPT-2 (samples/gpt2.hpd) ---------------------------------------------------
# Learned positions, pre-LN blocks with biases, tied output layer. With vocabulary
# V, context T, width C and L layers:
#   token embedding V*C + positions T*C
#   per block: ln1, ln2 2*(2C); attention q,k,v,o 4*(C*C + C); MLP C*4C + 4C + 4C*C + C
#              = 12C^2 + 13C
#   final LayerNorm 2C; the output layer is the token embedding (no parameters).
# GPT-2 small, V=50257 T=1024 C=768 L=12:
#   38597376 + 786432 + 12*(7077888 + 9984) + 1536 = 124439808 (OpenAI's 124M)
hpdl_shape_test(gpt2.default
  "samples/gpt2.hpd: ok: model GPT2, 124.4M parameters (124439808); dp=8 tp=1 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  samples/gpt2.hpd)
# GPT-2 medium, C=1024 L=24: 51463168 + 1048576 + 24*(12582912 + 13312) + 2048 = 354823168
hpdl_shape_test(gpt2.medium
  "samples/gpt2.hpd: ok: model GPT2, 354.8M parameters (354823168); dp=8 tp=1 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  -D L=24 -D C=1024 -D H=16 samples/gpt2.hpd)
# GPT-2 large, C=1280 L=36: 64328960 + 1310720 + 36*(19660800 + 16640) + 2560 = 774030080
hpdl_shape_test(gpt2.large
  "samples/gpt2.hpd: ok: model GPT2, 774.0M parameters (774030080); dp=8 tp=1 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  -D L=36 -D C=1280 -D H=20 samples/gpt2.hpd)
# GPT-2 XL, C=1600 L=48: 80411200 + 1638400 + 48*(30720000 + 20800) + 3200 = 1557611200
hpdl_shape_test(gpt2.xl
  "samples/gpt2.hpd: ok: model GPT2, 1.56B parameters (1557611200); dp=8 tp=1 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  -D L=48 -D C=1600 -D H=25 samples/gpt2.hpd)
# The vocabulary padded to 50304 (llm.c): 47 more rows of 768 = +36096 -> 124475904.
# Tensor and pipeline degrees from the command line appear in the summary.
hpdl_shape_test(gpt2.padded_tp2
  "samples/gpt2.hpd: ok: model GPT2, 124.5M parameters (124475904); dp=4 tp=2 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  -D V=50304 --tp 2 --dp 4 samples/gpt2.hpd)
hpdl_shape_test(gpt2.padded_tp4_pp2
  "samples/gpt2.hpd: ok: model GPT2, 124.5M parameters (124475904); dp=1 tp=4 pp=2 cp=1 on dgx-a100-80gb (8 devices)"
  -D V=50304 --tp 4 --pp 2 --dp 1 samples/gpt2.hpd)
# Another cluster and node count; the parameter count does not change.
hpdl_shape_test(gpt2.h100_2nodes
  "samples/gpt2.hpd: ok: model GPT2, 124.4M parameters (124439808); dp=16 tp=1 pp=1 cp=1 on dgx-h100 (16 devices)"
  --cluster dgx-h100 --nodes 2 --dp 16 --micro-batch 32 samples/gpt2.hpd)
hpdl_shape_test(gpt2.gpus4
  "samples/gpt2.hpd: ok: model GPT2, 124.4M parameters (124439808); dp=4 tp=1 pp=1 cp=1 on dgx-a100-80gb (4 devices)"
  --gpus 4 --dp 4 samples/gpt2.hpd)

# ---- GPT-2 tiny (samples/gpt2-tiny.hpd), same formula ---------------------------
# V=256 T=64 C=64 L=2: 16384 + 4096 + 2*(49152 + 832) + 128 = 120576
hpdl_shape_test(gpt2_tiny.default
  "samples/gpt2-tiny.hpd: ok: model GPT2Tiny, 120.6K parameters (120576); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  samples/gpt2-tiny.hpd)
# T=128 C=128 L=4: 32768 + 16384 + 4*(196608 + 1664) + 256 = 842496
hpdl_shape_test(gpt2_tiny.bigger
  "samples/gpt2-tiny.hpd: ok: model GPT2Tiny, 842.5K parameters (842496); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  -D L=4 -D C=128 -D T=128 samples/gpt2-tiny.hpd)
hpdl_shape_test(gpt2_tiny.dp2_tp2_pp2
  "samples/gpt2-tiny.hpd: ok: model GPT2Tiny, 120.6K parameters (120576); dp=2 tp=2 pp=2 cp=1 on cpu (8 devices)"
  --dp 2 --tp 2 --pp 2 --gpus-per-node 8 samples/gpt2-tiny.hpd)

# ---- Llama (samples/llama.hpd) --------------------------------------------------
# No biases, untied head, RMSNorm (weight only), SwiGLU, GQA. With vocabulary V,
# width h, heads a, key/value heads k (head_dim d = h/a), ffn f, L layers:
#   embedding V*h + head h*V
#   per block: q, o 2*h*h; k, v 2*h*(k*d); gate, up, down 3*h*f; two RMSNorms 2h
#   final RMSNorm h
# Llama-2-7B, V=32000 h=4096 k=a=32 f=11008 L=32:
#   262144000 + 32*(4*16777216 + 3*45088768 + 8192) + 4096
#   = 262144000 + 32*202383360 + 4096 = 6738415616 (Meta's 6,738,415,616)
hpdl_shape_test(llama.7b
  "samples/llama.hpd: ok: model Llama, 6.74B parameters (6738415616); dp=4 tp=8 pp=1 cp=1 on dgx-h100 (32 devices)"
  samples/llama.hpd)
# Llama-2-13B, h=5120 a=k=40 f=13824 L=40:
#   327680000 + 40*(4*26214400 + 3*70778880 + 10240) + 5120 = 13015864320
hpdl_shape_test(llama.13b
  "samples/llama.hpd: ok: model Llama, 13.02B parameters (13015864320); dp=4 tp=8 pp=1 cp=1 on dgx-h100 (32 devices)"
  -D layers=40 -D hidden=5120 -D heads=40 -D kv_heads=40 -D ffn=13824 samples/llama.hpd)
# Llama-2-70B (GQA), h=8192 a=64 k=8 (d=128) f=28672 L=80:
#   524288000 + 80*(2*67108864 + 2*8192*1024 + 3*234881024 + 16384) + 8192
#   = 524288000 + 80*855654400 + 8192 = 68976648192
hpdl_shape_test(llama.70b
  "samples/llama.hpd: ok: model Llama, 68.98B parameters (68976648192); dp=4 tp=8 pp=8 cp=1 on dgx-h100 (256 devices)"
  -D layers=80 -D hidden=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 --pp 8 --nodes 32 samples/llama.hpd)
# A toy with GQA, h=256 a=8 k=2 (d=32) f=688 L=4:
#   16384000 + 4*(2*65536 + 2*256*64 + 3*176128 + 512) + 256 = 16384000 + 4*692736 + 256 = 19155200
hpdl_shape_test(llama.toy
  "samples/llama.hpd: ok: model Llama, 19.2M parameters (19155200); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  -D layers=4 -D hidden=256 -D heads=8 -D kv_heads=2 -D ffn=688 -D seq=256
  --cluster laptop --nodes 1 --dp 1 --tp 1 --sp off samples/llama.hpd)

# ---- Nemotron (samples/nemotron.hpd): NeMo's Nemotron-3 8B and Nemotron-4 340B ----
hpdl_shape_test(nemotron.8b
  "samples/nemotron.hpd: ok: model Nemotron, 8.54B parameters (8540135424); dp=32 tp=2 pp=1 cp=1 on dgx-h100 (64 devices)"
  samples/nemotron.hpd)
hpdl_shape_test(nemotron.340b
  "samples/nemotron.hpd: ok: model Nemotron, 341.03B parameters (341029195776); dp=2 tp=8 pp=8 cp=1 on dgx-h100 (128 devices)"
  -D layers=96 -D hidden=18432 -D heads=96 -D kv_heads=8 -D ffn=73728 --tp 8 --pp 8 --nodes 16
  --micro-batch 1 --global-batch 32 samples/nemotron.hpd)
# ---- Mixture of experts (samples/mixtral.hpd, samples/moe-tiny.hpd) ----
# Mixtral 8x7B: 2 x 32000*4096 + 4096 + 32 x (attention 2*4096^2 + 2*4096*1024 = 41943040,
# experts 8*3*4096*14336 = 1409286144, router 4096*8 = 32768, norms 8192) = 46702792704,
# the parameter count of the published checkpoint (mistralai/Mixtral-8x7B-v0.1). Active per
# token, 2 of the 8 experts: 46702792704 - 32 x 6/8 x 1409286144 = 12879925248, Mistral AI's
# "12.9B active parameters" (Mixtral of Experts, Jiang et al. 2024)
hpdl_shape_test(mixtral.8x7b
  "samples/mixtral.hpd: ok: model Mixtral, 46.70B parameters (46702792704), 12.88B active per token (12879925248); dp=4 tp=8 pp=4 cp=1 on dgx-h100 (128 devices)"
  samples/mixtral.hpd)
# Qwen3-30B-A3B (samples/qwen3-moe.hpd; Qwen/Qwen3-30B-A3B's config.json): 2 x 151936*2048
# (untied embeddings) + 2048 + 48 x (attention 2048*4096 + 2*2048*512 + 4096*2048 + 2*128
# (QK-norm) = 18874624, router 2048*128 = 262144, experts 128*3*2048*768 = 603979776, norms
# 4096) = 30532122624, the card's "30.5B in total" (29.9B without the embeddings: 29909792768).
# Active, 8 of the 128 experts: 30532122624 - 48 x 120/128 x 603979776 = 3353032704 ("3.3B
# activated")
hpdl_shape_test(qwen3.30b_a3b
  "samples/qwen3-moe.hpd: ok: model Qwen3MoE, 30.53B parameters (30532122624), 3.35B active per token (3353032704); dp=64 tp=1 pp=1 cp=1 ep=8 on dgx-h100 (64 devices)"
  samples/qwen3-moe.hpd)
# Qwen3-235B-A22B (hidden 4096, 94 layers, 64 query heads, experts of width 1536): 2 x
# 151936*4096 + 4096 + 94 x (71303424 + 524288 + 128*3*4096*1536 + 8192) = 235093634560, the
# card's "235B in total"; active 22190763520 ("22B activated")
hpdl_shape_test(qwen3.235b_a22b
  "samples/qwen3-moe.hpd: ok: model Qwen3MoE, 235.09B parameters (235093634560), 22.19B active per token (22190763520); dp=256 tp=1 pp=1 cp=1 ep=8 on dgx-h100 (256 devices)"
  -D layers=94 -D hidden=4096 -D heads=64 -D ffn=1536 --nodes 32 --dp 256 samples/qwen3-moe.hpd)
# DeepSeek-V3 (samples/deepseek-v3.hpd; deepseek-ai/DeepSeek-V3's config.json, without the
# MTP module): 2 x 129280*7168 + 7168 + 61 x (MLA 7168*1536 + 1536 + 1536*24576 + 7168*576 +
# 512 + 512*32768 + 16384*7168 = 187107328, norms 14336) + 3 x 3*7168*18432 (dense) + 58 x
# (router 7168*256 + experts 256*3*7168*2048 + shared 3*7168*2048) = 671026404352, the
# report's "671B total"; active (8 of 256 routed experts): 671026404352 - 58 x 248 x
# 44040192 = 37552282624 ("37B activated"). The routing bias is a state, not counted.
hpdl_shape_test(deepseek.v3
  "samples/deepseek-v3.hpd: ok: model DeepSeekV3, 671.03B parameters (671026404352), 37.55B active per token (37552282624); dp=128 tp=1 pp=16 cp=1 ep=64 on h800 (2048 devices)"
  samples/deepseek-v3.hpd)
# gpt-oss-120b (samples/gpt-oss.hpd; openai/gpt-oss-120b's config.json): 2 x 201088*2880 + 2880
# + 36 x (attention 2880*4096 + 4096 + 2 x (2880*512 + 512) + 4096*2880 + 2880 + 64 sinks =
# 26550144, norms 5760, router 2880*128 + 128, experts 128 x (2 x (2880*2880 + 2880) +
# 2880*2880) + 128*2880 = 3186524160) = 116829156672 (the card's 116.8B); active, 4 of 128
# experts, 5724839232 (the card's 5.13B without the 579M embedding table)
hpdl_shape_test(gptoss.120b
  "samples/gpt-oss.hpd: ok: model GptOss, 116.83B parameters (116829156672), 5.72B active per token (5724839232); dp=32 tp=1 pp=4 cp=1 ep=8 on dgx-h100 (128 devices)"
  samples/gpt-oss.hpd)
# gpt-oss-20b: 24 blocks, 32 experts: 20914757184 (the card's 20.9B), 4189376064 active (3.61B
# without the table)
hpdl_shape_test(gptoss.20b
  "samples/gpt-oss.hpd: ok: model GptOss, 20.91B parameters (20914757184), 4.19B active per token (4189376064); dp=4 tp=1 pp=4 cp=1 ep=4 on dgx-h100 (16 devices)"
  -D layers=24 -D experts=32 --nodes 2 --dp 4 --ep 4 samples/gpt-oss.hpd)
# moe-tiny: 256*32 (embedding) + 2 x (attention 2*32*32 + 2*32*16 = 3072, router 128,
# experts 3*4*32*64 = 24576, norms 64) + 32 (final norm) + 32*256 (head) = 72096; active, 2 of
# the 4 experts: 72096 - 2 x 24576 / 2 = 47520
hpdl_shape_test(moe.tiny
  "samples/moe-tiny.hpd: ok: model MoETiny, 72.1K parameters (72096), 47.5K active per token (47520); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  samples/moe-tiny.hpd)
# MoE every second block (TransformerGroup): 2 x 256*32 + 32 + 2 x (dense 4*32*32 + 2*32*64 + 64
# = 8256, MoE 4096 + 64 + 32*4 + 3*4*32*64 = 28864) = 90656; active, 2 of the 4 experts in
# each MoE block: 90656 - 2 x 24576 / 2 = 66080
hpdl_shape_test(moe.every2
  "tests/moe/every2.hpd: ok: model Every2, 90.7K parameters (90656), 66.1K active per token (66080); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  tests/moe/every2.hpd)
# GPT-3 175B with GPT-2's vocabulary (50257) at tensor 8, in FP8: the checker
# accepts it (vocab_pad = 128 pads the table for the planner)
hpdl_shape_test(gpt.175b_vocab50257_tp8_fp8
  "samples/gpt.hpd: ok: model GPT, 174.60B parameters (174604259328); dp=8 tp=8 pp=8 cp=1 on dgx-a100-80gb (512 devices)"
  -D layers=96 -D hidden=12288 -D heads=96 -D vocab=50257 --tp 8 --pp 8 --dp 8 --nodes 64 --micro-batch 1
  --global-batch 512 --precision fp8 samples/gpt.hpd)
# Layout overrides appear in the summary.
hpdl_shape_test(llama.tp8_pp2
  "samples/llama.hpd: ok: model Llama, 6.74B parameters (6738415616); dp=2 tp=8 pp=2 cp=1 on dgx-h100 (32 devices)"
  --tp 8 --pp 2 --dp 2 samples/llama.hpd)
hpdl_shape_test(llama.cp2
  "samples/llama.hpd: ok: model Llama, 6.74B parameters (6738415616); dp=2 tp=8 pp=1 cp=2 on dgx-h100 (32 devices)"
  --cp 2 --dp 2 samples/llama.hpd)

# ---- The GPT family of Narayanan et al. 2021, Table 1 (samples/gpt.hpd) ------------
# Same architecture as GPT-2 with V=51200 and s=2048:
#   P = V*h + s*h + L*(12h^2 + 13h) + 2h
# which is the paper's P = 12*L*h^2 * (1 + 13/(12h) + (V + s)/(12*L*h)) plus the
# final LayerNorm (2h) that the paper leaves out. Rounded to 0.1B every row gives
# the paper's column: 1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0.
# The layouts are the paper's (8 GPUs a node).
#   L=24  h=2304:  (51200+2048)*2304  + 24*(12*2304^2 + 13*2304)   + 4608  = 1652230656
hpdl_shape_test(gpt.table1_1.7b
  "samples/gpt.hpd: ok: model GPT, 1.65B parameters (1652230656); dp=32 tp=1 pp=1 cp=1 on dgx-a100-80gb (32 devices)"
  samples/gpt.hpd)
#   L=30  h=3072:  163577856   + 30*(113246208 + 39936)   + 6144  = 3562168320
hpdl_shape_test(gpt.table1_3.6b
  "samples/gpt.hpd: ok: model GPT, 3.56B parameters (3562168320); dp=32 tp=2 pp=1 cp=1 on dgx-a100-80gb (64 devices)"
  -D layers=30 -D hidden=3072 -D heads=32 --tp 2 --nodes 8 samples/gpt.hpd)
#   L=36  h=4096:  218103808   + 36*(201326592 + 53248)   + 8192  = 7467786240
hpdl_shape_test(gpt.table1_7.5b
  "samples/gpt.hpd: ok: model GPT, 7.47B parameters (7467786240); dp=32 tp=4 pp=1 cp=1 on dgx-a100-80gb (128 devices)"
  -D layers=36 -D hidden=4096 -D heads=32 --tp 4 --nodes 16 samples/gpt.hpd)
#   L=40  h=6144:  327155712   + 40*(452984832 + 79872)   + 12288 = 18449756160
hpdl_shape_test(gpt.table1_18.4b
  "samples/gpt.hpd: ok: model GPT, 18.45B parameters (18449756160); dp=32 tp=8 pp=1 cp=1 on dgx-a100-80gb (256 devices)"
  -D layers=40 -D hidden=6144 -D heads=48 --tp 8 --nodes 32 --micro-batch 8 --global-batch 1024 samples/gpt.hpd)
#   L=48  h=8192:  436207616   + 48*(805306368 + 106496)  + 16384 = 39096041472
hpdl_shape_test(gpt.table1_39.1b
  "samples/gpt.hpd: ok: model GPT, 39.10B parameters (39096041472); dp=32 tp=8 pp=2 cp=1 on dgx-a100-80gb (512 devices)"
  -D layers=48 -D hidden=8192 -D heads=64 --tp 8 --pp 2 --nodes 64 --micro-batch 4 --global-batch 1536 samples/gpt.hpd)
#   L=60  h=10240: 545259520   + 60*(1258291200 + 133120) + 20480 = 76050739200
hpdl_shape_test(gpt.table1_76.1b
  "samples/gpt.hpd: ok: model GPT, 76.05B parameters (76050739200); dp=32 tp=8 pp=4 cp=1 on dgx-a100-80gb (1024 devices)"
  -D layers=60 -D hidden=10240 -D heads=80 --tp 8 --pp 4 --nodes 128
  --schedule interleaved --virtual-stages 3 --micro-batch 2 --global-batch 1792 samples/gpt.hpd)
#   L=80  h=12288: 654311424   + 80*(1811939328 + 159744) + 24576 = 145622261760
hpdl_shape_test(gpt.table1_145.6b
  "samples/gpt.hpd: ok: model GPT, 145.62B parameters (145622261760); dp=24 tp=8 pp=8 cp=1 on dgx-a100-80gb (1536 devices)"
  -D layers=80 -D hidden=12288 -D heads=96 --tp 8 --pp 8 --dp 24 --nodes 192
  --schedule interleaved --virtual-stages 2 --micro-batch 2 --global-batch 2304 samples/gpt.hpd)
#   L=96  h=16384: 872415232   + 96*(3221225472 + 212992) + 32768 = 310130540544
hpdl_shape_test(gpt.table1_310.1b
  "samples/gpt.hpd: ok: model GPT, 310.13B parameters (310130540544); dp=15 tp=8 pp=16 cp=1 on dgx-a100-80gb (1920 devices)"
  -D layers=96 -D hidden=16384 -D heads=128 --tp 8 --pp 16 --dp 15 --nodes 240
  --schedule interleaved --virtual-stages 2 --micro-batch 1 --global-batch 2160 samples/gpt.hpd)
#   L=105 h=20480: 1090519040  + 105*(5033164800 + 266240) + 40960 = 529600819200
hpdl_shape_test(gpt.table1_529.6b
  "samples/gpt.hpd: ok: model GPT, 529.60B parameters (529600819200); dp=9 tp=8 pp=35 cp=1 on dgx-a100-80gb (2520 devices)"
  -D layers=105 -D hidden=20480 -D heads=128 --tp 8 --pp 35 --dp 9 --nodes 315
  --schedule interleaved --virtual-stages 3 --micro-batch 1 --global-batch 2520 samples/gpt.hpd)
#   L=128 h=25600: 1363148800  + 128*(7864320000 + 332800) + 51200 = 1008038758400
hpdl_shape_test(gpt.table1_1008b
  "samples/gpt.hpd: ok: model GPT, 1008.04B parameters (1008038758400); dp=6 tp=8 pp=64 cp=1 on dgx-a100-80gb (3072 devices)"
  -D layers=128 -D hidden=25600 -D heads=160 --tp 8 --pp 64 --dp 6 --nodes 384
  --micro-batch 1 --global-batch 3072 samples/gpt.hpd)

# ---- The MLP classifier (samples/mlp.hpd) --------------------------------------
# features*hidden + hidden + hidden*classes + classes:
#   16*64 + 64 + 64*10 + 10 = 1738;  with hidden=256 classes=100: 4352 + 25700 = 30052
hpdl_shape_test(mlp.default
  "samples/mlp.hpd: ok: model Classifier, 1.7K parameters (1738); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  samples/mlp.hpd)
hpdl_shape_test(mlp.defines
  "samples/mlp.hpd: ok: model Classifier, 30.1K parameters (30052); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  -D hidden=256 -D classes=100 samples/mlp.hpd)
hpdl_shape_test(mlp.tp2
  "samples/mlp.hpd: ok: model Classifier, 1.7K parameters (1738); dp=1 tp=2 pp=1 cp=1 on cpu (2 devices)"
  --tp 2 --gpus-per-node 2 samples/mlp.hpd)

# ---- parse -> print -> parse of every sample and stdlib file ---------------------
file(GLOB_RECURSE HPDL_ROUNDTRIP_FILES CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/samples/*.hpd ${CMAKE_SOURCE_DIR}/stdlib/*.hpd)
foreach(src ${HPDL_ROUNDTRIP_FILES})
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${src})
  string(REGEX REPLACE "\\.hpd$" "" name ${rel})
  string(REPLACE "/" "." name ${name})
  add_test(NAME roundtrip.${name}
           COMMAND bash ${HPDL_TEST_DIR}/shapes/roundtrip.sh $<TARGET_FILE:hpdlc> ${src}
                   ${CMAKE_CURRENT_BINARY_DIR}/roundtrip/${name})
  set_tests_properties(roundtrip.${name} PROPERTIES TIMEOUT 60 LABELS roundtrip
                       ENVIRONMENT "HPDL_STDLIB=${HPDL_STDLIB_DIR}")
endforeach()

# ---- convolutional networks (issue 17): torchvision's parameter counts ----------
hpdl_shape_test(resnet18
  "samples/resnet18.hpd: ok: model ResNet18, 11.2M parameters (11181642); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  samples/resnet18.hpd)
hpdl_shape_test(resnet18.cifar_stem
  "samples/resnet18.hpd: ok: model ResNet18, 11.2M parameters (11173962); dp=1 tp=1 pp=1 cp=1 on cpu (1 device)"
  -D stem=cifar samples/resnet18.hpd)
hpdl_shape_test(resnet50
  "samples/resnet50.hpd: ok: model ResNet50, 25.6M parameters (25557032); dp=8 tp=1 pp=1 cp=1 on dgx-a100-80gb (8 devices)"
  samples/resnet50.hpd)
hpdl_shape_test(resnet18.sync_dp4
  "samples/resnet18.hpd: ok: model ResNet18, 11.2M parameters (11181642); dp=4 tp=1 pp=1 cp=1 on cpu (4 devices)"
  -D sync=true --dp 4 --micro-batch 32 samples/resnet18.hpd)
