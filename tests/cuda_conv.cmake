# cuda_conv.cmake - kernels/hpdl_conv.cuh, 2-D convolution and pooling forward and backward
# (implicit GEMMs, fp32), CTest names cuda.conv.* (driver tests/cuda/conv_emu.py; the
# project is C only, so the C++ is compiled at test time, as tests/cuda_emu does):
#   cuda.conv.emu        tests/cuda/conv_emu.cpp through the emulation harness against
#                        core/numeric/conv.c's fp64 loops: strides, padding, dilation, groups,
#                        depthwise, 1x1, odd sizes, every tile tier, split filter
#                        gradients, every pooling mode with ties; every scheduling order
#                        bit for bit the same; the launch rule (hpdl_conv_plan) from C11 too
#   cuda.conv.mutation   sixteen deliberate slips of the header (barriers, padding, group
#                        offsets, stride, dilation, splits, first max, avg count,
#                        adaptive windows): each must fail
#   cuda.conv.sm_80      every kernel through NVRTC: no spill, no stack frame, at most
#   cuda.conv.sm_90      48 KB of shared memory, registers printed
# The emulation cases skip (77) without a C++ compiler, the sm_XX ones without NVRTC.
find_package(Python3 COMPONENTS Interpreter)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _hpdl_conv_bt)
set(_hpdl_conv_cflags "${CMAKE_C_FLAGS} ${CMAKE_C_FLAGS_${_hpdl_conv_bt}}")
string(REPLACE ";" " " _hpdl_conv_warnings "${HPDL_WARNINGS}")
foreach(case emu mutation sm_80 sm_90)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cuda.conv.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/conv_emu.py --source ${CMAKE_SOURCE_DIR}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/cuda_conv/${case} --cc ${CMAKE_C_COMPILER}
                     "--cflags=${_hpdl_conv_cflags}" "--warnings=${_hpdl_conv_warnings}"
                     --cuda-home=${HPDL_CUDA_HOME} ${case})
  else()
    add_test(NAME cuda.conv.${case} COMMAND sh -c "echo 'skipped: python3 not found'; exit 77")
  endif()
  set_tests_properties(cuda.conv.${case} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 900)
  if(case STREQUAL "mutation")
    # the mutants are the same kernel C++ under either build (cuda.conv.emu still runs sanitized)
    set_tests_properties(cuda.conv.${case} PROPERTIES LABELS "cuda;sanitize_redundant")
  endif()
endforeach()

# A convolutional network's training step through the CUDA back end (tests/cuda/conv-tiny.hpd:
# every op of issue 17 with its gradient), against the reference executor (1e-5):
#   cuda.emu.conv-tiny               every fused kernel alone (test_codegen_cuda), 8x8 images
#   cuda.emu.step.conv-tiny          the whole step through the emulated kernels
#   cuda.dev.emulate.step.conv-tiny  the step through the device layer's host program
#   cuda.gpu.step.conv-tiny          the same on a GPU (skips without one)
#   cuda.nvrtc.conv-tiny.one.sm_XX   hpdlc compile --target cuda: cubins, no spills
#   cuda.run.{emulate,cuda}.conv-tiny  hpdlrun on synthetic images against the CPU
#                                    artifact, 5 steps within 1e-5 (tests/cuda/run_conv.py;
#                                    skips where hpdl-data makes no images)
set(HPDL_CONV_TINY ../tests/cuda/conv-tiny.hpd) # the step tests load samples/NAME
add_test(NAME cuda.emu.conv-tiny COMMAND test_codegen_cuda ${HPDL_CONV_TINY} -D size=8)
add_test(NAME cuda.emu.step.conv-tiny COMMAND test_codegen_cuda --step ${HPDL_CONV_TINY})
add_test(NAME cuda.dev.emulate.step.conv-tiny COMMAND test_device --device emulate --step ${HPDL_CONV_TINY})
add_test(NAME cuda.gpu.step.conv-tiny COMMAND test_device --device cuda --step ${HPDL_CONV_TINY})
set_tests_properties(cuda.emu.conv-tiny cuda.emu.step.conv-tiny cuda.dev.emulate.step.conv-tiny cuda.gpu.step.conv-tiny
                     PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS cuda)
if(Python3_Interpreter_FOUND)
  foreach(arch sm_80 sm_90)
    add_test(NAME cuda.nvrtc.conv-tiny.one.${arch}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/nvrtc_samples.py --hpdlc $<TARGET_FILE:hpdlc>
                     --sample ${HPDL_TEST_DIR}/cuda/conv-tiny.hpd --arch ${arch})
    set_tests_properties(cuda.nvrtc.conv-tiny.one.${arch} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda)
  endforeach()
  foreach(dev emulate cuda)
    add_test(NAME cuda.run.${dev}.conv-tiny
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/run_conv.py --hpdlc $<TARGET_FILE:hpdlc>
                     --hpdlrun $<TARGET_FILE:hpdlrun> --hpdl-data $<TARGET_FILE:hpdl-data>
                     --sample ${HPDL_TEST_DIR}/cuda/conv-tiny.hpd --device ${dev} --steps 5)
    # an emulated device run: the same kernel C++ under either build, 105 s under the
    # sanitizers, so the sanitizer step leaves it out with the other device layouts
    set_tests_properties(cuda.run.${dev}.conv-tiny PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "cuda;cuda_layouts"
                         ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
    # ZeRO 3 at dp 2 with batch norm: the running statistics kept apart and
    # whole on the device (the forwards update them micro-batch after
    # micro-batch), member 0's sent to the others after the step, each
    # member's part into the loop's slice for checkpoints; the validation
    # loss reads them
    add_test(NAME cuda.run.${dev}.conv-tiny_zero3
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/run_conv.py --hpdlc $<TARGET_FILE:hpdlc>
                     --hpdlrun $<TARGET_FILE:hpdlrun> --hpdl-data $<TARGET_FILE:hpdl-data>
                     --sample ${HPDL_TEST_DIR}/cuda/conv-tiny.hpd --device ${dev} --steps 5 --args "--dp 2 --zero 3"
                     --expect "state stays on the device")
    set_tests_properties(cuda.run.${dev}.conv-tiny_zero3 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "cuda;cuda_layouts"
                         ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
  endforeach()
endif()
