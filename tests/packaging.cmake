# Packaging checks, label `packaging`: the single header is current and self-contained,
# find_package(chimaera) works from the build tree and from an install prefix, the
# headers compile as device code under nvcc and hipcc, and misuse the API marks
# (ignoring SleepFor's result) fails to compile. Included by tests/CMakeLists.txt.

set(_chi_root ${PROJECT_SOURCE_DIR})
set(_chi_consumer_src ${CMAKE_CURRENT_SOURCE_DIR}/cmake_consumer)
set(_chi_pkg_bin ${CMAKE_CURRENT_BINARY_DIR}/packaging)

# ---- Single header -----------------------------------------------------------

find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME single_include_check
         COMMAND ${Python3_EXECUTABLE} ${_chi_root}/scripts/amalgamate.py --check
         WORKING_DIRECTORY ${_chi_root})

# The consumer program again, compiled with single_include/ as its only chi include
# directory: the dependencies' targets come from chi::chimaera's link list, its own
# include directory does not (main.cc fails to compile if include/ is reachable).
add_executable(chi_single_include_consumer ${_chi_consumer_src}/main.cc)
target_include_directories(chi_single_include_consumer PRIVATE ${_chi_root}/single_include)
target_compile_features(chi_single_include_consumer PRIVATE cxx_std_20)
target_compile_definitions(chi_single_include_consumer PRIVATE CHI_CONSUMER_SINGLE_INCLUDE=1)
get_target_property(_chi_deps chimaera INTERFACE_LINK_LIBRARIES)
get_target_property(_chi_defs chimaera INTERFACE_COMPILE_DEFINITIONS)
target_link_libraries(chi_single_include_consumer PRIVATE ${_chi_deps})
if(_chi_defs)
  target_compile_definitions(chi_single_include_consumer PRIVATE ${_chi_defs})
endif()
add_test(NAME single_include_compiles COMMAND chi_single_include_consumer)

# ---- find_package consumers (build tree, install tree) -------------------------

# Everything the consumer configure needs to match this build; prefix lists keep their
# semicolons through add_test via $<SEMICOLON>.
set(_chi_consumer_opts
  -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})
if(CMAKE_MAKE_PROGRAM)
  list(APPEND _chi_consumer_opts -DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM})
endif()
set(_chi_install_prefix ${_chi_pkg_bin}/install)
set(_chi_build_prefix_path ${CMAKE_PREFIX_PATH})
set(_chi_install_prefix_path ${_chi_install_prefix} ${CMAKE_PREFIX_PATH})
list(JOIN _chi_build_prefix_path "$<SEMICOLON>" _chi_build_prefix_path)
list(JOIN _chi_install_prefix_path "$<SEMICOLON>" _chi_install_prefix_path)

add_test(NAME cmake_consumer_build_tree
  COMMAND ${CMAKE_CTEST_COMMAND}
    --build-and-test ${_chi_consumer_src} ${_chi_pkg_bin}/consumer_build_tree
    --build-generator ${CMAKE_GENERATOR}
    --build-options ${_chi_consumer_opts}
      -Dchimaera_DIR=${PROJECT_BINARY_DIR}
      "-DCMAKE_PREFIX_PATH=${_chi_build_prefix_path}"
      -DCHI_EXPECTED_CONFIG_DIR=${PROJECT_BINARY_DIR}
      -DCHI_EXPECTED_INCLUDE_DIR=${_chi_root}/include
    --test-command chi_consumer)

add_test(NAME cmake_consumer_install
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DPREFIX=${_chi_install_prefix}
          -P ${_chi_consumer_src}/install_prefix.cmake)
set_tests_properties(cmake_consumer_install PROPERTIES FIXTURES_SETUP chi_install_tree)

add_test(NAME cmake_consumer_install_tree
  COMMAND ${CMAKE_CTEST_COMMAND}
    --build-and-test ${_chi_consumer_src} ${_chi_pkg_bin}/consumer_install_tree
    --build-generator ${CMAKE_GENERATOR}
    --build-options ${_chi_consumer_opts}
      "-DCMAKE_PREFIX_PATH=${_chi_install_prefix_path}"
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
      -DCHI_EXPECTED_CONFIG_DIR=${_chi_install_prefix}/${CMAKE_INSTALL_LIBDIR}/cmake/chimaera
      -DCHI_EXPECTED_INCLUDE_DIR=${_chi_install_prefix}/${CMAKE_INSTALL_INCLUDEDIR}
    --test-command chi_consumer)
set_tests_properties(cmake_consumer_install_tree PROPERTIES FIXTURES_REQUIRED chi_install_tree)

# ---- Misuse that must not compile ----------------------------------------------

# A handler that ignores SleepFor's result (a sleep a stopping runtime cut short) fails,
# and for that reason: the test passes only when the compiler names it.
add_test(NAME sleep_for_result_must_be_used
  COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -Werror=unused-result
          -I${_chi_root}/include ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/sleep_for_unused.cc)
set_tests_properties(sleep_for_result_must_be_used PROPERTIES
  PASS_REGULAR_EXPRESSION "ignoring return value of [^\n]*SleepFor")

