# fuse.cmake - golden kernel groupings: `hpdlc emit fused` of each sample
# below is compared with tests/fuse/<sample>.fused by `diff -u` (one CTest
# test per sample, named fuse.<sample>). The fusion rules are in
# compiler/ir/fuse.c; the unit tests of single patterns are unit/test_fuse.c.
#
# To (re)generate the expected output after a deliberate change of the rules
# or of the cost constants (compiler/ir/ir_cost.c):
#   cmake --build build --target fuse-update
# then read every changed .fused (git diff) before committing it.

set(HPDL_FUSE_SAMPLES mlp gpt2-tiny)

set(HPDL_FUSE_UPDATE_COMMANDS)
foreach(name ${HPDL_FUSE_SAMPLES})
  add_test(NAME fuse.${name}
           COMMAND bash ${HPDL_TEST_DIR}/run_emit_golden.sh $<TARGET_FILE:hpdlc> fused
                   ${CMAKE_SOURCE_DIR}/samples/${name}.hpd ${HPDL_TEST_DIR}/fuse/${name}.fused
                   ${HPDL_STDLIB_DIR})
  set_tests_properties(fuse.${name} PROPERTIES TIMEOUT 60 LABELS fuse)
  list(APPEND HPDL_FUSE_UPDATE_COMMANDS
       COMMAND bash ${HPDL_TEST_DIR}/run_emit_golden.sh --update $<TARGET_FILE:hpdlc> fused
               ${CMAKE_SOURCE_DIR}/samples/${name}.hpd ${HPDL_TEST_DIR}/fuse/${name}.fused
               ${HPDL_STDLIB_DIR})
endforeach()
add_custom_target(fuse-update ${HPDL_FUSE_UPDATE_COMMANDS}
                  DEPENDS hpdlc
                  COMMENT "Rewriting tests/fuse/*.fused from the current hpdlc"
                  VERBATIM)
