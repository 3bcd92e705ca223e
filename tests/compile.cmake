# compile.cmake - `hpdlc compile` and the CPU program it puts into artifacts
# (compiler/driver/compile.c, runtime/program_exec.c), CTest names compile.*:
#
#   compile.artifact, compile.chunk_file   the manifest, the chunks' parameter
#       uses, the chunk file's round trip and damaged files
#       (compile/test_program_ir.c says what each checks)
#   compile.CASE   end to end through hpdlc compile and hpdlrun
#       (compile/compile_e2e.py says what each case checks), against
#       hpdl_compile_ref, the unpartitioned model trained by the reference
#       executor (compile/ref_train.c)
# Cases that need mpirun skip (exit 77) without it; compile.native skips
# without the CPU back end (no LLVM at configure time).

add_executable(test_compile_artifact compile/test_program_ir.c)
target_compile_options(test_compile_artifact PRIVATE ${HPDL_WARNINGS})
target_include_directories(test_compile_artifact PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_SOURCE_DIR}/runtime)
target_link_libraries(test_compile_artifact PRIVATE hpdlcomp)
target_compile_definitions(test_compile_artifact PRIVATE HPDL_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                           HPDL_PROGRAM_LIB="$<TARGET_FILE:hpdl_program>")
add_dependencies(test_compile_artifact hpdl_program)
foreach(part artifact chunk_file)
  add_test(NAME compile.${part} COMMAND test_compile_artifact ${part})
  set_tests_properties(compile.${part} PROPERTIES LABELS compile TIMEOUT 120)
endforeach()

add_executable(hpdl_compile_ref compile/ref_train.c)
target_compile_options(hpdl_compile_ref PRIVATE ${HPDL_WARNINGS})
target_link_libraries(hpdl_compile_ref PRIVATE hpdlcomp hpdlrt)

# Open MPI's own allocations suppressed under the sanitizers (tests/CMakeLists.txt)
set(HPDL_COMPILE_TEST_ENV ${HPDL_SANITIZED_MPI_ENV})
find_package(Python3 COMPONENTS Interpreter)
foreach(case cli one_rank dp2 tp2 pp2 pp2_uneven pp2_gpipe pp2_virtual2 pp2_virtual2_native pp2_ends dp2_tp2_pp2 tp2_cp2 cp_ring zero1 zero2 zero3
             zero2_dp2_tp2_pp2 resume_zero resume_same_layout resume_other_layout missing_file self_contained native anomaly
             qwen3_window vocab_pad mixed_precision native_threads fused_ce fused_ce_layouts recompute_ops recompute_act recompute_layers
             moments_bf16 fusion_off mla_sp gptoss_cp4)
  if(Python3_Interpreter_FOUND)
    add_test(NAME compile.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/compile/compile_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --ref $<TARGET_FILE:hpdl_compile_ref> --source ${CMAKE_SOURCE_DIR}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/compile-e2e/${case} ${case})
  else()
    add_test(NAME compile.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(compile.${case} PROPERTIES LABELS compile TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_COMPILE_TEST_ENV}")
endforeach()
# four layers over two virtual stages, fused_ce's eleven layouts (54 s in release, 233 s
# sanitized beside other work) and mixed_precision (152 s sanitized alone; past 300 s on a
# clean clone's CI while other jobs shared its two cores), and cp_ring's six programs since its
# cp 4 cases (47 s in release, past 300 s sanitized on 2026-12-06's clean clone): the slowest
# cases under the sanitizers
set_tests_properties(compile.pp2_virtual2 compile.pp2_virtual2_native compile.fused_ce compile.fused_ce_layouts compile.mixed_precision
                     compile.cp_ring PROPERTIES TIMEOUT 600)
# the fused head's other layouts: under the sanitizers the runtime's dp / pp / cp / ZeRO-3 paths run
# in those layouts' own cases, and the fused head's code (its tensor shards too) in compile.fused_ce
set_property(TEST compile.fused_ce_layouts APPEND PROPERTY LABELS sanitize_redundant)
# Cases whose code paths others cover, left out of the sanitizer run (label
# sanitize_redundant, scripts/test.sh) to keep the suite in its 15 minutes:
# the native program of virtual stages (compile.native and pp2_virtual2 cover
# its parts), zero 1 (zero 2 and 3 shard more), an uneven pipeline split.
# under the sanitizers, the layouts that others contain (dp2 and tp2 in dp2_tp2_pp2, zero2 in
# zero2_dp2_tp2_pp2, a resume at the same layout in resume_other_layout's paths)
set_tests_properties(compile.pp2_virtual2_native compile.zero1 compile.pp2_uneven compile.dp2 compile.tp2 compile.zero2
                     compile.resume_same_layout PROPERTIES LABELS "compile;sanitize_redundant")
# faults (docs/reliability.md): also label reliability
set_tests_properties(compile.missing_file compile.anomaly PROPERTIES LABELS "compile;reliability")

# 16 random layouts (model, layers, precision, dp x tp x pp x cp, ZeRO, recomputation, sp, cp_comm,
# schedule, fused head, fusion, experts, executor) from a fixed seed, each trained 4 steps against
# the one-rank program, and 4 runs stopped at step 2 and resumed at another random layout
# (tests/compile/layout_sweep.py; about 40 s in release). The sanitized run
# leaves it out: its parts run there in the layout cases above.
if(Python3_Interpreter_FOUND)
  add_test(NAME compile.layout_sweep
           COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/compile/layout_sweep.py --bin ${CMAKE_BINARY_DIR}/bin
                   --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/compile-e2e/layout_sweep)
  set_tests_properties(compile.layout_sweep PROPERTIES LABELS "compile;slow;sanitize_redundant" TIMEOUT 600
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${HPDL_COMPILE_TEST_ENV}")
endif()

# hpdlc's progress line: phases in order (plain), nothing off a terminal,
# redrawn and cleared on a pseudo-terminal (tests/compile/progress_test.py)
if(Python3_Interpreter_FOUND)
  add_test(NAME compile.progress
           COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/compile/progress_test.py $<TARGET_FILE:hpdlc>
                   ${CMAKE_SOURCE_DIR}/samples ${CMAKE_CURRENT_BINARY_DIR}/compile-progress)
  set_tests_properties(compile.progress PROPERTIES LABELS compile TIMEOUT 300
                       ENVIRONMENT "HPDL_STDLIB=${HPDL_STDLIB_DIR};HPDL_PROGRAM_LIB=$<TARGET_FILE:hpdl_program>")
endif()
