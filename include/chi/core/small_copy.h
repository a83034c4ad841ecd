// CopySmall: memcpy for sizes known only at run time but small (a task's first cache line,
// a short string), done with a few fixed-size moves instead of a library call. For the
// 8..56-byte copies of the request path the call and its size dispatch cost about four
// times the moves.
#pragma once

#include <cstring>  // fixed-size memcpy, which compilers turn into moves

#include "chi/core/types.h"  // u64

namespace chi {

/** Copies n bytes (n <= 64) from src to dst; the ranges must not overlap. */
inline void CopySmall(void *dst, const void *src, u64 n) {
  char *d = static_cast<char *>(dst);
  const char *s = static_cast<const char *>(src);
  if (n >= 16) {
    // 16-byte pieces; the last one ends at n and may overlap the one before it.
    for (u64 i = 0; i + 16 < n; i += 16) std::memcpy(d + i, s + i, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else {
    for (u64 i = 0; i < n; ++i) d[i] = s[i];
  }
}

}  // namespace chi
