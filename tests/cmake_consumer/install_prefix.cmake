# cmake -DBUILD_DIR=<chi build tree> -DPREFIX=<dir> -P install_prefix.cmake
# Installs chi into an empty PREFIX (removed first, so nothing stale can satisfy the
# consumer), as the fixture setup for the install-tree consumer test.
if(NOT BUILD_DIR OR NOT PREFIX)
  message(FATAL_ERROR "usage: cmake -DBUILD_DIR=<build> -DPREFIX=<dir> -P install_prefix.cmake")
endif()
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed: ${rc}")
endif()
foreach(required IN ITEMS include/chi/chi.h include/chi_single/chi/chi.h)
  if(NOT EXISTS "${PREFIX}/${required}")
    message(FATAL_ERROR "install prefix lacks ${required}")
  endif()
endforeach()
file(GLOB_RECURSE configs "${PREFIX}/*/chimaeraConfig.cmake")
if(NOT configs)
  message(FATAL_ERROR "install prefix lacks chimaeraConfig.cmake")
endif()
message(STATUS "chi installed into ${PREFIX}")
