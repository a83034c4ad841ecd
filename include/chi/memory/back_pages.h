// Backing shared pages ahead of use. tmpfs gives a shared segment a page only when the page
// is first written, and a write that finds /dev/shm full dies of SIGBUS. Populating a range
// ahead (MADV_POPULATE_WRITE) takes its pages now, or reports that it cannot, so the caller
// can refuse or take another way while it still has the choice. Pages once backed stay
// backed: nothing here gives them back.
#pragma once

#include <sys/mman.h>  // madvise

#include <cerrno>  // why a populate failed

#include "chi/core/types.h"  // u64

namespace chi {

/**
 * Has every page of [p, p + bytes) backed (and mapped here) now. False when some page
 * cannot be (a full /dev/shm, or no memory); true where the kernel cannot populate ahead
 * (before Linux 5.14: nothing is checked then).
 */
inline bool BackPages(const void *p, u64 bytes) {
  constexpr u64 kPage = 4096;
  const u64 begin = reinterpret_cast<u64>(p) & ~(kPage - 1);
  const u64 end = (reinterpret_cast<u64>(p) + bytes + kPage - 1) & ~(kPage - 1);
#ifdef MADV_POPULATE_WRITE
  // EFAULT: a page could not be backed (touching it would have raised SIGBUS); ENOMEM: no memory.
  if (madvise(reinterpret_cast<void *>(begin), end - begin, MADV_POPULATE_WRITE) != 0) {
    return errno != EFAULT && errno != ENOMEM;
  }
#else
  (void)begin;
  (void)end;
#endif
  return true;
}

}  // namespace chi
