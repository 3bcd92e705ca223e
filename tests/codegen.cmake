# codegen.cmake - the CPU back end (compiler/codegen/codegen_cpu*.c) against the
# reference executor: one CTest test per part of unit/test_codegen_cpu.c,
# named codegen.<part> (what each part checks is written at the top of that
# file). Without LLVM the back end is not built and every part exits 77,
# which CTest reports as skipped, with the reason in its output.
#
# Under HPDL_SANITIZE these run with LeakSanitizer on, like the rest: the back
# end disposes of every LLVM object it makes, and libLLVM's own process-lifetime
# state is still reachable at exit, so nothing is reported. Should a future LLVM
# report leaks of its own, set ENVIRONMENT ASAN_OPTIONS=detect_leaks=0 on these
# tests only (docs/backend.md).

set(HPDL_CODEGEN_PARTS ops comm vectorize kernels e2e compile)
foreach(part ${HPDL_CODEGEN_PARTS})
  add_test(NAME codegen.${part} COMMAND test_codegen_cpu ${part})
  set_tests_properties(codegen.${part} PROPERTIES TIMEOUT 600 LABELS codegen SKIP_RETURN_CODE 77)
endforeach()
# The parts above run the whole of test_codegen_cpu; the generic unit test
# of the same executable would run it all a second time.
set_tests_properties(unit.test_codegen_cpu PROPERTIES DISABLED TRUE)

# The bf16 GEMMs' widening path (core/numeric/gemm16.h) where oneDNN would
# run them: unit.test_gemm16 takes oneDNN when installed, this run never.
add_test(NAME unit.test_gemm16_widened COMMAND test_gemm16)
set_tests_properties(unit.test_gemm16_widened PROPERTIES ENVIRONMENT "HPDL_GEMM16=fp32;HPDL_GEMM16_EXPECT=fp32 sgemm: HPDL_GEMM16")
# oneDNN held to AVX2, as on a CPU without AVX512-BF16: its bf16 kernel there
# converts as it goes (8x slower than sgemm), so the widened path is taken
add_test(NAME unit.test_gemm16_no_bf16_isa COMMAND test_gemm16)
set_tests_properties(unit.test_gemm16_no_bf16_isa PROPERTIES ENVIRONMENT "DNNL_MAX_CPU_ISA=AVX2;HPDL_GEMM16_EXPECT=fp32 sgemm")
