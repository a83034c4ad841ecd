// Shared parts of the cross-process tests (test_cross_process*.cc): the child routines a
// test binary re-executes itself as (runtime, load, streaming and survivor clients), the
// parent's view of a runtime child, files through which children and parent signal, and
// helpers that check answers. Included by one file per binary.
#pragma once

#include <doctest/doctest.h>

#include <arpa/inet.h>   // raw TCP peer
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // bounded reads on the raw TCP peer
#include <signal.h>      // SIGKILL
#include <sys/prctl.h>   // children die with the test binary
#include <sys/socket.h>  // raw TCP peer
#include <unistd.h>      // access

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // the child runtime serves the demo module

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>  // the threads of a stopped process
#include <iterator>  // std::size of the helper slots
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "child_process.h"
#include "poll_until.h"
#include "test_ports.h"
#include "zmq_raw_peer.h"


namespace xp_test {

using chi::u32;
using chi::u64;

constexpr chi::PoolId kDemoPool(300, 0);
constexpr chi::PoolId kMissingPool(301, 0);  ///< no test creates it

/** The transports a pure client can use. */
inline std::vector<std::string> Transports() { return {"shm", "ipc", "tcp"}; }

/** The Monitor name of the server behind a client transport. */
inline std::string ServerName(const std::string &mode) { return mode == "shm" ? "shm" : "zmq"; }

/** Port n (< 20) of this test process (the rule and the ranges: test_ports.h). */
inline u32 TestPort(u32 n) { return chi_test::kCrossProcessPorts.Port(n); }

/** Reads an integer environment variable of a child routine. */
inline u64 EnvU64(const char *name, u64 fallback = 0) {
  const char *v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoull(v, nullptr, 10);
}

/** Reads a string environment variable of a child routine ("" when unset). */
inline std::string EnvStr(const char *name) {
  const char *v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// ---- Child routines ----

/** A child never outlives the test binary (a failed test must not leave runtimes behind). */
inline void DieWithParent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

/** A standalone runtime: serves until StopRuntime. */
inline int ServerMain() {
  DieWithParent();
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true)) return 3;
  chi::Chimaera::Get().WaitForStop();
  chi::CHIMAERA_FINALIZE();
  return 0;
}
inline chi_test::ChildRoutine kServerRoutine("xp_server", ServerMain);

/** Connects as a pure client and creates (or finds) the demo pool. */
inline bool ConnectAndCreatePool(chi_test::ChildChecks *checks, chimaera::demo::Client *client) {
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {
    checks->Expect(false, "CHIMAERA_INIT as a pure client: " +
                              chi::Chimaera::Get().LastError().ToString());
    return false;
  }
  auto f = client->AsyncCreate(chi::PoolQuery::Dynamic(), "xp_demo", kDemoPool);
  const bool ok = f.Wait(20) && f->GetReturnCode() == 0;
  checks->Expect(ok, std::string("create the demo pool: ") +
                         (f.IsComplete() ? f->GetMessage() : "no answer"));
  return ok;
}

/** Wait helpers that do nothing: they hold every slot, so the transport gets none. */
inline void NoHelp(void *) {}
inline chi::WaitHelper g_taken_helpers[] = {{&NoHelp, nullptr}, {&NoHelp, nullptr},
                                            {&NoHelp, nullptr}, {&NoHelp, nullptr}};
static_assert(std::size(g_taken_helpers) == chi::WaitHelper::kMaxHelpers);

/**
 * Checks a ZeroMQ client's counters after its tasks (nothing for shm): no answer waited
 * for a sleep's timeout (a wake-up that never came), none is left on the wire.
 */
inline void CheckZmqCounters(chi_test::ChildChecks *checks) {
  auto *zmq = dynamic_cast<chi::ZmqClientTransport *>(chi::Chimaera::Get().GetTransport());
  if (zmq == nullptr) return;
  const chi::ZmqClientStats s = zmq->Stats();
  checks->Expect(s.late_wakeups == 0,
                 std::to_string(s.late_wakeups) + " answers waited for a sleep's timeout");
  checks->Expect(s.outstanding == 0, std::to_string(s.outstanding) + " tasks still on the wire");
}

