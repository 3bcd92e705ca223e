# oracle.cmake - hpdl against Hugging Face `transformers` (issue 19): goldens that
# tools/hf_oracle.py wrote with transformers (tests/oracle/FAMILY.safetensors, .bin,
# .json) and tests/oracle/oracle_e2e.py, which needs neither transformers nor torch: one
# step from the goldens' weights (hpdlrun --init-from) gives their loss within 1e-5 and
# their gradients within 1e-4. CTest names oracle.CASE (FAMILY at one rank, FAMILY_tp2 and
# FAMILY_ep2 over two ranks, skipped without mpirun); the sanitized build keeps four that
# between them run every op and layout kind the others do (the rest label
# sanitize_redundant: 20 s each under the sanitizers).

find_package(Python3 COMPONENTS Interpreter)
set(HPDL_ORACLE_CASES llama llama_tp2 mixtral mixtral_ep2 qwen3 qwen3_tp2 qwen3_moe qwen3_moe_tp2 qwen3_moe_ep2
    gpt_oss gpt_oss_tp2 gpt_oss_ep2 gpt_oss_keep deepseek_v3 deepseek_v3_tp2 deepseek_v3_ep2 deepseek_v3_groups
    deepseek_v3_groups_ep2)
set(HPDL_ORACLE_REDUNDANT llama_tp2 mixtral qwen3 qwen3_tp2 qwen3_moe qwen3_moe_tp2 qwen3_moe_ep2 gpt_oss_tp2 gpt_oss_ep2 gpt_oss_keep
    deepseek_v3 deepseek_v3_tp2 deepseek_v3_groups)
foreach(case ${HPDL_ORACLE_CASES})
  if(Python3_Interpreter_FOUND)
    add_test(NAME oracle.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/oracle/oracle_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/oracle/${case} ${case})
  else()
    add_test(NAME oracle.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set(labels oracle runtime)
  if(case IN_LIST HPDL_ORACLE_REDUNDANT)
    list(APPEND labels sanitize_redundant)
  endif()
  set_tests_properties(oracle.${case} PROPERTIES LABELS "${labels}" TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
