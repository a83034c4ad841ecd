// Shared parts of the shared-memory layer tests (test_shm_memory.cc,
// test_shm_size_class_allocator.cc): unique segment names, passing ShmPtrs through the
// environment to child processes (child_process.h starts and waits for them), and the
// children's exit codes. Included by one file per binary.
#pragma once

#include <chi/memory/arena_allocator.h>
#include <chi/memory/full_ptr.h>
#include <chi/memory/malloc_backend.h>
#include <chi/memory/memory_registry.h>
#include <chi/memory/posix_shm_backend.h>
#include <chi/memory/shm_ptr.h>
#include <chi/memory/size_class_allocator.h>

#include <unistd.h>  // getpid for unique names

#include <cinttypes>  // PRIu64 for passing offsets through the environment
#include <cstdio>     // snprintf, sscanf
#include <string>     // names

#include "child_process.h"  // ChildRoutine, SpawnChild, WaitChild

namespace shm_memory_test {

using chi_test::SpawnChild;
using chi_test::WaitChild;

using chi::AllocatorId;
using chi::ArenaAllocator;
using chi::ErrorCode;
using chi::FullPtr;
using chi::MallocBackend;
using chi::MemoryRegistry;
using chi::PosixShmBackend;
using chi::ShmPtr;
using chi::SizeClassAllocator;
using chi::Status;
using chi::u32;
using chi::u64;
using chi::u8;

/** How long a child may run: hang detection only (children normally take < 2 s). */
inline constexpr int kChildWaitSeconds = 120;

/** A segment name unique to this run and call. */
inline std::string UniqueName(const char *tag) {
  static int counter = 0;
  return "test_" + std::to_string(getpid()) + "_" + tag + "_" + std::to_string(counter++);
}

/** Removes a segment's name at scope exit, whatever happened in between. */
struct SegmentGuard {
  std::string name;
  ~SegmentGuard() { PosixShmBackend::DestroyByName(name); }
};

/** "major.minor.offset" for passing a ShmPtr through the environment. */
inline std::string PtrToText(ShmPtr<void> p) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%u.%u.%" PRIu64, p.alloc_id_.major_, p.alloc_id_.minor_,
                p.off_);
  return buf;
}

/** The ShmPtr that PtrToText wrote (null if `s` is missing or malformed). */
inline ShmPtr<void> PtrFromText(const char *s) {
  unsigned major = 0, minor = 0;
  unsigned long long off = 0;
  if (s == nullptr || std::sscanf(s, "%u.%u.%llu", &major, &minor, &off) != 3) return {};
  return ShmPtr<void>(AllocatorId(major, minor), off);
}

// ---- Child routines (run instead of doctest when CHI_TEST_CHILD is set) ----

/** Exit codes of the child routines, so a failed child says where it stopped. */
enum ChildExit : int {
  kChildOk = 0,
  kChildAttachFailed = 10,
  kChildNoAllocator = 11,
  kChildUnresolved = 12,
  kChildBadBytes = 13,
  kChildAllocFailed = 14,
  kChildStressErrors = 16,
};


}  // namespace shm_memory_test