/**
 * One window of n tasks from task index `base` as client `id`: GpuSubmit and Custom calls
 * all in flight at once; returns how many answers were wrong or missing.
 */
inline u64 RunLoadWindow(chimaera::demo::Client &client, u32 id, u64 base, u64 n) {
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> gpu;
  std::vector<chi::Future<chimaera::demo::CustomTask>> echo;
  std::vector<u32> values;
  std::vector<std::string> payloads;
  for (u64 i = base; i < base + n; ++i) {
    const u32 value = static_cast<u32>(id * 1000003u + i);
    if (i % 4 == 3) {
      payloads.push_back("client " + std::to_string(id) + " task " + std::to_string(i));
      echo.push_back(client.AsyncCustom(chi::PoolQuery::Local(), payloads.back()));
    } else {
      values.push_back(value);
      gpu.push_back(client.AsyncGpuSubmit(chi::PoolQuery::Local(), id, value));
    }
  }
  u64 wrong = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const bool ok = gpu[k].Wait(30) && gpu[k]->GetReturnCode() == 0 &&
                    gpu[k]->result_value_ == values[k] * 2 + id;
    wrong += ok ? 0 : 1;
  }
  for (size_t k = 0; k < echo.size(); ++k) {
    const bool ok = echo[k].Wait(30) && echo[k]->GetReturnCode() == 0 &&
                    echo[k]->data_.view() == payloads[k];
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

/**
 * A load client: XP_TASKS GpuSubmit and Custom calls with up to 256 in flight,
 * every answer checked; exits non-zero on the first wrong one. With XP_TAKE_HELPER=1
 * the process's wait helper is taken before it connects (as in a GPU client), so a
 * ZeroMQ transport's network thread alone receives, and a timed wait is checked too.
 */
inline int LoadClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  const bool take_helper = EnvU64("XP_TAKE_HELPER") != 0;
  for (chi::WaitHelper &h : g_taken_helpers) {
    if (take_helper) checks.Expect(chi::WaitHelper::Install(&h), "take a wait helper slot");
  }
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&checks, &client)) return checks.Result();
  if (take_helper) {
    auto slow = client.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                     100000000ull);
    checks.Expect(!slow.Wait(0.01f), "a timed wait on a slow task gives up");
    checks.Expect(slow.Wait(10) && slow->GetReturnCode() == 0, "then the slow task finishes");
  }
  const u64 tasks = EnvU64("XP_TASKS", 10000);
  const u32 id = static_cast<u32>(EnvU64("XP_CLIENT_ID"));
  const u32 expect_pid = static_cast<u32>(EnvU64("XP_EXPECT_PID"));
  if (expect_pid != 0) {
    checks.Expect(chi::Chimaera::Get().GetConnectAnswer().runtime_pid == expect_pid,
                  "connected to the runtime of its own port");
  }
  constexpr u64 kWindow = 256;
  u64 wrong = 0;
  for (u64 base = 0; base < tasks; base += kWindow) {
    wrong += RunLoadWindow(client, id, base, tasks - base < kWindow ? tasks - base : kWindow);
  }
  checks.Expect(wrong == 0, std::to_string(wrong) + " wrong or missing answers");
  CheckZmqCounters(&checks);
  chi::CHIMAERA_FINALIZE();
  for (chi::WaitHelper &h : g_taken_helpers) {
    if (take_helper) chi::WaitHelper::Remove(&h);
  }
  return checks.Result();
}
inline chi_test::ChildRoutine kLoadClientRoutine("xp_load_client", LoadClientMain);

/** A file path of this test process for `tag` (children and parent signal through files). */
inline std::string SignalPath(const std::string &tag) {
  return "/tmp/chi_xp_" + std::to_string(getpid()) + "_" + tag;
}

/** Creates (or truncates) the file at `path` holding `text`. */
inline void WriteFile(const std::string &path, const std::string &text = "") {
  std::ofstream(path) << text;
}

