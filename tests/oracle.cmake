# oracle.cmake - hpdl against Hugging Face `transformers` (issue 19): goldens that
# tools/hf_oracle.py wrote with transformers (tests/oracle/FAMILY.safetensors, .bin,
# .json) and tests/oracle/oracle_e2e.py, which needs neither transformers nor torch: one
# step from the goldens' weights (hpdlrun --init-from) gives their loss within 1e-5 and
# their gradients within 1e-4. CTest names oracle.CASE; the tp2 and ep2 cases skip without mpirun.

find_package(Python3 COMPONENTS Interpreter)
foreach(case llama llama_tp2 mixtral mixtral_ep2)
  if(Python3_Interpreter_FOUND)
    add_test(NAME oracle.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/oracle/oracle_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/oracle/${case} ${case})
  else()
    add_test(NAME oracle.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(oracle.${case} PROPERTIES LABELS "oracle;runtime" TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
