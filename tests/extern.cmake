# extern.cmake - `extern` native ops end to end (docs/language.md, "Extern"),
# CTest names extern.*. The test library (extern/testops.c) is built into
# BUILD/tests/extern/ and the model extern/ext_lm.hpd copied beside it: the
# model names its library "./libhpdl_testops.so", found beside the file.
#
#   extern.interp    extern/test_extern.c: the gradient function against finite
#                    differences, the losses and gradients against the same model
#                    with builtins, an extern without a gradient, executor errors
#   extern.CASE      extern/extern_e2e.py (it says what each case checks):
#                    hpdlc compile + hpdlrun against the builtin model, one rank and
#                    tp=2; compile errors against golden text; a moved artifact
#   cuda.run.<device>.extern, .extern_tp2  the same model compiled --target cuda: the
#                    host program calls the native functions between launches on host
#                    copies of their buffers (kind "host" launches, devexec.c's run_host),
#                    5 steps against the CPU artifact (tests/cuda/run_device.py); emulated
#                    in CI, on the GPU where there is one
set(HPDL_EXTERN_DIR ${CMAKE_CURRENT_BINARY_DIR}/extern)
add_library(hpdl_testops SHARED extern/testops.c)
target_link_libraries(hpdl_testops PRIVATE m)
set_target_properties(hpdl_testops PROPERTIES OUTPUT_NAME hpdl_testops LIBRARY_OUTPUT_DIRECTORY ${HPDL_EXTERN_DIR})
configure_file(extern/ext_lm.hpd ${HPDL_EXTERN_DIR}/ext_lm.hpd COPYONLY)

add_executable(test_extern extern/test_extern.c)
target_compile_options(test_extern PRIVATE ${HPDL_WARNINGS})
target_include_directories(test_extern PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
target_link_libraries(test_extern PRIVATE hpdlcomp)
target_compile_definitions(test_extern PRIVATE HPDL_EXTERN_DIR="${HPDL_EXTERN_DIR}")
add_dependencies(test_extern hpdl_testops)
add_test(NAME extern.interp COMMAND test_extern)
set_tests_properties(extern.interp PROPERTIES LABELS extern TIMEOUT 120)

set(HPDL_EXTERN_E2E ${HPDL_TEST_DIR}/extern/extern_e2e.py --bin ${CMAKE_BINARY_DIR}/bin --dir ${HPDL_EXTERN_DIR}
    --source ${CMAKE_SOURCE_DIR})
find_package(Python3 COMPONENTS Interpreter)
foreach(case one_rank tp2 moved errors)
  if(Python3_Interpreter_FOUND)
    add_test(NAME extern.${case} COMMAND ${Python3_EXECUTABLE} ${HPDL_EXTERN_E2E}
             --work ${CMAKE_CURRENT_BINARY_DIR}/extern-e2e/${case} ${case})
  else()
    add_test(NAME extern.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  # Open MPI's own allocations are suppressed under the sanitizers (tests/CMakeLists.txt)
  set_tests_properties(extern.${case} PROPERTIES LABELS extern TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT
                       "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
# Rewrites tests/extern/errors/*.err from the current hpdlc (read the diff before committing).
if(Python3_Interpreter_FOUND)
  add_custom_target(extern-golden-update
                    COMMAND ${Python3_EXECUTABLE} ${HPDL_EXTERN_E2E} --work ${CMAKE_CURRENT_BINARY_DIR}/extern-e2e/update --update errors
                    DEPENDS hpdlc hpdl_testops VERBATIM)
endif()
# native code by consent and the artifact's files checked (docs/reliability.md): also label reliability
if(Python3_Interpreter_FOUND)
  set_tests_properties(extern.errors extern.moved PROPERTIES LABELS "extern;reliability")
endif()

if(Python3_Interpreter_FOUND)
  foreach(dev emulate cuda)
    foreach(entry "extern|" "extern_tp2|--tp 2")
      hpdl_name_flags("${entry}" name layout)
      add_test(NAME cuda.run.${dev}.${name}
               COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/cuda/run_device.py --hpdlc $<TARGET_FILE:hpdlc>
                       --hpdlrun $<TARGET_FILE:hpdlrun> --hpdl-data $<TARGET_FILE:hpdl-data>
                       --sample ${HPDL_EXTERN_DIR}/ext_lm.hpd --device ${dev} --steps 5 --first-tol 1e-6 --tol 1e-5
                       "--args=--allow-native ${layout}" "--run-args=--allow-native")
      set_tests_properties(cuda.run.${dev}.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "cuda;extern"
                           ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
    endforeach()
  endforeach()
endif()
