// A standalone runtime in a child process and pure clients in others: the
// ClientConnect handshake, demo calls over every transport, concurrency (many
// processes, threads of one process, a process whose wait helper is taken), a
// client killed mid-stream, a runtime stopped and restarted under load, bad
// bytes from a raw ZeroMQ peer, and two runtimes side by side. Ports come from
// the pid so parallel test binaries do not collide.
#include <doctest/doctest.h>

#include <arpa/inet.h>   // raw TCP peer
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // bounded reads on the raw TCP peer
#include <signal.h>      // SIGKILL
#include <sys/prctl.h>   // children die with the test binary
#include <sys/socket.h>  // raw TCP peer

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // the child runtime serves the demo module

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>  // std::size of the helper slots
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "child_process.h"

using chi::u32;
using chi::u64;

namespace {

constexpr chi::PoolId kDemoPool(300, 0);

/** The transports a pure client can use. */
std::vector<std::string> Transports() { return {"shm", "ipc", "tcp"}; }

/** The Monitor name of the server behind a client transport. */
std::string ServerName(const std::string &mode) { return mode == "shm" ? "shm" : "zmq"; }

/** A port of this test binary: 20000 + 20 * (pid % 1000) + n, n < 20. */
u32 TestPort(u32 n) { return 20000 + 20 * (static_cast<u32>(getpid()) % 1000) + n; }

/** Reads an integer environment variable of a child routine. */
u64 EnvU64(const char *name, u64 fallback = 0) {
  const char *v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoull(v, nullptr, 10);
}

// ---- Child routines ----

/** A child never outlives the test binary (a failed test must not leave runtimes behind). */
void DieWithParent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

/** A standalone runtime: serves until StopRuntime. */
int ServerMain() {
  DieWithParent();
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true)) return 3;
  chi::Chimaera::Get().WaitForStop();
  chi::CHIMAERA_FINALIZE();
  return 0;
}
chi_test::ChildRoutine kServerRoutine("xp_server", ServerMain);

/** Connects as a pure client and creates (or finds) the demo pool. */
bool ConnectAndCreatePool(chi_test::ChildChecks *checks, chimaera::demo::Client *client) {
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
void NoHelp(void *) {}
chi::WaitHelper g_taken_helpers[] = {{&NoHelp, nullptr}, {&NoHelp, nullptr}, {&NoHelp, nullptr},
                                     {&NoHelp, nullptr}};
static_assert(std::size(g_taken_helpers) == chi::WaitHelper::kMaxHelpers);

/**
 * Checks a ZeroMQ client's counters after its tasks (nothing for shm): no answer waited
 * for a sleep's timeout (a wake-up that never came), none is left on the wire.
 */
void CheckZmqCounters(chi_test::ChildChecks *checks) {
  auto *zmq = dynamic_cast<chi::ZmqClientTransport *>(chi::Chimaera::Get().GetTransport());
  if (zmq == nullptr) return;
  const chi::ZmqClientStats s = zmq->Stats();
  checks->Expect(s.late_wakeups == 0,
                 std::to_string(s.late_wakeups) + " answers waited for a sleep's timeout");
  checks->Expect(s.outstanding == 0, std::to_string(s.outstanding) + " tasks still on the wire");
}

/**
 * A load client: XP_TASKS GpuSubmit and Custom calls with up to 256 in flight,
 * every answer checked; exits non-zero on the first wrong one. With XP_TAKE_HELPER=1
 * the process's wait helper is taken before it connects (as in a GPU client), so a
 * ZeroMQ transport's network thread alone receives, and a timed wait is checked too.
 */
int LoadClientMain() {
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
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> gpu;
  std::vector<chi::Future<chimaera::demo::CustomTask>> echo;
  std::vector<u32> values;
  std::vector<std::string> payloads;
  u64 wrong = 0;
  for (u64 base = 0; base < tasks; base += kWindow) {
    gpu.clear();
    echo.clear();
    values.clear();
    payloads.clear();
    for (u64 i = base; i < tasks && i < base + kWindow; ++i) {
      const u32 value = static_cast<u32>(id * 1000003u + i);
      if (i % 4 == 3) {
        payloads.push_back("client " + std::to_string(id) + " task " + std::to_string(i));
        echo.push_back(client.AsyncCustom(chi::PoolQuery::Local(), payloads.back()));
      } else {
        values.push_back(value);
        gpu.push_back(client.AsyncGpuSubmit(chi::PoolQuery::Local(), id, value));
      }
    }
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
  }
  checks.Expect(wrong == 0, std::to_string(wrong) + " wrong or missing answers");
  CheckZmqCounters(&checks);
  chi::CHIMAERA_FINALIZE();
  for (chi::WaitHelper &h : g_taken_helpers) {
    if (take_helper) chi::WaitHelper::Remove(&h);
  }
  return checks.Result();
}
chi_test::ChildRoutine kLoadClientRoutine("xp_load_client", LoadClientMain);

/** A client that streams tasks until it is killed (SIGKILL test). */
int StreamClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&checks, &client)) return checks.Result();
  std::vector<chi::Future<chimaera::demo::CustomTask>> window;
  const std::string payload(4096, 's');
  for (;;) {
    window.clear();
    for (int i = 0; i < 128; ++i) window.push_back(client.AsyncCustom(chi::PoolQuery::Local(), payload));
    for (auto &f : window) f.Wait(30);
  }
}
chi_test::ChildRoutine kStreamClientRoutine("xp_stream_client", StreamClientMain);

