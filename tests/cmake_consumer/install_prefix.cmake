# cmake -DBUILD_DIR=<chi build tree> -DPREFIX=<dir> -P install_prefix.cmake
# Installs chi, as users do (every install rule: headers, package files, tools), into an
# empty PREFIX (removed first, so nothing stale can satisfy the consumer). The fixture
# setup of the install-tree consumer test; it needs a complete build, as ctest does.
if(NOT BUILD_DIR OR NOT PREFIX)
  message(FATAL_ERROR "usage: cmake -DBUILD_DIR=<build> -DPREFIX=<dir> -P install_prefix.cmake")
endif()
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed: ${rc} "
                      "(installing needs the whole build: run cmake --build first)")
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
