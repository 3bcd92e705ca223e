# report.cmake - `hpdlc report` (compiler/driver/report.c) and the reader of
# hpdlrun's metrics files under it (compiler/driver/metrics.c), CTest names
# report.CASE, label report: tests/report/report_test.py says what each case
# checks. The metrics files are made by hpdlrun on gpt2-tiny; the reports
# are read back with python3's html.parser and xml.etree. report.screenshot
# skips (exit 77) without chromium; the golden malformed files are
# tests/report/errors/NAME.jsonl with their NAME.err.
find_package(Python3 COMPONENTS Interpreter)
foreach(case charts gaps downsample resume cap errors cli screenshot replay)
  if(Python3_Interpreter_FOUND)
    add_test(NAME report.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/report/report_test.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --replay $<TARGET_FILE:replay_metrics>
                     --work ${CMAKE_CURRENT_BINARY_DIR}/report/${case} ${case})
  else()
    add_test(NAME report.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(report.${case} PROPERTIES LABELS report TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
# a reader of outside bytes (docs/reliability.md): also label reliability
set_tests_properties(report.errors report.replay PROPERTIES LABELS "report;reliability")
# not in the sanitizer run (sanitize_redundant): the screenshot is chromium's
# time, and downsample's 100,000 records go through the reader and renderer
# the other cases and fuzz_metrics run under the sanitizers
set_tests_properties(report.screenshot report.downsample PROPERTIES LABELS "report;sanitize_redundant")