// ---- Parent-side helpers ----

/** A runtime child process on `port`, started and ready to serve. */
class ServerProcess {
 public:
  explicit ServerProcess(u32 port) : port_(port) {
    pid_ = chi_test::SpawnChild("xp_server", {{"CHI_PORT", std::to_string(port)},
                                              {"CHI_WITH_RUNTIME", "1"}});
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
std::vector<std::pair<std::string, std::string>> ClientEnv(u32 port, const std::string &mode) {
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

/** Creates the demo pool through the current session. */
chimaera::demo::Client DemoClient() {
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(chi::PoolQuery::Dynamic(), "xp_demo", kDemoPool);
  REQUIRE(f.Wait(20));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/** The counters of the runtime's transport server `name` ("zmq" or "shm"), through Monitor. */
chimaera::admin::TransportStats ServerStats(const std::string &name = "zmq") {
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

/** Asks the runtime of the current session to stop; true when it answered. */
bool StopThroughSession() {
  auto f = chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local());
  return f.Wait(20);
}

/** Resident memory of a process in KiB (0 when unreadable). */
u64 RssKib(pid_t pid) {
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
void CheckDemoCalls(chimaera::demo::Client &c) {
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

/** The return code in an answer's header (what a client would see). */
u32 AnswerCode(const zmq::message_t &m) {
  if (m.size() < chi::kEnvelopeHeaderBytes) return ~0u;
  chi::InputArchive ar(static_cast<const char *>(m.data()) + chi::kEnvelopeHeaderBytes,
                       m.size() - chi::kEnvelopeHeaderBytes);
  chi::Task header;
  header.SerializeBaseOut(ar);
  return ar.ok() ? header.GetReturnCode() : ~0u;
}

/** Receives one message within `ms`, or an empty one. */
zmq::message_t RecvWithin(zmq::socket_t &s, int ms) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  zmq::message_t m;
  if (zmq::poll(&item, 1, std::chrono::milliseconds(ms)) > 0) {
    (void)s.recv(m, zmq::recv_flags::none);
  }
  return m;
}

}  // namespace

TEST_CASE("the handshake refuses another protocol version or a resized segment, saying why") {
  chi::ConnectRequest req;
  req.pid = static_cast<u32>(getpid());
  req.uid = static_cast<u32>(getuid());
  req.mode = "tcp";
  CHECK(chi::CheckConnectRequest(req).ok());
  req.protocol_version = chi::kConnectProtocolVersion + 1;
  chi::Status st = chi::CheckConnectRequest(req);
  CHECK(st.code() == chi::ErrorCode::kVersionMismatch);
  CHECK(std::string(st.message()).find("protocol") != std::string::npos);

  chi::ServerConfig cfg;
  cfg.main_segment_bytes = cfg.client_data_bytes = cfg.runtime_data_bytes = 64 << 10;
  chi::RuntimeSegments segs;
  REQUIRE(segs.Create(cfg, TestPort(19)).ok());
  chi::ConnectAnswer answer;
  answer.segments = segs.Describe();
  REQUIRE(answer.segments.size() == 3);
  std::vector<std::unique_ptr<chi::PosixShmBackend>> attached;
  CHECK(chi::AttachRuntimeSegments(answer, &attached).ok());
  CHECK(attached.size() == 3);
  answer.segments[1].size += 4096;
  st = chi::AttachRuntimeSegments(answer, &attached);
  CHECK(st.code() == chi::ErrorCode::kSizeMismatch);
  CHECK(std::string(st.message()).find("announced") != std::string::npos);
  answer.segments[1].size -= 4096;
  answer.segments[2].version += 1;
  CHECK(chi::AttachRuntimeSegments(answer, &attached).code() == chi::ErrorCode::kVersionMismatch);
}

TEST_CASE("a pure client with no runtime fails within its connect timeout") {
  setenv("CHI_CONNECT_TIMEOUT", "0.3", 1);
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ClientSession session(TestPort(18), mode);
    CHECK_FALSE(session.ok());
    CHECK(chi::Chimaera::Get().LastError().code() == chi::ErrorCode::kTimeout);
  }
  unsetenv("CHI_CONNECT_TIMEOUT");
}

TEST_CASE("demo calls cross the process boundary over every transport") {
  ServerProcess server(TestPort(0));
  REQUIRE(server.ok());
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ClientSession session(server.port(), mode);
    REQUIRE(session.ok());
    CHECK(chi::Chimaera::Get().GetConnectAnswer().runtime_pid == static_cast<u32>(server.pid()));
    CHECK(chi::Chimaera::Get().GetConnectAnswer().segments.size() == 3);
    CHECK(std::string(chi::Chimaera::Get().GetTransport()->Name()) == mode);
    chimaera::demo::Client c = DemoClient();
    CheckDemoCalls(c);

    // Future::Wait(timeout) gives up on a slow remote task, then sees it finish.
    auto slow = c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                300000000ull);
    CHECK_FALSE(slow.Wait(0.02f));
    CHECK(slow.Wait(10));
    CHECK(slow->GetReturnCode() == 0);

    // Unknown pools and methods are answered with errors over the wire.
    chimaera::demo::Client nowhere(chi::PoolId(999, 9));
    auto lost = nowhere.AsyncCustom(chi::PoolQuery::Local(), "x");
    REQUIRE(lost.Wait(10));
    CHECK(lost->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownPool));
  }
  {
    ClientSession session(server.port(), "tcp");
    REQUIRE(session.ok());
    CHECK(StopThroughSession());
  }
  CHECK(server.WaitExit() == 0);
  bool stale = true;
  CHECK(chi::RuntimeSegments::FindOwner(server.port(), &stale) == 0);
  CHECK_FALSE(stale);  // a clean stop removes the segments
}

