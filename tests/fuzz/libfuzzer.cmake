# Included from tests/CMakeLists.txt: builds each tests/fuzz/fuzz_<name>.cc as
# <build>/tests/fuzz/fuzz_<name> with a clang++ directly (the project compiler is g++), in
# the default build. Declared from tests/, not tests/fuzz/, where a custom target's alias
# (tests/fuzz/fuzz_<name>) would be the path of its own binary. Sets CHI_FUZZ_HARNESSES
# (every harness) and CHI_FUZZ_BUILT (ON when the harnesses are built).

set(CHI_FUZZ_HARNESSES config_yaml hostfile pool_query connect gpu_connect_info answer request
    shm_stream)
set(CHI_FUZZ_BUILT OFF)

find_program(CHIMAERA_FUZZ_CXX NAMES clang++-15 clang++
             DOC "clang++ that builds the libFuzzer harnesses (tests/fuzz)")
set(_fuzz_flags -std=c++20 -O1 -g -fno-omit-frame-pointer
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
if(CHIMAERA_FUZZ_CXX AND NOT DEFINED CACHE{CHIMAERA_FUZZ_CXX_WORKS})
  # Some clang installs lack the libFuzzer runtime: linking an empty harness tells.
  set(_probe ${CMAKE_CURRENT_BINARY_DIR}/fuzz/fuzz_probe)
  file(WRITE ${_probe}.cc
       "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t *, size_t) { return 0; }\n")
  execute_process(COMMAND ${CHIMAERA_FUZZ_CXX} ${_fuzz_flags} ${_probe}.cc -o ${_probe}
                  RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(_probe_rc EQUAL 0)
    set(CHIMAERA_FUZZ_CXX_WORKS ON CACHE INTERNAL "clang++ links libFuzzer harnesses")
  else()
    set(CHIMAERA_FUZZ_CXX_WORKS OFF CACHE INTERNAL "clang++ links libFuzzer harnesses")
  endif()
endif()
if(NOT CHIMAERA_FUZZ_CXX OR NOT CHIMAERA_FUZZ_CXX_WORKS)
  message(STATUS "chi: no clang++ with libFuzzer found: the fuzz_<name> harnesses are not "
                 "built and no fuzz tests are added (the fuzz_replay_<name> tests still are)")
  return()
endif()
message(STATUS "chi: libFuzzer harnesses (tests/fuzz) built with ${CHIMAERA_FUZZ_CXX}")
set(CHI_FUZZ_BUILT ON)

foreach(_name IN LISTS CHI_FUZZ_HARNESSES)
  set(_src ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_${_name}.cc)
  set(_bin ${CMAKE_CURRENT_BINARY_DIR}/fuzz/fuzz_${_name})
  # -MD: the depfile lists every header the harness includes, so editing one rebuilds it.
  add_custom_command(
    OUTPUT ${_bin}
    COMMAND ${CHIMAERA_FUZZ_CXX} ${_fuzz_flags} -I${PROJECT_SOURCE_DIR}/include
            -MD -MF ${_bin}.d ${_src} -o ${_bin}
            -lzmq -lyaml-cpp -lboost_context -lpthread -ldl -lrt
    DEPENDS ${_src}
    DEPFILE ${_bin}.d
    COMMENT "Building libFuzzer harness fuzz_${_name} with clang"
    VERBATIM)
  add_custom_target(fuzz_${_name} ALL DEPENDS ${_bin})
endforeach()
