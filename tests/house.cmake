# house.cmake - the architecture's rules (docs/architecture.md), CTest
# names house.*:
#   house.layers            every folder includes only the folders below it,
#                           no circle between a folder's modules, no folder
#                           over 15 source files (house/check_layers.py)
#   house.layers_self_test  the checker reports each kind of break
#   house.runtime_link      hpdlrun, hpdl-data and the CPU program link the
#                           core and the runtime and no object of the
#                           compiler (their ld maps; house/check_link.py)
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME house.layers COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/house/check_layers.py ${CMAKE_SOURCE_DIR})
add_test(NAME house.layers_self_test COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/house/check_layers.py --self-test)
add_test(NAME house.runtime_link COMMAND ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/house/check_link.py
         ${CMAKE_BINARY_DIR}/runtime/hpdlrun.map ${CMAKE_BINARY_DIR}/runtime/hpdl-data.map
         ${CMAKE_BINARY_DIR}/runtime/hpdl-program.map)