/**
 * Writes a config file of this test process for `tag` holding `yaml` and returns its path
 * (for CHI_SERVER_CONF; the caller removes it).
 */
inline std::string WriteConfigFile(const std::string &tag, const std::string &yaml) {
  const std::string path = "/tmp/chi_test_" + tag + "_" + std::to_string(getpid()) + ".yaml";
  WriteFile(path, yaml);
  return path;
}

/** True when a file exists at `path`. */
inline bool FileExists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

/** The /dev/shm files of the segments a runtime on `port` makes: three, then the transport's. */
inline std::vector<std::string> RuntimeSegmentFiles(u32 port) {
  std::vector<std::string> files;
  for (const char *role : chi::RuntimeSegments::kRoles) {
    files.push_back(chi::PosixShmBackend::FilePath(chi::RuntimeSegmentName(port, role)));
  }
  files.push_back(chi::PosixShmBackend::FilePath(chi::ShmSegmentName(port)));
  return files;
}

/** How many of `files` exist. */
inline size_t CountExisting(const std::vector<std::string> &files) {
  size_t n = 0;
  for (const std::string &f : files) n += FileExists(f) ? 1 : 0;
  return n;
}

/**
 * A client that streams Custom tasks until it is killed (SIGKILL tests): windows of
 * XP_STREAM_WINDOW (128) tasks of XP_STREAM_BYTES (4 KiB) each; it creates XP_READY_FILE
 * (when given) after its first window. With
 * XP_STREAM_MISSING_POOL=1 they go to a pool that does not exist: the runtime takes in
 * each whole request before it refuses it with a small answer, so what it holds for
 * this client is requests.
 */
inline int StreamClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&checks, &client)) return checks.Result();
  if (EnvU64("XP_STREAM_MISSING_POOL") != 0) client = chimaera::demo::Client(kMissingPool);
  const u64 window_size = EnvU64("XP_STREAM_WINDOW", 128);
  const std::string payload(EnvU64("XP_STREAM_BYTES", 4096), 's');
  const std::string ready_file = EnvStr("XP_READY_FILE");
  std::vector<chi::Future<chimaera::demo::CustomTask>> window;
  for (u64 round = 0;; ++round) {
    window.clear();
    for (u64 i = 0; i < window_size; ++i) {
      window.push_back(client.AsyncCustom(chi::PoolQuery::Local(), payload));
    }
    for (auto &f : window) f.Wait(30);
    if (round == 0 && !ready_file.empty()) WriteFile(ready_file);
  }
}
inline chi_test::ChildRoutine kStreamClientRoutine("xp_stream_client", StreamClientMain);

/**
 * A client that keeps running load windows (RunLoadWindow, 256 tasks each) until the file
 * XP_STOP_FILE exists, every answer checked; it creates XP_READY_FILE after its first
 * window. Runs beside a client that is killed: the others must not notice.
 */
inline int SurvivorClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&checks, &client)) return checks.Result();
  const u32 id = static_cast<u32>(EnvU64("XP_CLIENT_ID"));
  const std::string stop_file = EnvStr("XP_STOP_FILE");
  checks.Expect(!stop_file.empty(), "XP_STOP_FILE given");
  constexpr u64 kWindow = 256;
  u64 tasks = 0, wrong = 0;
  do {
    wrong += RunLoadWindow(client, id, tasks, kWindow);
    tasks += kWindow;
    if (tasks == kWindow) WriteFile(EnvStr("XP_READY_FILE"));
  } while (!FileExists(stop_file) && !stop_file.empty());
  checks.Expect(wrong == 0, std::to_string(wrong) + " wrong or missing answers of " +
                                std::to_string(tasks));
  CheckZmqCounters(&checks);
  chi::CHIMAERA_FINALIZE();
  return checks.Result();
}
inline chi_test::ChildRoutine kSurvivorClientRoutine("xp_survivor_client", SurvivorClientMain);

// ---- Parent-side helpers ----

