// Helpers for tests that fork children sharing anonymous memory with the
// parent (queue and copy-space tests): the region, the fork, a bounded wait.
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>

#include "chi/queue/wait_event.h"  // chi::MonotonicNs

namespace chi_test {

/** An anonymous MAP_SHARED mapping: private to the test, shared with forked children. */
class SharedRegion {
 public:
  explicit SharedRegion(size_t bytes) : bytes_(bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    mem_ = static_cast<char *>(p);
  }
  ~SharedRegion() { munmap(mem_, bytes_); }
  SharedRegion(const SharedRegion &) = delete;
  SharedRegion &operator=(const SharedRegion &) = delete;
  char *get() const { return mem_; }

 private:
  char *mem_ = nullptr;
  size_t bytes_;
};

/** Runs fn in a forked child that exits 0 when fn returns true, 1 otherwise. */
template <typename Fn>
pid_t ForkChild(Fn fn) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    bool ok = fn();
    _exit(ok ? 0 : 1);
  }
  return pid;
}

/** Waits at most timeout_ms for the child; kills it if it overstays. True on exit code 0. */
bool WaitChild(pid_t pid, int timeout_ms = 20000) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  bool exited = true;
  if (fd >= 0) {
    pollfd pfd{fd, POLLIN, 0};
    exited = poll(&pfd, 1, timeout_ms) == 1;
    close(fd);
  } else {
    chi::u64 deadline = chi::MonotonicNs() + static_cast<chi::u64>(timeout_ms) * 1000000ull;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (chi::MonotonicNs() > deadline) {
        exited = false;
        break;
      }
      timespec ms{0, 1000000};
      nanosleep(&ms, nullptr);
    }
    if (exited) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!exited) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return exited && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace chi_test
