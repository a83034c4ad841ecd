// Shared parts of the shared-memory layer tests (test_shm_memory.cc,
// test_shm_size_class_allocator.cc): unique segment names, the fork + exec of a fresh copy
// of the test binary (CHI_TEST_CHILD=<role> makes the copy run a child routine instead of
// doctest), passing ShmPtrs through the environment, and the children's exit codes.
// Included by one file per binary.
#pragma once

#include <chi/memory/arena_allocator.h>
#include <chi/memory/full_ptr.h>
#include <chi/memory/malloc_backend.h>
#include <chi/memory/memory_registry.h>
#include <chi/memory/posix_shm_backend.h>
#include <chi/memory/shm_ptr.h>
#include <chi/memory/size_class_allocator.h>

#include <signal.h>    // kill
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execve, _exit

#include <chrono>            // deadlines for bounded waits
#include <cinttypes>         // PRIu64 for passing offsets through the environment
#include <cstdio>            // snprintf, sscanf
#include <cstdlib>           // getenv
#include <cstring>           // strncmp, strcmp
#include <initializer_list>  // the roles of a ChildDispatch
#include <string>            // names
#include <thread>            // sleep_for while waiting for a child
#include <vector>            // environment entries

extern char **environ;

namespace shm_memory_test {

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

/** Builds this process's environment plus the given KEY=VALUE entries. */
inline std::vector<std::string> ChildEnv(const std::vector<std::string> &extra) {
  std::vector<std::string> env;
  for (char **e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CHI_TEST_", 9) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

/** Starts a fresh copy of this binary running child routine `role`. */
inline pid_t SpawnChild(const char *role, std::vector<std::string> extra) {
  extra.push_back(std::string("CHI_TEST_CHILD=") + role);
  std::vector<std::string> env = ChildEnv(extra);
  std::vector<char *> envp;
  for (std::string &s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char *argv[] = {exe, nullptr};
  pid_t pid = fork();
  if (pid == 0) {
    execve(exe, argv, envp.data());
    _exit(127);
  }
  return pid;
}

/** Exit code of child `pid`, waiting at most kChildWaitSeconds (then kills it: -1). */
inline int WaitChild(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

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
  kChildUnknownRole = 15,
  kChildStressErrors = 16,
};

/** A child routine and the CHI_TEST_CHILD value that selects it. */
struct ChildRole {
  const char *name;
  int (*run)();
};

/**
 * Runs before doctest's main in a re-executed copy and never returns there: runs the role
 * named by CHI_TEST_CHILD and exits with its code (kChildUnknownRole when none matches).
 * Each test binary defines one global instance listing the roles its tests spawn.
 */
struct ChildDispatch {
  explicit ChildDispatch(std::initializer_list<ChildRole> roles) {
    const char *role = std::getenv("CHI_TEST_CHILD");
    if (role == nullptr) return;
    int rc = kChildUnknownRole;
    for (const ChildRole &r : roles) {
      if (std::strcmp(role, r.name) == 0) rc = r.run();
    }
    _exit(rc);
  }
};

}  // namespace shm_memory_test
