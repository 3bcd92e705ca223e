# slow_tests.cmake - the label `slow`: the tests that took 15 s or more in the
# release build's ctest of a clean-clone CI run (2 jobs on 2 cores, the run of
# acd6f6a; most are the CUDA emulation's: C++ compiles of the kernels, and
# emulated threads), about 45% of that ctest's time in 31 tests (compile.fused_ce since split in two; three emulated bf16 layouts and GPT-OSS's added since). For a quick
# pass while working: ctest -LE slow -j2. CI runs them all. Included by
# tests/CMakeLists.txt after every other tests/*.cmake has added its tests.
set(HPDL_SLOW_TESTS
    cuda.attention.mutation cuda.attention.emu cuda.optim.mutation cuda.conv.mutation
    cuda.layout.emulate.memory cuda.layout.emulate.pp2_v2_zero3_resume cuda.layout.emulate.pp2_v2_resume
    cuda.layout.emulate.pp2_v2_bf16 cuda.layout.emulate.pp2_v2_zero1 cuda.layout.emulate.pp2_v2_zero3
    cuda.layout.emulate.pp2_v2 cuda.layout.emulate.moe_dp2_pp2_ep2 cuda.layout.emulate.moe_dp2_zero3_resume
    cuda.layout.emulate.moe_dp4_ep2_zero3_resume cuda.layout.emulate.moe_dp4_ep2_zero3_moments_bf16_resume
    cuda.layout.emulate.pp2_recompute_layers
    cuda.layout.emulate.dp2_tp2_pp2 cuda.layout.emulate.tp2_cp2_sp cuda.layout.emulate.zero2_pp2
    cuda.layout.emulate.pp2_gpipe cuda.layout.emulate.zero3_pp2 cuda.layout.emulate.pp2 cuda.layout.emulate.tp2_cp2
    cuda.layout.emulate.bf16_row_cache cuda.layout.emulate.bf16_llama_heads128 cuda.layout.emulate.bf16_qwen3
    cuda.layout.emulate.gpt_oss cuda.layout.emulate.gpt_oss_bf16
    cuda.nccl.emulate.dp2_pp2_v2 cuda.nccl.emulate.pp4 cuda.nccl.emulate.zero1_pp2
    compile.fused_ce compile.fused_ce_layouts compile.mixed_precision vision.resnet18_pp vision.profile plan.calibrate_gpt2 launch.slurm_e2e
    plan.memcheck)
foreach(name ${HPDL_SLOW_TESTS})
  if(TEST ${name})
    set_property(TEST ${name} APPEND PROPERTY LABELS slow)
  endif()
endforeach()
