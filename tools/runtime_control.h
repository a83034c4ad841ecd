// What the runtime tools share: running a runtime in the foreground, starting
// one in the background, stopping it, and printing its state and Monitor
// statistics. Each returns a process exit code (0 = success) and says why on stderr.
// Invariant: the control tools are pure clients; they never start a runtime in-process.
#pragma once

#include <fcntl.h>     // open /dev/null for a detached runtime
#include <signal.h>    // SIGTERM/SIGINT ask the runtime to stop
#include <sys/wait.h>  // waitpid on a runtime that failed to start
#include <time.h>      // the runtime's start time, for status
#include <unistd.h>    // fork, setsid, execv

#include <chrono>   // polling intervals
#include <cstdio>   // printf
#include <cstdlib>  // setenv
#include <string>   // paths
#include <string_view>  // module names
#include <thread>   // sleep_for between Monitor reports

#include <chi/chi.h>                      // CHIMAERA_INIT, Chimaera
#include <chi/mods/admin/admin_client.h>  // StopRuntime, Monitor

namespace chi_tools {

/**
 * For the tools that take no arguments (CHI_PORT and CHI_SERVER_CONF configure them):
 * 0 when there are none, else says so and returns the usage exit code 2.
 */
inline int RefuseArguments(int argc, char **argv) {
  if (argc <= 1) return 0;
  std::fprintf(stderr, "%s: unexpected argument '%s'; it takes none (CHI_PORT, CHI_SERVER_CONF)\n",
               argv[0], argv[1]);
  return 2;
}

/**
 * chimaera_start_runtime's command line: nothing, or --with-demo (serve the demo module,
 * a test module). Returns 0, or the usage exit code 2 after saying what is wrong.
 */
inline int ParseStartArguments(int argc, char **argv, bool *with_demo) {
  *with_demo = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--with-demo") {
      *with_demo = true;
      continue;
    }
    std::fprintf(stderr,
                 "%s: unexpected argument '%s'; it takes only --with-demo (CHI_PORT and "
                 "CHI_SERVER_CONF configure it)\n",
                 argv[0], argv[i]);
    return 2;
  }
  return 0;
}

/** True when the runtime's configuration creates a pool of module `name` at start. */
inline bool ConfigComposes(std::string_view name) {
  chi::ServerConfig cfg;
  if (!chi::LoadServerConfig(&cfg).ok()) return false;  // CHIMAERA_INIT reports the error
  for (const chi::ComposeEntry &e : cfg.compose) {
    if (e.mod_name == name) return true;
  }
  return false;
}

/** SIGTERM / SIGINT: ask the runtime to drain and stop (async-signal-safe: a store and a futex wake). */
inline void OnStopSignal(int) { chi::Chimaera::Get().RequestStop(); }

/** Runs a runtime in this process until StopRuntime or a signal; returns the exit code. */
inline int RunRuntimeForeground() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true)) return 1;
  const chi::ServerConfig &cfg = chi::Chimaera::Get().GetConfig();
  std::printf("chimaera runtime: pid %d serving port %u (shm, ipc and tcp on loopback)\n", getpid(),
              cfg.port);
  std::fflush(stdout);
  chi::Chimaera::Get().WaitForStop();
  chi::CHIMAERA_FINALIZE();
  std::printf("chimaera runtime: pid %d stopped\n", getpid());
  return 0;
}

/**
 * Connects this process as a pure client over the transport every client uses
 * (networking.ipc_mode or CHI_IPC_MODE, default shm), so the tools exercise the same path.
 */
inline bool ConnectAsClient(double timeout_sec) {
  setenv("CHI_WITH_RUNTIME", "0", 1);
  const std::string t = std::to_string(timeout_sec);
  setenv("CHI_CONNECT_TIMEOUT", t.c_str(), 0);
  return chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false);
}

/** The port the tools address (CHI_PORT or the config). */
inline chi::u32 ConfiguredPort() {
  chi::ServerConfig cfg;
  chi::LoadServerConfig(&cfg);
  return cfg.port;
}

/** What "no runtime" messages add when a dead runtime's segments remain. */
inline const char *StaleNote(bool stale) {
  return stale ? " (stale segments of a dead runtime remain; the next start or "
                 "`chimaera runtime clean` removes them)"
               : "";
}

/**
 * Removes the leftovers of dead runtimes of this user on every port (SweepStaleSegments)
 * that are at least `min_age_s` old, and says what it removed and what it spared.
 */
