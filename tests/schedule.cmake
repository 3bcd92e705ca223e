# schedule.cmake - golden pipeline schedules: the per-rank instruction lists
# of core/schedule.c for small cases, printed by test_schedule's print
# mode (the text of sched_print) and compared with tests/schedule/NAME.txt
# using diff -u (tests/schedule/run_golden.sh). One CTest test per file,
# named schedule.NAME.
#
# Each expected file was checked by hand against the schedules' definitions
# (GPipe: Huang et al. 2019; 1F1B and interleaved 1F1B: Narayanan et al.
# 2021 Sec. 2.2 and Megatron-LM's forward_backward_pipelining_with_
# interleaving); tests/unit/test_schedule.c checks the same orders in code.
#
# To regenerate after a deliberate change of the format or the order:
#   cmake --build build --target schedule-update
# then read every changed .txt (git diff) before committing it.

# hpdl_schedule_golden(NAME KIND PP M V [--compute])
set(HPDL_SCHEDULE_UPDATE_COMMANDS)
function(hpdl_schedule_golden name)
  add_test(NAME schedule.${name}
           COMMAND bash ${HPDL_TEST_DIR}/schedule/run_golden.sh $<TARGET_FILE:test_schedule>
                   ${HPDL_TEST_DIR}/schedule/${name}.txt ${ARGN})
  set_tests_properties(schedule.${name} PROPERTIES TIMEOUT 60 LABELS schedule)
  set(HPDL_SCHEDULE_UPDATE_COMMANDS ${HPDL_SCHEDULE_UPDATE_COMMANDS}
      COMMAND bash ${HPDL_TEST_DIR}/schedule/run_golden.sh --update $<TARGET_FILE:test_schedule>
              ${HPDL_TEST_DIR}/schedule/${name}.txt ${ARGN}
      PARENT_SCOPE)
endfunction()

# pp=2, m=4, each kind
hpdl_schedule_golden(gpipe_pp2_m4 gpipe 2 4 1)
hpdl_schedule_golden(1f1b_pp2_m4 1f1b 2 4 1)
hpdl_schedule_golden(interleaved_pp2_m4_v2 interleaved 2 4 2)
# pp=4, m=8, v=2: the full lists and the compute order alone (the shape of
# Narayanan et al. 2021 Fig. 4, bottom)
hpdl_schedule_golden(interleaved_pp4_m8_v2 interleaved 4 8 2)
hpdl_schedule_golden(interleaved_pp4_m8_v2.compute interleaved 4 8 2 --compute)
# 1F1B at the same size, compute order (Fig. 4, top)
hpdl_schedule_golden(1f1b_pp4_m8.compute 1f1b 4 8 1 --compute)

if(TARGET test_schedule)
  add_custom_target(schedule-update ${HPDL_SCHEDULE_UPDATE_COMMANDS}
                    DEPENDS test_schedule
                    COMMENT "Rewriting tests/schedule/*.txt from the current schedules"
                    VERBATIM)
endif()