# A task whose Aggregate has another signature than `void Aggregate(const T &, u32)` fails
# to compile, naming the signature (it would be skipped for the default fold otherwise).
set(_chi_aggregate_tests)
foreach(_case 1 2 3)
  add_test(NAME aggregate_signature_must_match_${_case}
    COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -DAGGREGATE_CASE=${_case}
            -I${_chi_root}/include ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/aggregate_wrong_signature.cc)
  set_tests_properties(aggregate_signature_must_match_${_case} PROPERTIES
    PASS_REGULAR_EXPRESSION "a task's Aggregate must be")
  list(APPEND _chi_aggregate_tests aggregate_signature_must_match_${_case})
endforeach()

# ---- Device-side compile checks -----------------------------------------------

set(_chi_device_src ${CMAKE_CURRENT_SOURCE_DIR}/gpu_compile/device_check.cu)
# include/chi/gpu (orchestrator kernel, GPU client, demo GPU module): needs the GPU build define.
set(_chi_gpu_device_src ${CMAKE_CURRENT_SOURCE_DIR}/gpu/device_compile_check.cu)
set(_chi_skip_code 77)

# Registers `name` as a test that only reports why it cannot run; ctest lists it as skipped.
function(chi_add_skipped_test name why)
  message(STATUS "chi: ${name} skipped: ${why}")
  add_test(NAME ${name} COMMAND sh -c "echo 'skipped: ${why}'; exit ${_chi_skip_code}")
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${_chi_skip_code})
endfunction()

find_program(CHI_NVCC nvcc HINTS /usr/local/cuda/bin DOC "nvcc for the device compile check")
if(CHI_NVCC)
  foreach(_variant IN ITEMS include single_include)
    set(_name nvcc_compile_check)
    if(_variant STREQUAL "single_include")
      set(_name nvcc_compile_check_single_include)
    endif()
    add_test(NAME ${_name}
      COMMAND ${CHI_NVCC} -std=c++20 -arch=sm_90 -I${_chi_root}/${_variant}
              -c ${_chi_device_src} -o ${_chi_pkg_bin}/${_name}.o)
  endforeach()
  add_test(NAME nvcc_compile_check_gpu
    COMMAND ${CHI_NVCC} -std=c++20 -arch=sm_90 -DCHIMAERA_ENABLE_CUDA=1 -I${_chi_root}/include
            -c ${_chi_gpu_device_src} -o ${_chi_pkg_bin}/nvcc_compile_check_gpu.o)
else()
  chi_add_skipped_test(nvcc_compile_check "nvcc not found")
  chi_add_skipped_test(nvcc_compile_check_single_include "nvcc not found")
  chi_add_skipped_test(nvcc_compile_check_gpu "nvcc not found")
endif()

# Debian 12's HIP 5.2: without --offload-arch hipcc silently targets gfx803.
find_program(CHI_HIPCC hipcc DOC "hipcc for the device compile check")
if(CHI_HIPCC)
  foreach(_variant IN ITEMS include single_include)
    set(_name hip_compile_check)
    if(_variant STREQUAL "single_include")
      set(_name hip_compile_check_single_include)
    endif()
    add_test(NAME ${_name}
      COMMAND ${CHI_HIPCC} --offload-arch=gfx90a -std=c++20 -x hip -I${_chi_root}/${_variant}
              -c ${_chi_device_src} -o ${_chi_pkg_bin}/${_name}.o)
  endforeach()
  add_test(NAME hip_compile_check_gpu
    COMMAND ${CHI_HIPCC} --offload-arch=gfx90a -std=c++20 -x hip -DCHIMAERA_ENABLE_ROCM=1
            -I${_chi_root}/include -c ${_chi_gpu_device_src}
            -o ${_chi_pkg_bin}/hip_compile_check_gpu.o)
  add_test(NAME hip_compile_check_ipc
    COMMAND ${CHI_HIPCC} --offload-arch=gfx90a -std=c++20 -x hip -DCHIMAERA_ENABLE_ROCM=1
            -I${_chi_root}/include -c ${_chi_root}/tests/gpu_compile/hip_host_check.cc
            -o ${_chi_pkg_bin}/hip_compile_check_ipc.o)
else()
  chi_add_skipped_test(hip_compile_check "hipcc not found")
  chi_add_skipped_test(hip_compile_check_single_include "hipcc not found")
  chi_add_skipped_test(hip_compile_check_gpu "hipcc not found")
  chi_add_skipped_test(hip_compile_check_ipc "hipcc not found")
endif()

file(MAKE_DIRECTORY ${_chi_pkg_bin})
set_tests_properties(
  single_include_check single_include_compiles cmake_consumer_build_tree
  cmake_consumer_install cmake_consumer_install_tree sleep_for_result_must_be_used
  ${_chi_aggregate_tests}
  nvcc_compile_check nvcc_compile_check_single_include
  hip_compile_check hip_compile_check_single_include
  nvcc_compile_check_gpu hip_compile_check_gpu hip_compile_check_ipc
  PROPERTIES LABELS packaging TIMEOUT 600)