inline int Clean(chi::u64 min_age_s) {
  chi::StaleSweepOptions o;
  o.min_age_s = min_age_s;
  const chi::StaleSweep s = chi::SweepStaleSegments(o);
  if (s.ports.empty()) {
    std::printf("chimaera: no leftovers of dead runtimes to remove\n");
  } else {
    std::string ports;
    for (chi::u32 p : s.ports) ports += (ports.empty() ? "" : ", ") + std::to_string(p);
    std::printf("chimaera: removed %u segments and %u ipc socket files of dead runtimes "
                "(ports %s)\n",
                s.segments, s.sockets, ports.c_str());
  }
  if (s.young != 0) {
    std::printf("chimaera: kept %u dead runtimes' leftovers younger than %llu s (--min-age)\n",
                s.young, static_cast<unsigned long long>(min_age_s));
  }
  return 0;
}

/**
 * Sends StopRuntime and waits until the runtime process has exited. When no live runtime
 * holds the port's segments here, it still asks over the network (a runtime whose
 * /dev/shm this process cannot see), but for one second instead of the whole timeout.
 */
inline int StopRuntime(double timeout_sec) {
  const chi::u32 port = ConfiguredPort();
  bool stale = false;
  const chi::u32 owner = chi::RuntimeSegments::FindOwner(port, &stale);
  if (!ConnectAsClient(owner == 0 ? 1 : timeout_sec)) {
    if (owner == 0) {
      std::fprintf(stderr, "chimaera: no runtime to stop on port %u%s\n", port, StaleNote(stale));
    } else {
      std::fprintf(stderr,
                   "chimaera: runtime pid %u holds port %u's segments but did not answer\n",
                   owner, port);
    }
    return 1;
  }
  const chi::u32 pid = chi::Chimaera::Get().GetConnectAnswer().runtime_pid;
  auto f = chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local());
  const bool answered = f.Wait(static_cast<float>(timeout_sec));
  const chi::u32 rc = answered ? f->GetReturnCode() : 0;
  chi::CHIMAERA_FINALIZE();
  if (answered && rc != 0 && rc != static_cast<chi::u32>(chi::ErrorCode::kShutdown) &&
      rc != static_cast<chi::u32>(chi::ErrorCode::kPeerDead)) {
    std::fprintf(stderr, "chimaera: StopRuntime failed: %s\n", f->GetMessage());
    return 1;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(timeout_sec * 1000));
  while (chi::ProcessAlive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "chimaera: runtime pid %u still running after %.1f s\n", pid,
                   timeout_sec);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("chimaera: runtime pid %u stopped\n", pid);
  return 0;
}

/** The start-runtime executable next to this one. */
inline std::string SiblingPath(const char *name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
  return dir + "/" + name;
}

/**
 * Starts chimaera_start_runtime detached (own session, output to `log`; with --with-demo
 * when `with_demo`), waits until it serves.
 */
inline int StartRuntimeDetached(const std::string &log, double timeout_sec, bool with_demo) {
  const std::string exe = SiblingPath("chimaera_start_runtime");
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("chimaera: fork");
    return 1;
  }
  if (pid == 0) {
    setsid();
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execl(exe.c_str(), exe.c_str(), with_demo ? "--with-demo" : static_cast<char *>(nullptr),
          static_cast<char *>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(timeout_sec * 1000));
  const chi::u32 port = ConfiguredPort();
  for (;;) {
    bool stale = false;
    if (chi::RuntimeSegments::FindOwner(port, &stale) == static_cast<chi::u32>(pid)) break;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      std::fprintf(stderr, "chimaera: the runtime exited during start-up (see %s)\n", log.c_str());
      return 1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "chimaera: the runtime (pid %d) did not start within %.1f s\n", pid,
                   timeout_sec);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!ConnectAsClient(timeout_sec)) return 1;  // serving, not just holding its segments
  chi::CHIMAERA_FINALIZE();
  std::printf("chimaera: runtime pid %d serving port %u (log: %s)\n", pid, port, log.c_str());
  return 0;
}