/** A runtime child process on `port`, started and ready to serve. */
class ServerProcess {
 public:
  /** `extra_env`: more variables for the runtime child (e.g. sanitizer options). */
  explicit ServerProcess(u32 port,
                         std::vector<std::pair<std::string, std::string>> extra_env = {})
      : port_(port) {
    extra_env.insert(extra_env.begin(),
                     {{"CHI_PORT", std::to_string(port)}, {"CHI_WITH_RUNTIME", "1"}});
    pid_ = chi_test::SpawnChild("xp_server", extra_env);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      bool stale = false;
      if (chi::RuntimeSegments::FindOwner(port, &stale) == static_cast<u32>(pid_)) break;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_ ||
          std::chrono::steady_clock::now() > deadline) {
        if (waitpid(pid_, &status, WNOHANG) == 0) kill(pid_, SIGKILL);
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) Kill();
  }
  bool ok() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  u32 port() const { return port_; }

  /** Waits for the runtime to exit by itself; its exit code. */
  int WaitExit(double timeout_sec = 30) {
    const int rc = chi_test::WaitChild(pid_, timeout_sec);
    pid_ = -1;
    return rc;
  }
  /** SIGKILL: a crash. */
  int Kill() {
    kill(pid_, SIGKILL);
    return WaitExit(10);
  }

 private:
  u32 port_;
  pid_t pid_ = -1;
};

/** The environment for a client child of `port` over `mode`. */
inline std::vector<std::pair<std::string, std::string>> ClientEnv(u32 port,
                                                                 const std::string &mode) {
  return {{"CHI_PORT", std::to_string(port)}, {"CHI_IPC_MODE", mode}, {"CHI_WITH_RUNTIME", "0"}};
}

/** Makes this (parent) process a pure client of `port` for the scope. */
class ClientSession {
 public:
  ClientSession(u32 port, const std::string &mode, double reconnect_sec = 10) {
    setenv("CHI_PORT", std::to_string(port).c_str(), 1);
    setenv("CHI_IPC_MODE", mode.c_str(), 1);
    setenv("CHI_WITH_RUNTIME", "0", 1);
    setenv("CHI_RECONNECT_TIMEOUT", std::to_string(reconnect_sec).c_str(), 1);
    ok_ = chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false);
  }
  ~ClientSession() { chi::CHIMAERA_FINALIZE(); }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

/** Runs body(mode) once per ZeroMQ transport ("ipc", "tcp"), each in a session of its own. */
template <typename Body>
void ForEachZmqSession(u32 port, Body body) {
  for (const std::string mode : {"ipc", "tcp"}) {
    CAPTURE(mode);
    ClientSession session(port, mode);
    REQUIRE(session.ok());
    body(mode);
  }
}

/** Creates the demo pool through the current session. */
inline chimaera::demo::Client DemoClient() {
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(chi::PoolQuery::Dynamic(), "xp_demo", kDemoPool);
  REQUIRE(f.Wait(20));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/**
 * n GpuSubmit round trips on `gpu`, one at a time (each after a pause of pause_ms when
 * given), each answered and right (value i gives i * 2 + gpu).
 */
inline void SequentialGpuSubmits(chimaera::demo::Client &c, u32 gpu, u32 n, int pause_ms = 0) {
  for (u32 i = 0; i < n; ++i) {
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    auto f = c.AsyncGpuSubmit(chi::PoolQuery::Local(), gpu, i);
    REQUIRE(f.Wait(30));
    CHECK(f->result_value_ == i * 2 + gpu);
  }
}

/** The counters of the runtime's transport server `name` ("zmq" or "shm"), through Monitor. */
inline chimaera::admin::TransportStats ServerStats(const std::string &name = "zmq") {
  auto f = chimaera::admin::Client().AsyncMonitor(chi::PoolQuery::Local());
  REQUIRE(f.Wait(10));
  REQUIRE(f->GetReturnCode() == 0);
  chimaera::admin::MonitorReport r = f->Decode();
  REQUIRE(r.transports_.size() == 2);
  for (const chimaera::admin::TransportStats &t : r.transports_) {
    if (t.name_ == name) return t;
  }
  FAIL("no transport server named " << name);
  return {};
}

/**
 * Polls the counters of server `name` through Monitor until `pred` holds (false after
 * `sec`); the last counters read are left in *out.
 */
template <typename Pred>
bool AwaitServerStats(const std::string &name, Pred pred, chimaera::admin::TransportStats *out,
                      double sec = 20) {
  return chi_test::PollUntil([&] { return pred(*out = ServerStats(name)); }, sec);
}

/** Waits up to `sec` for a child to create the file at `path`. */
inline bool AwaitFile(const std::string &path, double sec = 20) {
  return chi_test::PollUntil([&] { return FileExists(path); }, sec, 2);
}

/** Minor page faults of process `pid` so far (/proc stat field 10); 0 when unreadable. */
inline u64 MinorFaults(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  u64 faults = 0;
  chi::detail::ForEachStatField(path.c_str(), 10, [&](int field, const char *text) {
    if (field == 10) faults = chi::detail::StatNumber(text);
  });
  return faults;
}

/** Asks the runtime of the current session to stop; true when it answered. */
inline bool StopThroughSession() {
  auto f = chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local());
  return f.Wait(20);
}

