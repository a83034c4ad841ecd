// The seed's fork/exec test pattern: a test re-executes its own binary as a
// fresh process that runs one named child routine instead of doctest.
//
//   static chi_test::ChildRoutine kServer("server", [] { ...; return 0; });
//   CHECK(chi_test::RunChild("server", {{"CHI_PORT", "9500"}}) == 0);
//
// tests/doctest_main.cc dispatches on CHI_TEST_CHILD before doctest starts; an
// unknown routine name exits with kUnknownChild, so a renamed routine fails.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace chi_test {

inline constexpr int kUnknownChild = 99;
inline constexpr int kChildTimedOut = 124;

/** Child routines of this binary, by name. */
inline std::map<std::string, int (*)()> &ChildRegistry() {
  static std::map<std::string, int (*)()> registry;
  return registry;
}

/** Registers a routine that a re-executed child runs (its return value is the exit code). */
struct ChildRoutine {
  ChildRoutine(const char *name, int (*fn)()) { ChildRegistry()[name] = fn; }
};

/** Runs the child routine named by CHI_TEST_CHILD, if any; returns -1 when not a child. */
inline int MaybeRunChild() {
  const char *name = std::getenv("CHI_TEST_CHILD");
  if (name == nullptr) return -1;
  auto it = ChildRegistry().find(name);
  return it == ChildRegistry().end() ? kUnknownChild : it->second();
}

/** Checks inside a child routine (doctest is not running there): report and count failures. */
class ChildChecks {
 public:
  /**
   * Records a failed expectation with its description. A literal description allocates
   * nothing: in an ASan build a forked child's malloc can wait forever on an allocator
   * lock that another of the parent's threads held at the fork.
   */
  void Expect(bool ok, const char *what) {
    if (!ok) {
      std::fprintf(stderr, "child check failed: %s\n", what);
      ++failures_;
    }
  }
  /** Expect with a description built at run time. */
  void Expect(bool ok, const std::string &what) { Expect(ok, what.c_str()); }
  /** The child's exit code: 0 when every expectation held. */
  int Result() const { return failures_ == 0 ? 0 : 1; }

 private:
  int failures_ = 0;
};

/** Starts this binary as child `name` with extra environment; returns its pid. */
inline pid_t SpawnChild(const std::string &name,
                        const std::vector<std::pair<std::string, std::string>> &env = {}) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CHI_TEST_CHILD", name.c_str(), 1);
    for (const auto &kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    execl("/proc/self/exe", "chi-test-child", nullptr);
    _exit(127);
  }
  return pid;
}

/** Waits for a child up to timeout_sec (then kills it); returns its exit code or 128+signal. */
inline int WaitChild(pid_t pid, double timeout_sec = 120) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(timeout_sec * 1000));
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return kChildTimedOut;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/**
 * Forks without exec; the child runs fn(checks) and leaves with exit(), so static
 * destructors and atexit handlers run as in a real program's forked child (in ASan builds
 * with _exit, see below). Returns the child's exit code (kChildTimedOut: it hung).
 */
template <typename Fn>
int ForkAndExit(Fn fn, double timeout_sec = 60) {
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = fork();
  if (pid == 0) {
    ChildChecks checks;
    fn(checks);
    std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
    // ASan's allocator is not fork-safe: a region lock that another of the parent's threads
    // held at the fork stays locked in the child, and a static destructor's delete (seen:
    // yaml-cpp's) or LeakSanitizer's exit check then waits on it forever. glibc's malloc,
    // used outside sanitizer builds, is fork-safe, so the other builds run exit() here.
    _exit(checks.Result());
#else
    std::exit(checks.Result());
#endif
  }
  if (pid < 0) return -1;
  return WaitChild(pid, timeout_sec);
}

/** Runs child `name` to completion; returns its exit code (0 = every check passed). */
inline int RunChild(const std::string &name,
                    const std::vector<std::pair<std::string, std::string>> &env = {},
                    double timeout_sec = 120) {
  return WaitChild(SpawnChild(name, env), timeout_sec);
}

}  // namespace chi_test
