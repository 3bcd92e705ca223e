# vision.cmake - image classification data (issue 17): image files, the
# loader over them and hpdl-data --synthetic-images (runtime/data.c), the
# image feeds of hpdlc compile and the CPU and CUDA programs. CTest names
# vision.*:
#
#   vision.loader   tests/vision/test_images.c: the header's errors, the
#       shape rule, the data-parallel split, prefetch and resuming, the
#       synthetic images
#   vision.CASE     end to end through hpdl-data, hpdlc compile and hpdlrun
#       (tests/vision/vision_e2e.py says what each case checks), on
#       tests/vision/mlp-images.hpd; vision.profile: hpdlrun --profile of
#       samples/resnet18.hpd leads with its convolutions
# Cases that need mpirun skip (exit 77) without it; vision.emulate skips
# without the CUDA back end's emulation.

add_executable(test_vision_images vision/test_images.c)
target_compile_options(test_vision_images PRIVATE ${HPDL_WARNINGS})
target_include_directories(test_vision_images PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
target_link_libraries(test_vision_images PRIVATE hpdlrt)
add_test(NAME vision.loader COMMAND test_vision_images)
set_tests_properties(vision.loader PROPERTIES LABELS "vision;runtime" TIMEOUT 120)

find_package(Python3 COMPONENTS Interpreter)
foreach(case data_tool bad_files compile_errors one_rank dp2 resnet_tiny resnet18_pp profile running_stats evaluation emulate)
  if(Python3_Interpreter_FOUND)
    add_test(NAME vision.${case}
             COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/vision/vision_e2e.py --bin ${CMAKE_BINARY_DIR}/bin
                     --source ${CMAKE_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/vision-e2e/${case} ${case})
  else()
    add_test(NAME vision.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(vision.${case} PROPERTIES LABELS "vision;runtime" TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${HPDL_SANITIZED_MPI_ENV}")
endforeach()
# convolutions under the sanitizers take 90 s; the image feed it runs is
# one_rank's and dp2's, the convolutions the IR tests' (scripts/test.sh
# leaves the label out of the sanitizer run)
if(TEST vision.resnet_tiny)
  set_tests_properties(vision.resnet_tiny PROPERTIES LABELS "vision;runtime;sanitize_redundant")
  set_tests_properties(vision.resnet18_pp PROPERTIES LABELS "vision;runtime;sanitize_redundant")
  set_tests_properties(vision.profile PROPERTIES LABELS "vision;runtime;sanitize_redundant")
endif()
