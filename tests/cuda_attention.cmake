# cuda_attention.cmake - kernels/hpdl_attention.cuh, attention forward and backward
# (FlashAttention-2's schedule, fp32), CTest names cuda.attention.* (driver
# tests/cuda/attention_emu.py; the project is C only, so the C++ is compiled at test time,
# as tests/cuda_emu does):
#   cuda.attention.emu       tests/cuda/attention_emu.cpp through the emulation harness
#                            against an fp64 reference: awkward shapes, GQA, causal and
#                            context-parallel masks, every scheduling order bit for bit the
#                            same; the launch rule (hpdl_attention_cfg.h) from C11 too
#   cuda.attention.mutation  each barrier of the tile loops removed in turn, and two slips
#                            of the causal tile skip: each must fail
#   cuda.attention.sm_80     the rule's instantiations through NVRTC: no spill, no stack
#   cuda.attention.sm_90     frame, at most 48 KB of shared memory, registers printed
# The emulation cases skip (77) without a C++ compiler, the sm_XX ones without NVRTC.
find_package(Python3 COMPONENTS Interpreter)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _hpdl_attn_bt)
set(_hpdl_attn_cflags "${CMAKE_C_FLAGS} ${CMAKE_C_FLAGS_${_hpdl_attn_bt}}")
string(REPLACE ";" " " _hpdl_attn_warnings "${HPDL_WARNINGS}")
foreach(case emu mutation sm_80 sm_90)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cuda.attention.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/attention_emu.py --source ${CMAKE_SOURCE_DIR}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/cuda_attention/${case} --cc ${CMAKE_C_COMPILER}
                     "--cflags=${_hpdl_attn_cflags}" "--warnings=${_hpdl_attn_warnings}"
                     --cuda-home=${HPDL_CUDA_HOME} ${case})
  else()
    add_test(NAME cuda.attention.${case} COMMAND sh -c "echo 'skipped: python3 not found'; exit 77")
  endif()
  # under the sanitizers emu and sm_90: the mutants rerun the same emulated kernels (147 s
  # there), sm_80 differs from sm_90 in NVRTC's options only
  set(labels cuda)
  if(case STREQUAL "mutation" OR case STREQUAL "sm_80")
    list(APPEND labels sanitize_redundant)
  endif()
  set_tests_properties(cuda.attention.${case} PROPERTIES LABELS "${labels}" SKIP_RETURN_CODE 77 TIMEOUT 900)
endforeach()
