# golden.cmake - golden diagnostics: every tests/errors/*.hpd is checked with
# `hpdlc check` and its stderr compared with the .err beside it (one CTest test
# per file, named golden.<basename>). Files in subfolders (tests/errors/modules/)
# are helpers that the tests import, not tests themselves.
#
# To (re)generate expected output after a deliberate change of a message:
#   cmake --build build --target golden-update
# then read every changed .err (git diff) before committing it.

file(GLOB HPDL_GOLDEN_ERRORS CONFIGURE_DEPENDS ${HPDL_TEST_DIR}/errors/*.hpd)
foreach(src ${HPDL_GOLDEN_ERRORS})
  get_filename_component(base ${src} NAME_WLE)
  add_test(NAME golden.${base}
           COMMAND bash ${HPDL_TEST_DIR}/run_golden.sh $<TARGET_FILE:hpdlc> ${src}
                   ${HPDL_STDLIB_DIR})
  set_tests_properties(golden.${base} PROPERTIES TIMEOUT 60 LABELS golden)
endforeach()

set(HPDL_GOLDEN_UPDATE_COMMANDS)
foreach(src ${HPDL_GOLDEN_ERRORS})
  list(APPEND HPDL_GOLDEN_UPDATE_COMMANDS
       COMMAND bash ${HPDL_TEST_DIR}/run_golden.sh --update $<TARGET_FILE:hpdlc> ${src}
               ${HPDL_STDLIB_DIR})
endforeach()
add_custom_target(golden-update ${HPDL_GOLDEN_UPDATE_COMMANDS}
                  DEPENDS hpdlc
                  COMMENT "Rewriting tests/errors/*.err from the current hpdlc"
                  VERBATIM)