/** Prints one Monitor report. */
inline void PrintReport(const chimaera::admin::MonitorReport &r) {
  std::printf("workers:\n");
  for (const chi::WorkerStats &w : r.workers_) {
    std::printf("  worker %u role %u  done %llu  queued %llu  blocked %llu  parks %llu  helped %llu\n",
                w.id_, static_cast<unsigned>(w.role_),
                static_cast<unsigned long long>(w.tasks_done_),
                static_cast<unsigned long long>(w.queue_depth_),
                static_cast<unsigned long long>(w.blocked_),
                static_cast<unsigned long long>(w.parks_),
                static_cast<unsigned long long>(w.helped_));
  }
  std::printf("pools:\n");
  for (const chi::PoolStats &p : r.pools_) {
    std::printf("  %s  %s (%s)  containers %u  in flight %llu  done %llu\n",
                p.id_.ToString().c_str(), p.name_.c_str(), p.module_name_.c_str(),
                p.num_containers_, static_cast<unsigned long long>(p.inflight_),
                static_cast<unsigned long long>(p.tasks_done_));
  }
  std::printf("transports:\n");
  for (const chimaera::admin::TransportStats &t : r.transports_) {
    std::printf("  %s  clients %llu  reaped %llu  outstanding %llu  held %llu B  requests %llu  "
                "refused %llu  dropped %llu  sleeps %llu  late wake-ups %llu  cpu moves %llu  "
                "rescued %llu\n",
                t.name_.c_str(), static_cast<unsigned long long>(t.clients_),
                static_cast<unsigned long long>(t.clients_reaped_),
                static_cast<unsigned long long>(t.tasks_outstanding_),
                static_cast<unsigned long long>(t.bytes_held_),
                static_cast<unsigned long long>(t.requests_),
                static_cast<unsigned long long>(t.requests_refused_),
                static_cast<unsigned long long>(t.answers_dropped_),
                static_cast<unsigned long long>(t.sleeps_),
                static_cast<unsigned long long>(t.late_wakeups_),
                static_cast<unsigned long long>(t.cpu_moves_),
                static_cast<unsigned long long>(t.rescued_));
  }
  std::printf("large payload blocks kept: %llu  mapped %llu B  resident %llu B; "
              "message buffers resident %llu B\n",
              static_cast<unsigned long long>(r.payload_cache_.blocks_),
              static_cast<unsigned long long>(r.payload_cache_.bytes_),
              static_cast<unsigned long long>(r.payload_cache_.resident_bytes_),
              static_cast<unsigned long long>(r.payload_cache_.message_buffer_bytes_));
  std::fflush(stdout);
}

/** Prints `count` Monitor reports (0 = until killed), every_sec apart (0 = back to back). */
inline int Monitor(double every_sec, long count) {
  if (!ConnectAsClient(5)) return 1;
  int rc = 0;
  for (long i = 0; count == 0 || i < count; ++i) {
    auto f = chimaera::admin::Client().AsyncMonitor(chi::PoolQuery::Local());
    if (!f.Wait(10) || f->GetReturnCode() != 0) {
      std::fprintf(stderr, "chimaera: Monitor failed: %s\n",
                   f.IsComplete() ? f->GetMessage() : "no answer within 10 s");
      rc = 1;
      break;
    }
    PrintReport(f->Decode());
    if (every_sec > 0 && (count == 0 || i + 1 < count)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<long>(every_sec * 1000)));
    }
  }
  chi::CHIMAERA_FINALIZE();
  return rc;
}

/** Says whether a runtime serves the port (exit 0) or not (exit 1, naming stale leftovers). */
/** "started 2026-11-27 13:00:01 UTC, up 12.3 s" for a start at `start_ns` (CLOCK_REALTIME). */
inline std::string StartedLine(chi::u64 start_ns) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const double up = (static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec) -
                     static_cast<double>(start_ns)) / 1e9;
  const time_t sec = static_cast<time_t>(start_ns / 1000000000ull);
  tm utc{};
  char when[32] = "?";
  if (gmtime_r(&sec, &utc) != nullptr) std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &utc);
  char line[96];
  std::snprintf(line, sizeof(line), "started %s UTC, up %.1f s", when, up);
  return line;
}

inline int Status() {
  const chi::u32 port = ConfiguredPort();
  bool stale = false;
  chi::u64 start_ns = 0;
  const chi::u32 owner = chi::RuntimeSegments::FindOwner(port, &stale, &start_ns);
  if (owner == 0) {
    std::printf("no runtime on port %u%s\n", port, StaleNote(stale));
    return 1;
  }
  // Read before this tool connects: over shm it takes a slot itself.
  chi::ShmServer::Stats shm_stats;
  const bool shm_read = chi::ShmServer::ProbeStats(port, &shm_stats).ok();
  if (!ConnectAsClient(2)) {
    std::printf("runtime pid %u holds port %u's segments but does not answer\n", owner, port);
    return 1;
  }
  const chi::ConnectAnswer &a = chi::Chimaera::Get().GetConnectAnswer();
  std::printf("runtime pid %u serving port %u\n", a.runtime_pid, a.port);
  if (start_ns != 0) std::printf("  %s\n", StartedLine(start_ns).c_str());
  for (const chi::SegmentInfo &s : a.segments) {
    std::printf("  segment %s  %llu bytes  layout v%u\n", s.name.c_str(),
                static_cast<unsigned long long>(s.size), s.version);
  }
  chi::ShmServerInfo shm;
  if (chi::ShmInfoFromAnswer(a, &shm).ok()) {  // the shm transport's slots and rings
    std::printf("  segment %s  %llu bytes  layout v%u  (shm transport)\n", shm.segment.c_str(),
                static_cast<unsigned long long>(shm.size), shm.version);
  }
  if (shm_read) {
    std::printf("  shm clients %u of %u slots (shm.client_slots)\n", shm_stats.clients,
                shm_stats.slots);
  }
  chi::CHIMAERA_FINALIZE();
  return 0;
}

}  // namespace chi_tools
