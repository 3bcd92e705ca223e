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

# The fusion of every graph of a training step passes fuse_check (no kernel
# reads a later kernel's value): a Mixtral and a gpt-oss at tiny sizes, whose
# block backward once fused the gates' renormalisation with the gate gradient
# into a cycle through the expert dispatch (the CPU back end then fell back to
# the reference executor). `hpdlc emit memory` prints "fuse check: ..." lines
# for any violation.
add_test(NAME fuse.check_moe_blocks
         COMMAND bash -c "out=$($<TARGET_FILE:hpdlc> emit memory ${CMAKE_SOURCE_DIR}/samples/mixtral.hpd -D layers=2 -D hidden=16 -D heads=4 -D kv_heads=2 -D ffn=8 -D experts=4 -D seq=8 -D vocab=64 --nodes 1 --gpus-per-node 1 --dp 1 --tp 1 --pp 1 --cluster laptop --global-batch 2 --micro-batch 2 --precision fp32 2>&1; $<TARGET_FILE:hpdlc> emit memory ${CMAKE_SOURCE_DIR}/samples/gpt-oss.hpd -D layers=4 -D hidden=16 -D heads=4 -D kv_heads=2 -D head_dim=4 -D experts=4 -D top_k=2 -D ffn=8 -D window=3 -D seq=8 -D vocab=256 --dp 1 --pp 1 --ep 1 --nodes 1 --gpus-per-node 1 --cluster laptop --global-batch 4 --micro-batch 2 --precision fp32 2>&1) || { echo \"$out\"; exit 1; }; if echo \"$out\" | grep 'fuse check'; then exit 1; fi; echo \"$out\" | grep -c 'graph' ")
set_tests_properties(fuse.check_moe_blocks PROPERTIES TIMEOUT 60 LABELS fuse ENVIRONMENT "HPDL_STDLIB=${HPDL_STDLIB_DIR}")
