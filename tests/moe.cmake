# moe.cmake - mixture of experts (issue 13): the router's builtins (topk_values,
# topk_indices, take, one_hot) through every phase on tests/moe/router-tiny.hpd
# (tests/moe/router_e2e.py), and std/moe's MoE layer on samples/moe-tiny.hpd over
# layouts (tests/moe/moe_e2e.py); each script says what its cases check.
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

foreach(case phases one_rank native dp2 tp2 pp2 dp2_tp2_zero3 tp2_cp2_sp cp2_native cp2_dropless_native cp2_ep2_dropless dp2_tp2_cp2_sp_ep2 dp2_ep2 dp4_ep2 dp2_tp2_ep2 dp2_pp2_ep2 dp4_ep2_zero1 dp4_ep2_zero2 dp4_ep2_zero3 resume_ep balance every2 dense2_pp bias_balance frontier_native frontier_cp drop aux grouped grouped_layouts folded folded_cp)
  if(Python3_Interpreter_FOUND)
    add_test(NAME moe.layer_${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/moe/moe_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/moe-layer/${case} ${case})
  else()
    add_test(NAME moe.layer_${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  # the sanitizer run keeps the cases whose paths the others do not take (the
  # expert-data-parallel reduction, ZeRO-1's two regions, resharding, the aux
  # metric); the rest repeat the same C code over other layouts
  set(labels "moe;compile")
  if(NOT case MATCHES "^(phases|native|dp4_ep2|dp4_ep2_zero2|resume_ep|balance|grouped)$")
    set(labels "moe;compile;sanitize_redundant")
  endif()
  set_tests_properties(moe.layer_${case} PROPERTIES LABELS "${labels}" TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
