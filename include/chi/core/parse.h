// Tiny, allocation-free parsers for the textual forms of ids and queries.
#pragma once

#include <string_view>  // std::string_view

#include "chi/core/types.h"  // u64

namespace chi::detail {

/** Parses a whole decimal string into *out; false on empty, junk or overflow past max. */
inline bool ParseUnsigned(std::string_view s, u64 max, u64 *out) {
  if (s.empty() || s.size() > 20) return false;
  u64 v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    u64 d = static_cast<u64>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

}  // namespace chi::detail
