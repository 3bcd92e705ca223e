# memplan.cmake - golden memory plans: `hpdlc emit memory [flags] SAMPLE`
# compared with tests/memplan/NAME.memory by `diff -u` (one CTest test per
# case, named memplan.NAME). The plan's rules are in compiler/plan/memplan.h;
# unit/test_memplan.c checks the plan's peak against the reference
# executor's measured one.
#
# To (re)generate the expected output after a deliberate change:
#   cmake --build build --target memplan-update
# then read every changed .memory (git diff) before committing it.

# hpdl_memplan_golden(NAME SAMPLE [FLAGS...])
set(HPDL_MEMPLAN_UPDATE_COMMANDS)
function(hpdl_memplan_golden name sample)
  add_test(NAME memplan.${name}
           COMMAND bash ${HPDL_TEST_DIR}/run_emit_golden.sh $<TARGET_FILE:hpdlc> memory
                   ${CMAKE_SOURCE_DIR}/samples/${sample}.hpd ${HPDL_TEST_DIR}/memplan/${name}.memory
                   ${HPDL_STDLIB_DIR} ${ARGN})
  set_tests_properties(memplan.${name} PROPERTIES TIMEOUT 60 LABELS memplan)
  set(HPDL_MEMPLAN_UPDATE_COMMANDS ${HPDL_MEMPLAN_UPDATE_COMMANDS}
      COMMAND bash ${HPDL_TEST_DIR}/run_emit_golden.sh --update $<TARGET_FILE:hpdlc> memory
              ${CMAKE_SOURCE_DIR}/samples/${sample}.hpd ${HPDL_TEST_DIR}/memplan/${name}.memory
              ${HPDL_STDLIB_DIR} ${ARGN}
      PARENT_SCOPE)
endfunction()

hpdl_memplan_golden(mlp mlp)
# a repeated block: SAVE / BACKWARD stashes and call workspaces
hpdl_memplan_golden(gpt2-tiny gpt2-tiny)
# full recomputation on pipeline chunk 0 of 2 (stash = block inputs only)
hpdl_memplan_golden(gpt2-tiny.pp2-full gpt2-tiny --pp 2 --recompute full)

add_custom_target(memplan-update ${HPDL_MEMPLAN_UPDATE_COMMANDS}
                  DEPENDS hpdlc
                  COMMENT "Rewriting tests/memplan/*.memory from the current hpdlc"
                  VERBATIM)
