# reliability.cmake - every input a fuzzer broke a reader with, replayed in
# the ordinary build (fuzz/fuzz_replay.c runs it through the same harness as
# the fuzzer), so that the bug cannot come back unnoticed:
#
#   fuzz/regressions/<target>/<name>          the input
#   fuzz/regressions/<target>/<name>.expect   optional: text the readers'
#                                             messages must contain, one per line
#
# Test names: reliability.<target>.<name>; label `reliability`. Under the
# sanitizer build they also catch what the fix was about (an overflow, a read
# past the end) even where the Release build would not crash.

file(GLOB HPDL_FUZZ_REGRESSION_DIRS LIST_DIRECTORIES true CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/fuzz/regressions/*)
foreach(dir ${HPDL_FUZZ_REGRESSION_DIRS})
  if(NOT IS_DIRECTORY ${dir})
    continue()
  endif()
  get_filename_component(target ${dir} NAME)
  if(NOT TARGET replay_${target})
    message(FATAL_ERROR "hpdl: fuzz/regressions/${target}/ names no fuzz target (fuzz/fuzz_${target}.c)")
  endif()
  file(GLOB inputs CONFIGURE_DEPENDS ${dir}/*)
  foreach(input ${inputs})
    if(input MATCHES "[.]expect$")
      continue()
    endif()
    get_filename_component(name ${input} NAME)
    set(args)
    if(EXISTS ${input}.expect)
      file(STRINGS ${input}.expect lines)
      foreach(line ${lines})
        list(APPEND args --expect ${line})
      endforeach()
    endif()
    add_test(NAME reliability.${target}.${name} COMMAND replay_${target} ${args} ${input})
    set_tests_properties(reliability.${target}.${name} PROPERTIES LABELS reliability TIMEOUT 60)
  endforeach()
endforeach()

# Sizes no machine holds (a hidden size, vocabulary, sequence or layer count
# given with -D) and import chains deeper than the loader's limit: refused
# with the line that asks for them, within 30 s and 2 GiB.
add_test(NAME reliability.hostile_sizes
         COMMAND bash ${HPDL_TEST_DIR}/reliability/hostile_sizes.sh $<TARGET_FILE:hpdlc> ${CMAKE_SOURCE_DIR}/samples)
set_tests_properties(reliability.hostile_sizes PROPERTIES LABELS reliability TIMEOUT 300
                     ENVIRONMENT "HPDL_STDLIB=${HPDL_STDLIB_DIR}")
