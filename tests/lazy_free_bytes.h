// How much of this process's memory the kernel may reclaim lazily: the pages lent to it
// with MADV_FREE (chi/core/lend_pages.h) and not yet taken back.
#pragma once

#include <fstream>  // /proc/self/smaps_rollup
#include <string>

#include <chi/core/types.h>

namespace chi_test {

/** This process's anonymous pages the kernel may reclaim lazily (LazyFree), in bytes. */
inline chi::u64 LazyFreeBytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  chi::u64 kb = 0;
  while (in >> key) {
    if (key == "LazyFree:" && in >> kb) return kb << 10;
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace chi_test