TEST_CASE("four clients with ten thousand tasks each all get correct answers") {
  ServerProcess server(TestPort(1));
  REQUIRE(server.ok());
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    std::vector<pid_t> clients;
    for (int i = 0; i < 4; ++i) {
      auto env = ClientEnv(server.port(), mode);
      env.push_back({"XP_CLIENT_ID", std::to_string(i + 1)});
      env.push_back({"XP_TASKS", "10000"});
      clients.push_back(chi_test::SpawnChild("xp_load_client", env));
    }
    for (pid_t p : clients) CHECK(chi_test::WaitChild(p, 90) == 0);
  }
  ClientSession session(server.port(), "ipc");
  REQUIRE(session.ok());
  const chimaera::admin::TransportStats s = ServerStats();
  CHECK(s.requests_ >= 2 * 4 * 10000);
  CHECK(ServerStats("shm").requests_ >= 4 * 10000);
  CHECK(s.tasks_outstanding_ == 1);  // the Monitor task that reports it
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("ZeroMQ clients whose wait helper is taken (as in a GPU client) get every answer") {
  // The network thread alone receives then: 256 tasks in flight once fell to 0.002 M/s,
  // each batch of answers waiting for a poll timeout; late_wakeups counts such waits.
  ServerProcess server(TestPort(13));
  REQUIRE(server.ok());
  for (const std::string mode : {"ipc", "tcp"}) {
    CAPTURE(mode);
    std::vector<pid_t> clients;
    for (int i = 0; i < 2; ++i) {
      auto env = ClientEnv(server.port(), mode);
      env.push_back({"XP_CLIENT_ID", std::to_string(i + 1)});
      env.push_back({"XP_TASKS", "10000"});
      env.push_back({"XP_TAKE_HELPER", "1"});
      clients.push_back(chi_test::SpawnChild("xp_load_client", env));
    }
    for (pid_t p : clients) CHECK(chi_test::WaitChild(p, 90) == 0);
  }
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("ZeroMQ callers waiting on their own round trips send and take them themselves") {
  ServerProcess server(TestPort(14));
  REQUIRE(server.ok());
  for (const std::string mode : {"ipc", "tcp"}) {
    CAPTURE(mode);
    ClientSession session(server.port(), mode);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    for (u32 i = 0; i < 100; ++i) {  // one caller, one task at a time
      auto f = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 3, i);
      REQUIRE(f.Wait(30));
      CHECK(f->result_value_ == i * 2 + 3);
    }
    auto *zmq = dynamic_cast<chi::ZmqClientTransport *>(chi::Chimaera::Get().GetTransport());
    REQUIRE(zmq != nullptr);
    chi::ZmqClientStats s = zmq->Stats();
    CHECK(s.sent_by_caller > 0);  // it sends its requests itself
    // and takes answers while it waits, unless a GPU client's worker holds the wait helper
    if (s.wait_helper) CHECK(s.received_by_caller > 0);
    chi::Atomic<u32> wrong;
    std::vector<std::thread> threads;
    for (u32 k = 0; k < 4; ++k) {
      threads.emplace_back([&c, &wrong, k] {
        for (u32 i = 0; i < 300; ++i) {  // one or two tasks in flight per thread
          auto f = c.AsyncGpuSubmit(chi::PoolQuery::Local(), k, i);
          auto g = i % 2 == 0 ? c.AsyncGpuSubmit(chi::PoolQuery::Local(), k, i + 1)
                              : chi::Future<chimaera::demo::GpuSubmitTask>();
          bool ok = f.Wait(30) && f->GetReturnCode() == 0 && f->result_value_ == i * 2 + k;
          if (g.IsValid()) ok = ok && g.Wait(30) && g->result_value_ == (i + 1) * 2 + k;
          if (!ok) wrong.FetchAdd(1, chi::MemOrder::kRelaxed);
        }
      });
    }
    for (std::thread &t : threads) t.join();
    CHECK(wrong.Load(chi::MemOrder::kRelaxed) == 0);
    s = zmq->Stats();
    CHECK(s.late_wakeups == 0);
    CHECK(s.outstanding == 0);
  }
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("a client killed mid-stream is reaped and others keep getting answers") {
  ServerProcess server(TestPort(2));
  REQUIRE(server.ok());
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ClientSession session(server.port(), "ipc");  // the observer: one zmq client
    REQUIRE(session.ok());
    const std::string name = ServerName(mode);
    const u64 observers = name == "zmq" ? 1 : 0;     // our session, seen by that server
    const u64 outstanding = name == "zmq" ? 1 : 0;   // our Monitor task, seen by that server
    const u64 reaped_before = ServerStats(name).clients_reaped_;
    const pid_t victim = chi_test::SpawnChild("xp_stream_client", ClientEnv(server.port(), mode));
    // Wait until the victim is registered and streaming.
    const u64 requests_before = ServerStats(name).requests_;
    bool streaming = false;
    for (int i = 0; i < 2000 && !streaming; ++i) {
      const chimaera::admin::TransportStats s = ServerStats(name);
      streaming = s.clients_ == observers + 1 && s.requests_ > requests_before + 2000;
      if (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(streaming);
    kill(victim, SIGKILL);
    CHECK(chi_test::WaitChild(victim, 10) == 128 + SIGKILL);
    chimaera::admin::TransportStats after;
    bool reclaimed = false;
    for (int i = 0; i < 2000 && !reclaimed; ++i) {
      after = ServerStats(name);
      reclaimed = after.clients_ == observers && after.tasks_outstanding_ == outstanding &&
                  after.clients_reaped_ == reaped_before + 1;
      if (!reclaimed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(reclaimed);
    CHECK(after.bytes_held_ < (64ull << 20));
    auto env = ClientEnv(server.port(), mode);
    env.push_back({"XP_TASKS", "2000"});
    CHECK(chi_test::RunChild("xp_load_client", env, 60) == 0);
  }
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("stopping the runtime with tasks in flight answers every waiter and a restart is rejoined") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    const u32 port = TestPort(mode == "ipc" ? 3 : mode == "tcp" ? 4 : 9);
    auto server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    ClientSession session(port, mode, 20);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    std::vector<chi::Future<chimaera::demo::LockHoldTask>> held;
    for (int i = 0; i < 100; ++i) {
      held.push_back(c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                     2000000ull));
    }
    std::vector<chi::Future<chimaera::demo::CustomTask>> echoes;
    for (int i = 0; i < 200; ++i) echoes.push_back(c.AsyncCustom(chi::PoolQuery::Local(), "in flight"));
    auto stop = chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local());
    u32 answered = 0, failed = 0;
    for (auto &f : held) {
      const bool done = f.Wait(15);
      CHECK(done);
      if (done) (f->GetReturnCode() == 0 ? answered : failed) += 1;
    }
    for (auto &f : echoes) {
      const bool done = f.Wait(15);
      CHECK(done);
      if (done && f->GetReturnCode() == 0) CHECK(f->data_.view() == "in flight");
    }
    CHECK(stop.Wait(15));
    CHECK(answered + failed == held.size());
    CHECK(server->WaitExit() == 0);

    // While no runtime runs a task waits; the restarted runtime answers it.
    auto pending = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    REQUIRE(pending.Wait(20));
    // The new runtime has no demo pool yet: the waiting task is answered (with an error).
    CHECK(pending->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownPool));
    chimaera::demo::Client again = DemoClient();
    auto g = again.AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    REQUIRE(g.Wait(20));
    CHECK(g->GetReturnCode() == 0);
    CHECK(g->result_value_ == 15);
    // The same connection object rejoined the new runtime process.
    chi::ClientTransport *tr = chi::Chimaera::Get().GetTransport();
    if (mode == "shm") {
      auto *shm = dynamic_cast<chi::ShmReconnectingTransport *>(tr);
      REQUIRE(shm != nullptr);
      CHECK(shm->RuntimePid() == static_cast<u32>(server->pid()));
      CHECK(shm->Reconnects() >= 1);
      CHECK(shm->Current()->Failure() == chi::ErrorCode::kOk);
    } else {
      auto *zmq = dynamic_cast<chi::ZmqClientTransport *>(tr);
      REQUIRE(zmq != nullptr);
      CHECK(zmq->RuntimePid() == static_cast<u32>(server->pid()));
      CHECK(zmq->Stats().reconnects >= 1);
    }
    // Many tasks over the rejoined connection, every answer checked.
    std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> many;
    for (u32 v = 0; v < 500; ++v) {
      many.push_back(again.AsyncGpuSubmit(chi::PoolQuery::Local(), 2, v));
    }
    u32 right = 0;
    for (u32 v = 0; v < 500; ++v) {
      right += many[v].Wait(20) && many[v]->GetReturnCode() == 0 &&
               many[v]->result_value_ == v * 2 + 2;
    }
    CHECK(right == 500);
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);
  }
}

