# runtime.cmake - the runtime (runtime/, libhpdlrt): its unit tests
# (tests/unit/test_rt_*.c, linked here with hpdlrt), collectives under
# mpirun (tests/runtime/mpi_collectives.c), and end-to-end runs of hpdlrun
# and hpdl-data driven by tests/runtime/e2e.py (one CTest test per case,
# named runtime.CASE). Tests that need mpirun skip (exit 77) without it.

file(GLOB HPDL_RT_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_rt_*.c)
foreach(src ${HPDL_RT_UNIT_TESTS})
  get_filename_component(name ${src} NAME_WE)
  target_link_libraries(${name} PRIVATE hpdlrt)
  set_tests_properties(unit.${name} PROPERTIES LABELS runtime TIMEOUT 120)
endforeach()

# The MPI collectives, on layouts that exercise every group. (find_package
# again: runtime/'s result is not visible in this folder.)
find_package(MPI COMPONENTS C QUIET)
if(TARGET hpdlrt AND MPI_C_FOUND)
  add_executable(hpdl_mpi_collectives runtime/mpi_collectives.c)
  target_compile_options(hpdl_mpi_collectives PRIVATE ${HPDL_WARNINGS})
  target_link_libraries(hpdl_mpi_collectives PRIVATE hpdlrt)
endif()
find_program(HPDL_MPIRUN mpirun)
# Open MPI's own allocations suppressed under the sanitizers (tests/CMakeLists.txt)
set(HPDL_RT_TEST_ENV ${HPDL_SANITIZED_MPI_ENV})
foreach(layout "2 2 2 1" "1 2 2 2" "3 1 2 1" "4 1 1 1" "4 1 1 1 2" "2 2 1 1 2")
  string(REPLACE " " ";" dims "${layout}")
  string(REPLACE " " "x" tag "${layout}")
  set(np 1)
  list(SUBLIST dims 0 4 world) # dp tp pp cp; a fifth, ep, splits dp
  foreach(d ${world})
    math(EXPR np "${np} * ${d}")
  endforeach()
  set(name runtime.mpi_collectives.${tag})
  if(TARGET hpdl_mpi_collectives AND HPDL_MPIRUN)
    add_test(NAME ${name}
             COMMAND bash -c "if [ \"$(id -u)\" = 0 ]; then root=--allow-run-as-root; fi; exec \"$0\" --oversubscribe $root --mca orte_tmpdir_base \"$2\" -np ${np} \"$1\" ${layout}"
                     ${HPDL_MPIRUN} $<TARGET_FILE:hpdl_mpi_collectives> ${CMAKE_CURRENT_BINARY_DIR}/ompi/${name})
  else()
    add_test(NAME ${name} COMMAND bash -c "echo 'skipped: no MPI (scripts/setup.sh installs Open MPI)'; exit 77")
  endif()
  set_tests_properties(${name} PROPERTIES LABELS runtime TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_RT_TEST_ENV}")
endforeach()

# A program loaded with dlopen, as compiled ones are.
add_library(hpdl_test_unigram MODULE runtime/plugin_unigram.c)
target_compile_options(hpdl_test_unigram PRIVATE ${HPDL_WARNINGS})
target_include_directories(hpdl_test_unigram PRIVATE ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/core)
target_link_libraries(hpdl_test_unigram PRIVATE PkgConfig::JANSSON m)
set_target_properties(hpdl_test_unigram PROPERTIES PREFIX "" OUTPUT_NAME unigram)

# End to end: hpdlrun and hpdl-data (tests/runtime/e2e.py; each case says
# what it checks).
find_package(Python3 COMPONENTS Interpreter)
foreach(case data_tool one_rank progress bad_artifact dp2 under_mpirun tp2 dp2_tp2 resume_same_layout
             resume_other_layout init_from compression checkpoint_options native_program bad_data bad_checkpoint
             killed_writer failed_write threads preempt_one_rank preempt_dp2 preempt_dp2_tp2 diverged failed_write_async unwritable_checkpoint too_big rank_dies
             mpirun_fails loss_scale loss_scale_dp2_tp2 loss_scale_static)
  if(Python3_Interpreter_FOUND)
    add_test(NAME runtime.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/runtime/e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --plugin $<TARGET_FILE:hpdl_test_unigram> --work ${CMAKE_CURRENT_BINARY_DIR}/runtime-e2e/${case} ${case})
  else()
    add_test(NAME runtime.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(runtime.${case} PROPERTIES LABELS runtime TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_RT_TEST_ENV}")
endforeach()

# hpdlrun --profile end to end (tests/runtime/profile_e2e.py says what each
# case checks): dp=2 x pp=2 under mpirun, one rank with the event cap, the
# device path emulated, and an unwritable trace path refused at start.
foreach(case dp2_pp2 one_rank device_emulate unwritable)
  if(Python3_Interpreter_FOUND)
    add_test(NAME runtime.profile_${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/runtime/profile_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/profile-e2e/${case} ${case})
  else()
    add_test(NAME runtime.profile_${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(runtime.profile_${case} PROPERTIES LABELS runtime TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_RT_TEST_ENV}")
endforeach()

# The faults of issue 15 end to end (docs/reliability.md): also label reliability
set(HPDL_RT_FAULT_CASES bad_artifact bad_data bad_checkpoint killed_writer failed_write failed_write_async
    unwritable_checkpoint too_big diverged preempt_one_rank preempt_dp2 preempt_dp2_tp2 rank_dies
    mpirun_fails loss_scale loss_scale_dp2_tp2 loss_scale_static)
# hpdlrun, its data loader, optimizer and checkpoints under valgrind's memcheck
# (tests/memcheck.sh runtime): no read of memory never written; the release
# build only (valgrind cannot run a sanitized binary), skipped without valgrind
if(NOT HPDL_SANITIZE)
  add_test(NAME runtime.memcheck
           COMMAND bash ${HPDL_TEST_DIR}/memcheck.sh runtime ${CMAKE_BINARY_DIR}/bin ${CMAKE_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/runtime-memcheck)
  set_tests_properties(runtime.memcheck PROPERTIES LABELS runtime TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_RT_TEST_ENV}")
endif()

foreach(case ${HPDL_RT_FAULT_CASES})
  set_tests_properties(runtime.${case} PROPERTIES LABELS "runtime;reliability")
endforeach()

# The per-step optimizer passes on 1 .. N threads (bench/optim_bench.c): a
# benchmark, built only on request.
add_executable(optim_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/bench/optim_bench.c)
target_compile_options(optim_bench PRIVATE ${HPDL_WARNINGS})
target_link_libraries(optim_bench PRIVATE hpdlrt)
# not in the sanitizer run: the emulated kernels are the same C++ under either
# build (as cuda_layouts), and the profile's code runs in the other profile cases
if(TEST runtime.profile_device_emulate)
  set_tests_properties(runtime.profile_device_emulate PROPERTIES LABELS "runtime;sanitize_redundant")
endif()
