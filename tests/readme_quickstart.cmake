# Checks that README.md shows examples/quickstart.cc as it is: the fenced ```cpp block that
# follows the line "<!-- quickstart: examples/quickstart.cc -->" must equal the file.
#   cmake -DREADME=README.md -DEXAMPLE=examples/quickstart.cc -P readme_quickstart.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
set(marker "<!-- quickstart: examples/quickstart.cc -->\n```cpp\n")
string(FIND "${readme}" "${marker}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no quick-start block after the line: ${marker}")
endif()
string(LENGTH "${marker}" marker_length)
math(EXPR start "${at} + ${marker_length}")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```\n" end)
if(end EQUAL -1)
  message(FATAL_ERROR "README.md's quick-start block is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${end} block)
if(NOT block STREQUAL example)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/readme_quickstart_block.cc" "${block}")
  message(FATAL_ERROR "README.md's quick-start block differs from ${EXAMPLE}; compare it "
                      "with ${CMAKE_CURRENT_BINARY_DIR}/readme_quickstart_block.cc")
endif()
message(STATUS "README.md's quick start is ${EXAMPLE}")
