// Shared part of the runtime configuration tests (test_config.cc: parsing YAML text;
// test_config_loading.cc: files, environment and hostfiles). Included by one test file
// per binary.
#pragma once

#include <chi/core/status.h>

#include <string>

namespace config_test {

/** True when the status's message holds `needle`: errors are checked by what they name. */
inline bool Contains(const chi::Status &st, const std::string &needle) {
  return std::string(st.message()).find(needle) != std::string::npos;
}

}  // namespace config_test
