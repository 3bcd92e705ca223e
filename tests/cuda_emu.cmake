# cuda_emu.cmake - CUDA C kernels run on the CPU through kernels/cuda_emu.h (the
# harness: kernels/README.md), CTest names cuda_emu.*. The project is C only: the
# driver tests/cuda_emu/run_emu.py compiles each tests/cuda_emu/CASE.cu with its host
# program CASE_test.cpp at test time, with the system C++ compiler ($HPDL_CXX, $CXX,
# c++), as hpdlc will compile generated kernels, and runs it under every scheduling
# order (HPDL_EMU_ORDER forward, reverse, random). Skipped (77) without a C++ compiler.
#
#   cuda_emu.elementwise   float4 loads, lengths no multiple of 4 or of the block
#   cuda_emu.softmax       row softmax (shuffles + shared memory), rows of 1 to 4097
#   cuda_emu.layernorm     LayerNorm forward, dynamic shared memory
#   cuda_emu.bf16          bf16 / fp16 storage with fp32 accumulation, conversions
#   cuda_emu.warp          shuffles, votes, reductions, block votes, atomics
#   cuda_emu.divergent     divergent barriers and bad launches are errors, not hangs
#   cuda_emu.mutation      softmax.cu less any one __syncthreads() fails some order
#   cuda_emu.cuda_compile  the same .cu files through nvcc and NVRTC for sm_80
#                          (skipped without a CUDA toolkit)
find_package(Python3 COMPONENTS Interpreter)
foreach(case elementwise softmax layernorm bf16 warp divergent mutation cuda_compile)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cuda_emu.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda_emu/run_emu.py --source ${CMAKE_SOURCE_DIR}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/${case} --cuda-home=${HPDL_CUDA_HOME} ${case})
  else()
    add_test(NAME cuda_emu.${case} COMMAND sh -c "echo 'skipped: python3 not found'; exit 77")
  endif()
  set_tests_properties(cuda_emu.${case} PROPERTIES LABELS cuda_emu TIMEOUT 600 SKIP_RETURN_CODE 77)
endforeach()