TEST_CASE("after a reconnect the connect answer describes the restarted runtime") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    const u32 port = TestPort(mode == "ipc" ? 11 : mode == "tcp" ? 12 : 10);
    auto server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    ClientSession session(port, mode, 20);
    REQUIRE(session.ok());
    const chi::ConnectAnswer first = chi::Chimaera::Get().GetConnectAnswer();
    CHECK(first.runtime_pid == static_cast<u32>(server->pid()));
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);

    server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    // The first task after the restart (creating the pool again) makes the client rejoin.
    auto rejoin = DemoClient().AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    REQUIRE(rejoin.Wait(20));
    CHECK(rejoin->GetReturnCode() == 0);
    const chi::ConnectAnswer now = chi::Chimaera::Get().GetConnectAnswer();
    CHECK(now.rc == 0);
    CHECK(now.runtime_pid == static_cast<u32>(server->pid()));
    CHECK(now.runtime_pid != first.runtime_pid);
    CHECK(now.port == port);
    CHECK(now.segments.size() == 3);
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);
  }
}

TEST_CASE("a killed runtime fails its clients' waits and its stale segments are cleaned") {
  const u32 port = TestPort(5);
  std::unique_ptr<ServerProcess> server;
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    server = std::make_unique<ServerProcess>(port);  // the first start after a kill cleans up
    REQUIRE(server->ok());
    ClientSession session(port, mode, 0.5);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    auto slow = c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                5000000000ull);
    CHECK_FALSE(slow.Wait(0.05f));
    CHECK(server->Kill() == 128 + SIGKILL);
    REQUIRE(slow.Wait(10));
    CHECK(slow->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kPeerDead));
    auto after = c.AsyncCustom(chi::PoolQuery::Local(), "nobody");
    REQUIRE(after.Wait(10));  // no runtime comes back within 0.5 s
    CHECK(after->GetReturnCode() != 0);
    bool stale = false;
    CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == 0);
    CHECK(stale);
  }
  server = std::make_unique<ServerProcess>(port);
  REQUIRE(server->ok());
  chi::ServerConfig cfg;
  chi::RuntimeSegments second;
  chi::Status st = second.Create(cfg, port);
  CHECK(st.code() == chi::ErrorCode::kAlreadyExists);  // a live runtime owns the port
  CHECK(std::string(st.message()).find(std::to_string(server->pid())) != std::string::npos);
  ClientSession session(port, "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server->WaitExit() == 0);
}