/** Stops the runtime on `port` through a tcp session of its own; true when it answered. */
inline bool StopThroughNewSession(u32 port) {
  ClientSession session(port, "tcp");
  REQUIRE(session.ok());
  return StopThroughSession();
}

/**
 * Stops a process (SIGSTOP) and returns once every one of its threads is stopped: kill
 * returns before a thread running on another CPU has reached the stop, and until then it
 * may still take a request in. False when it did not stop within 10 s.
 */
inline bool StopProcess(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  auto all_stopped = [&] {
    std::error_code ec;
    for (const auto &t : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');  // the state follows the command's ") "
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
        return false;
      }
    }
    return !ec;
  };
  return chi_test::PollUntil(all_stopped, 10, 1);
}

/** Resident memory of a process in KiB (0 when unreadable). */
inline u64 RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      u64 kib = 0;
      in >> kib;
      return kib;
    }
  }
  return 0;
}

/** Every demo call of the brief, checked, through the current session. */
inline void CheckDemoCalls(chimaera::demo::Client &c) {
  for (u64 size : {16ull, 64ull << 10, 4ull << 20}) {
    std::string data(size, '\0');
    for (u64 i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + size) % 251);
    auto f = c.AsyncCustom(chi::PoolQuery::Local(), data);
    REQUIRE(f.Wait(30));
    CHECK_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
    CHECK(f->data_.size() == size);
    CHECK(f->data_.view() == data);
  }
  auto g = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 42);
  REQUIRE(g.Wait(10));
  CHECK(g->GetReturnCode() == 0);
  CHECK(g->result_value_ == 84);
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> five;
  for (u32 v = 100; v <= 104; ++v) five.push_back(c.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, v));
  for (u32 v = 100; v <= 104; ++v) {
    auto &f = five[v - 100];
    REQUIRE(f.Wait(10));
    CHECK(f->result_value_ == v * 2);
  }
  auto w = c.AsyncWaitTest(chi::PoolQuery::Local(), 5);
  REQUIRE(w.Wait(10));
  CHECK(w->GetReturnCode() == 0);
  CHECK(w->current_depth_ == 5);
  auto l = c.AsyncLargeOutput(chi::PoolQuery::Local(), 1 << 20);
  REQUIRE(l.Wait(30));
  CHECK(l->GetReturnCode() == 0);
  REQUIRE(l->data_.size() == (1u << 20));
  u64 mismatches = 0;
  for (u64 i = 0; i < (1u << 20); ++i) {
    mismatches += static_cast<unsigned char>(l->data_.data()[i]) != i % 256 ? 1 : 0;
  }
  CHECK(mismatches == 0);
}

using chi_test::AnswerCode;
using chi_test::RecvWithin;

}  // namespace xp_test
