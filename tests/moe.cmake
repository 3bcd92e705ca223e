# moe.cmake - mixture of experts (issue 13). So far the router's builtins
# (topk_values, topk_indices, take, one_hot) through every phase on
# tests/moe/router-tiny.hpd (tests/moe/router_e2e.py says what each case checks).
find_package(Python3 COMPONENTS Interpreter)
foreach(case phases one_rank tp2)
  if(Python3_Interpreter_FOUND)
    add_test(NAME moe.router_${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/moe/router_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/moe-e2e/${case} ${case})
  else()
    add_test(NAME moe.router_${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(moe.router_${case} PROPERTIES LABELS "moe;compile" TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
