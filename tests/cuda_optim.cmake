# cuda_optim.cmake - kernels/hpdl_optim.cuh, AdamW and SGD over every parameter in one
# multi-tensor launch, CTest names cuda.optim.* (driver tests/cuda/optim_emu.py; the
# project is C only, so the C++ is compiled at test time, as tests/cuda_emu does):
#   cuda.optim.adamw     tests/cuda/optim_emu.cpp through the emulation harness against
#   cuda.optim.sgd       runtime/optim.c (compiled here with this build's C compiler and
#                        flags): bit for bit, awkward sizes and alignments, 5 steps
#   cuda.optim.mutation  one deliberate slip at a time in the header: each must fail
#   cuda.optim.sm_80     the header through nvcc and NVRTC: no spills, registers, the
#   cuda.optim.sm_90     PTX free of fused or approximate float operations
# The emulation cases skip (77) without a C++ compiler, the sm_XX ones without nvcc.
find_package(Python3 COMPONENTS Interpreter)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _hpdl_optim_bt)
set(_hpdl_optim_cflags "${CMAKE_C_FLAGS} ${CMAKE_C_FLAGS_${_hpdl_optim_bt}}")
string(REPLACE ";" " " _hpdl_optim_warnings "${HPDL_WARNINGS}")
foreach(case adamw sgd mutation sm_80 sm_90)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cuda.optim.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/optim_emu.py --source ${CMAKE_SOURCE_DIR}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/cuda_optim/${case} --cc ${CMAKE_C_COMPILER}
                     "--cflags=${_hpdl_optim_cflags}" "--warnings=${_hpdl_optim_warnings}"
                     --cuda-home=${HPDL_CUDA_HOME} ${case})
  else()
    add_test(NAME cuda.optim.${case} COMMAND sh -c "echo 'skipped: python3 not found'; exit 77")
  endif()
  set_tests_properties(cuda.optim.${case} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 900)
endforeach()