TEST_CASE("garbage from a raw ZeroMQ peer is answered with errors and others are still served") {
  ServerProcess server(TestPort(6));
  REQUIRE(server.ok());
  ClientSession session(server.port(), "ipc");
  REQUIRE(session.ok());
  chimaera::demo::Client c = DemoClient();

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(chi::ZmqEndpoint("tcp", server.port()));
  auto send = [&](const void *data, size_t len) { raw.send(zmq::message_t(data, len), zmq::send_flags::none); };

  send("abc", 3);  // shorter than the envelope header
  zmq::message_t m = RecvWithin(raw, 5000);
  REQUIRE(m.size() >= 8);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kTruncated));

  // A task before the handshake is refused.
  chimaera::demo::CustomTask probe(chi::TaskBuffer("hi", 2));
  probe.ops_ = &chi::detail::TaskOpsFor<chimaera::demo::CustomTask>::kOps;
  probe.pool_id_ = kDemoPool;
  probe.pool_query_ = chi::PoolQuery::Local();
  probe.method_ = chimaera::demo::Method::kCustom;
  std::vector<char> request;
  chi::EncodeRequest(&probe, 77, &request);
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  REQUIRE(m.size() >= 8);
  CHECK(chi::EnvelopeId(m.data()) == 77);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kInvalidArgument));

  // A handshake in another protocol version is refused; the right one is accepted.
  chi::ConnectRequest hello;
  hello.pid = static_cast<u32>(getpid());
  hello.uid = static_cast<u32>(getuid());
  hello.mode = "tcp";
  hello.protocol_version = 99;
  raw.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  m = RecvWithin(raw, 5000);
  chi::ConnectAnswer answer;
  REQUIRE(chi::ParseControl(m, &answer));
  CHECK(answer.rc == static_cast<u32>(chi::ErrorCode::kVersionMismatch));
  hello.protocol_version = chi::kConnectProtocolVersion;
  raw.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  m = RecvWithin(raw, 5000);
  REQUIRE(chi::ParseControl(m, &answer));
  CHECK(answer.rc == 0);

  // Now a well-formed request works, and a 1 GiB length prefix in its payload is refused.
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == 0);
  std::vector<char> huge = request;
  const u64 gib = 1ull << 30;
  const size_t len_at = huge.size() - 2 - sizeof(u64);  // the TaskBuffer length precedes "hi"
  std::memcpy(huge.data() + len_at, &gib, sizeof(gib));
  send(huge.data(), huge.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kMalformed));

  // Multi-frame messages and truncations are refused; every one gets an answer.
  raw.send(zmq::message_t(request.data(), request.size()), zmq::send_flags::sndmore);
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kMalformed));
  const u64 rss_before = RssKib(server.pid());
  std::mt19937 rng(11);
  int answers = 0, errors = 0;
  constexpr int kGarbage = 3000;
  for (int i = 0; i < kGarbage; ++i) {  // truncated requests, then random bytes after an id
    std::vector<char> bad = request;
    if (i % 2 == 0) {
      bad.resize(8 + rng() % (bad.size() - 8));
    } else {
      bad.resize(8 + rng() % 200);
      for (size_t k = 8; k < bad.size(); ++k) bad[k] = static_cast<char>(rng());
    }
    send(bad.data(), bad.size());
  }
  for (int i = 0; i < kGarbage; ++i) {
    m = RecvWithin(raw, 5000);
    if (m.size() == 0) break;
    ++answers;
    errors += AnswerCode(m) != 0 ? 1 : 0;
  }
  CHECK(answers == kGarbage);
  CHECK(errors == kGarbage);
  CHECK(RssKib(server.pid()) < rss_before + 32 * 1024);

  // A raw TCP peer announcing a 1 GiB ZeroMQ frame is disconnected.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  unsigned char greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
  const unsigned char ready[] = {0x04, 28, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e',
                                 't', '-', 'T', 'y', 'p', 'e', 0, 0, 0, 6, 'D', 'E', 'A', 'L',
                                 'E', 'R'};
  const unsigned char frame[] = {0x02, 0, 0, 0, 0, 0x40, 0, 0, 0};  // long frame, 1 GiB
  CHECK(write(fd, greeting, sizeof(greeting)) == sizeof(greeting));
  CHECK(write(fd, ready, sizeof(ready)) == sizeof(ready));
  CHECK(write(fd, frame, sizeof(frame)) == sizeof(frame));
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof(buf));
    closed = n <= 0;
  }
  CHECK(closed);
  close(fd);

  // The session's own client never noticed.
  CheckDemoCalls(c);
  raw.close();
  ctx.close();
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("two runtimes on different ports serve their own clients side by side") {
  ServerProcess a(TestPort(7));
  ServerProcess b(TestPort(8));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::vector<pid_t> clients;
  for (ServerProcess *s : {&a, &b}) {
    for (const std::string &mode : Transports()) {
      auto env = ClientEnv(s->port(), mode);
      env.push_back({"XP_TASKS", "1000"});
      env.push_back({"XP_CLIENT_ID", std::to_string(s->port())});
      env.push_back({"XP_EXPECT_PID", std::to_string(s->pid())});
      clients.push_back(chi_test::SpawnChild("xp_load_client", env));
    }
  }
  for (pid_t p : clients) CHECK(chi_test::WaitChild(p, 60) == 0);
  for (ServerProcess *s : {&a, &b}) {
    ClientSession session(s->port(), "tcp");
    REQUIRE(session.ok());
    CHECK(chi::Chimaera::Get().GetConnectAnswer().runtime_pid == static_cast<u32>(s->pid()));
    CHECK(StopThroughSession());
    CHECK(s->WaitExit() == 0);
  }
}
