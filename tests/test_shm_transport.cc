// The shared-memory transport end to end: a runtime child process serves pure clients
// through ShmServer; this process and client child processes connect with
// ShmClientTransport. Covers payloads larger than the ring, many clients at once, the
// process reaper (SIGKILLed clients, a dead runtime) and bad bytes written into a ring.
#include "child_process.h"

#include <doctest/doctest.h>
#include <poll.h>        // waiting for a child's ready byte
#include <signal.h>      // SIGKILL
#include <sys/mman.h>    // the ping-pong floor's shared page
#include <sys/prctl.h>   // PR_SET_PDEATHSIG: children never outlive the test
#include <sys/stat.h>    // segment permissions
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // pipe, fork, getpid

#include <algorithm>  // sort, min
#include <chrono>     // deadlines and timing
#include <cstdio>     // fprintf in child routines
#include <cstring>    // memcpy, memcmp
#include <string>     // payloads, env values
#include <thread>     // sleep_for while polling from tests
#include <vector>     // futures, samples

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>
#include <chi/transport/shm_transport.h>

namespace {

using chi::ErrorCode;
using chi::PoolQuery;
using chi::u32;
using chi::u64;
using Clock = std::chrono::steady_clock;

constexpr chi::PoolId kPool(300, 0);

u32 Code(ErrorCode c) { return static_cast<u32>(c); }

u32 EnvU32(const char *name, u32 fallback) {
  const char *v = std::getenv(name);
  return v == nullptr ? fallback : static_cast<u32>(std::strtoul(v, nullptr, 10));
}

/** A port per test and per test process, so parallel runs never share a segment. */
u32 TestPort(u32 k) { return 20000 + static_cast<u32>(getpid() % 4000) * 8 + k; }

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/** Bytes that differ per size and seed, so a mixed-up answer cannot pass. */
std::string Pattern(u64 size, u32 seed) {
  std::string s(size, '\0');
  for (u64 i = 0; i < size; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + i / 4093) % 251);
  return s;
}

/** Polls the runtime's published counters until `pred` holds (false after `sec`). */
template <typename Pred>
bool AwaitStats(u32 port, Pred pred, double sec, chi::ShmServer::Stats *out) {
  const auto t0 = Clock::now();
  for (;;) {
    if (chi::ShmServer::ProbeStats(port, out).ok() && pred(*out)) return true;
    if (SecondsSince(t0) > sec) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

/** Finds the runtime serving `port` (waits up to `sec` for it to come up). */
bool AwaitRuntime(u32 port, double sec, chi::ShmServerInfo *info, pid_t expect_pid = 0) {
  const auto t0 = Clock::now();
  for (;;) {
    if (chi::ShmServer::Probe(port, info).ok() &&
        (expect_pid == 0 || info->runtime_pid == static_cast<u32>(expect_pid))) {
      return true;
    }
    if (SecondsSince(t0) > sec) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// ---- Child processes ----

/** Makes a child die with the test process, whatever happens to the test. */
void DieWithParent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

/** A runtime serving shm clients on CHI_TEST_SHM_PORT until StopRuntime (or a kill). */
int RuntimeMain() {
  DieWithParent();
  const u32 port = EnvU32("CHI_TEST_SHM_PORT", 0);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 2;
  chi::Chimaera &rt = chi::Chimaera::Get();
  chi::RequestDispatcher dispatcher(rt.Pools(), rt.Orchestrator());
  chi::ShmServer server;
  chi::ShmServer::Options o;
  o.num_slots = 8;
  o.ring_bytes = EnvU32("CHI_TEST_SHM_RING", 256u << 10);
  o.max_message_bytes = 64ull << 20;
  chi::Status st = server.Start(&dispatcher, o, port);
  if (!st.ok()) {
    std::fprintf(stderr, "shm runtime: %s\n", st.ToString().c_str());
    return 3;
  }
  rt.WaitForStop();
  server.Stop();
  chi::CHIMAERA_FINALIZE();
  return 0;
}
chi_test::ChildRoutine kRuntimeRoutine("shm_runtime", RuntimeMain);

/** Connects this process to the runtime of CHI_TEST_SHM_PORT as a pure client. */
std::unique_ptr<chi::ShmClientTransport> ConnectFromChild(chi_test::ChildChecks *checks) {
  chi::ShmServerInfo info;
  std::unique_ptr<chi::ShmClientTransport> tr;
  if (!AwaitRuntime(EnvU32("CHI_TEST_SHM_PORT", 0), 20, &info)) {
    checks->Expect(false, "runtime found");
    return tr;
  }
  chi::Status st = chi::ShmClientTransport::Connect(info, &tr);
  checks->Expect(st.ok(), "connect: " + st.ToString());
  if (tr != nullptr) chi::GetIpcManager().AttachTransport(tr.get(), 0);
  return tr;
}

/** Sends one byte on the pipe named by CHI_TEST_READY_FD. */
void SignalReady() {
  int fd = static_cast<int>(EnvU32("CHI_TEST_READY_FD", 0));
  char c = 'r';
  if (write(fd, &c, 1) != 1) std::fprintf(stderr, "ready pipe write failed\n");
}

/** One of several concurrent clients: 10^4 GpuSubmit tasks, 256 in flight at a time. */
int LoadClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  const u32 id = EnvU32("CHI_TEST_CLIENT_ID", 0);
  chimaera::demo::Client client(kPool);
  constexpr u32 kTasks = 10000;
  constexpr u32 kWindow = 256;
  u32 wrong = 0;
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> window;
  for (u32 base = 0; base < kTasks; base += kWindow) {
    window.clear();
    for (u32 j = base; j < base + kWindow && j < kTasks; ++j) {
      window.push_back(client.AsyncGpuSubmit(PoolQuery::Local(), j % 4, id * 100000 + j));
    }
    for (u32 k = 0; k < window.size(); ++k) {
      const u32 j = base + k;
      if (!window[k].Wait(30) || window[k]->GetReturnCode() != 0 ||
          window[k]->result_value_ != (id * 100000 + j) * 2 + j % 4) {
        ++wrong;
      }
    }
  }
  checks.Expect(wrong == 0, "client " + std::to_string(id) + ": " + std::to_string(wrong) +
                                " wrong or missing answers");
  chi::GetIpcManager().AttachTransport(nullptr, 0);
  tr->Close();
  return checks.Result();
}
chi_test::ChildRoutine kLoadClientRoutine("shm_load_client", LoadClientMain);

/**
 * A client that dies mid-stream: a task in flight, then the first 64 KiB of a 4 MiB
 * request written into its ring, then it waits to be SIGKILLed.
 */
int DyingClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  auto held = client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kRead,
                                   300000000ull);
  chi::ShmStream *rs = tr->Segment().RequestStream(tr->SlotIndex());
  std::vector<char> piece(64u << 10, 'x');
  const u64 id = 0x5151;
  std::memcpy(piece.data(), &id, sizeof(id));
  checks.Expect(rs->WritableBytes(piece.size()) >= piece.size(), "room for the first piece");
  rs->WritePiece(true, 4u << 20, piece.data(), piece.size());
  tr->Segment().Header()->server_event_.Notify();
  SignalReady();
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 1;  // the parent should have killed us long ago
}
chi_test::ChildRoutine kDyingClientRoutine("shm_dying_client", DyingClientMain);

/** A client that streams 4 MiB echoes (two in flight) until it is killed. */
int StreamingClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  const std::string big = Pattern(4u << 20, 9);
  auto a = client.AsyncCustom(PoolQuery::Local(), big);
  bool signalled = false;
  for (int i = 0; i < 100000; ++i) {
    auto b = client.AsyncCustom(PoolQuery::Local(), big);
    if (!a.Wait(30) || a->GetReturnCode() != 0) return 2;
    if (!signalled) {
      SignalReady();
      signalled = true;
    }
    a = std::move(b);
  }
  return 1;
}
chi_test::ChildRoutine kStreamingClientRoutine("shm_streaming_client", StreamingClientMain);

/** A fresh client: echoes of several sizes must come back intact. */
int EchoClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  for (u64 size : {16ull, 4000ull, 300000ull, 1ull << 20}) {
    const std::string data = Pattern(size, 5);
    auto f = client.AsyncCustom(PoolQuery::Local(), data);
    checks.Expect(f.Wait(30) && f->GetReturnCode() == 0 && f->data_.view() == data,
                  "echo of " + std::to_string(size) + " bytes");
  }
  chi::GetIpcManager().AttachTransport(nullptr, 0);
  tr->Close();
  return checks.Result();
}
chi_test::ChildRoutine kEchoClientRoutine("shm_echo_client", EchoClientMain);

// ---- Parent-side fixtures ----

/** A runtime child process on `port`; killed (and its segment removed) at scope exit. */
class RuntimeProcess {
 public:
  explicit RuntimeProcess(u32 port, u32 ring_bytes = 256u << 10) : port_(port) {
    pid_ = chi_test::SpawnChild("shm_runtime", {{"CHI_TEST_SHM_PORT", std::to_string(port)},
                                                {"CHI_TEST_SHM_RING", std::to_string(ring_bytes)}});
    REQUIRE(pid_ > 0);
    REQUIRE_MESSAGE(AwaitRuntime(port, 30, &info_, pid_), "runtime child did not come up");
  }
  ~RuntimeProcess() {
    if (pid_ > 0) Kill();
    // Remove the segment if it is still the one our runtime made (a killed runtime
    // leaves it behind); a newer runtime's segment on the same port stays.
    chi::ShmSegment seg;
    if (seg.AttachByName(chi::ShmSegmentName(port_)).ok()) {
      if (seg.Header()->runtime_pid_ == info_.runtime_pid) {
        seg.Destroy();
      } else {
        seg.Detach();
      }
    }
  }
  RuntimeProcess(const RuntimeProcess &) = delete;
  RuntimeProcess &operator=(const RuntimeProcess &) = delete;

  const chi::ShmServerInfo &Info() const { return info_; }
  pid_t Pid() const { return pid_; }
  /** SIGKILLs the runtime; returns its exit status (128 + 9). */
  int Kill() {
    kill(pid_, SIGKILL);
    int rc = chi_test::WaitChild(pid_, 30);
    pid_ = -1;
    return rc;
  }
  /** Waits for a runtime that was asked to stop; returns its exit code. */
  int Join(double sec) {
    int rc = chi_test::WaitChild(pid_, sec);
    pid_ = -1;
    return rc;
  }

 private:
  u32 port_;
  pid_t pid_ = -1;
  chi::ShmServerInfo info_;
};

/** This process as a pure client of a runtime: the IpcManager sends through shm. */
class AttachedClient {
 public:
  explicit AttachedClient(const chi::ShmServerInfo &info) {
    chi::Status st = chi::ShmClientTransport::Connect(info, &transport_);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    chi::GetIpcManager().AttachTransport(transport_.get(), 0);
  }
  ~AttachedClient() {
    chi::GetIpcManager().AttachTransport(nullptr, 0);
    transport_->Close();
  }
  chi::ShmClientTransport &Transport() { return *transport_; }

 private:
  std::unique_ptr<chi::ShmClientTransport> transport_;
};

/** Creates the demo pool through whatever transport is attached. */
chimaera::demo::Client CreateDemoPool() {
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(PoolQuery::Dynamic(), "shm_demo", kPool);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/** An echo task sent through one particular transport (not the attached one). */
chi::Future<chimaera::demo::CustomTask> EchoVia(chi::ShmClientTransport &tr,
                                                const std::string &data) {
  auto *t = chi::NewTask<chimaera::demo::CustomTask>(chi::TaskBuffer(data.data(), data.size()));
  t->pool_id_ = kPool;
  t->pool_query_ = PoolQuery::Local();
  t->method_ = chimaera::demo::Method::kCustom;
  chi::GetIpcManager().Stamp(t);
  REQUIRE(tr.Send(t));
  return chi::Future<chimaera::demo::CustomTask>(t);
}

/** Checks one echo through the attached transport. */
void CheckEcho(chimaera::demo::Client &client, u64 size, u32 seed) {
  const std::string data = Pattern(size, seed);
  auto f = client.AsyncCustom(PoolQuery::Local(), data);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  CHECK(f->data_.size() == size);
  CHECK(f->data_.view() == data);
}

/** A pipe a child writes one byte to when it reached the point the test waits for. */
class ReadyPipe {
 public:
  ReadyPipe() { REQUIRE(pipe(fds_) == 0); }
  ~ReadyPipe() {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  std::string WriteFd() const { return std::to_string(fds_[1]); }
  /** True when the byte arrived within `sec`. */
  bool Wait(double sec) {
    close(fds_[1]);
    fds_[1] = -1;
    pollfd p{fds_[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(sec * 1000)) != 1) return false;
    char c = 0;
    return read(fds_[0], &c, 1) == 1;
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace

TEST_CASE("a pure client echoes 16 B, 64 KiB and 4 MiB through a 256 KiB ring") {
  const u32 port = TestPort(0);
  RuntimeProcess runtime(port, 256u << 10);
  {
    AttachedClient attached(runtime.Info());
    CHECK(std::string(attached.Transport().Name()) == "shm");
    auto client = CreateDemoPool();
    CheckEcho(client, 16, 1);
    CheckEcho(client, 64u << 10, 2);
    CheckEcho(client, 4u << 20, 3);
    CheckEcho(client, 0, 4);

    chi::ShmServer::Stats stats;
    CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
    CHECK(stats.tasks_served >= 5);

    // A clean stop through the admin pool: the runtime answers, then exits 0.
    chimaera::admin::Client admin;
    auto stop = admin.AsyncStopRuntime(PoolQuery::Local());
    REQUIRE(stop.Wait(30));
    CHECK((stop->GetReturnCode() == 0 || stop->GetReturnCode() == Code(ErrorCode::kShutdown)));
  }
  CHECK(runtime.Join(30) == 0);
  chi::ShmServerInfo gone;
  CHECK(chi::ShmServer::Probe(port, &gone).code() == ErrorCode::kNotFound);
}

TEST_CASE("GpuSubmit, WaitTest, LargeOutput, errors and fire-and-forget over shm") {
  RuntimeProcess runtime(TestPort(1));
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();

  auto g = client.AsyncGpuSubmit(PoolQuery::Local(), 0, 42);
  REQUIRE(g.Wait(30));
  CHECK(g->GetReturnCode() == 0);
  CHECK(g->result_value_ == 84);
  for (u32 v = 100; v <= 104; ++v) {
    auto f = client.AsyncGpuSubmit(PoolQuery::Local(), v - 100, v);
    REQUIRE(f.Wait(30));
    CHECK(f->result_value_ == v * 2 + (v - 100));
  }

  auto w = client.AsyncWaitTest(PoolQuery::Local(), 5);
  REQUIRE(w.Wait(30));
  CHECK(w->GetReturnCode() == 0);
  CHECK(w->current_depth_ == 5);

  auto big = client.AsyncLargeOutput(PoolQuery::Local(), 1u << 20);
  REQUIRE(big.Wait(30));
  REQUIRE(big->GetReturnCode() == 0);
  REQUIRE(big->data_.size() == (1u << 20));
  u64 mismatches = 0;
  for (u64 i = 0; i < big->data_.size(); ++i) {
    if (static_cast<unsigned char>(big->data_.data()[i]) != i % 256) ++mismatches;
  }
  CHECK(mismatches == 0);

  chimaera::demo::Client ghost(chi::PoolId(999, 7));
  auto unknown_pool = ghost.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(unknown_pool.Wait(30));
  CHECK(unknown_pool->GetReturnCode() == Code(ErrorCode::kUnknownPool));
  CHECK(std::string(unknown_pool->GetMessage()).find("999.7") != std::string::npos);

  auto *bad = chi::NewTask<chimaera::demo::CustomTask>();
  bad->pool_id_ = kPool;
  bad->pool_query_ = PoolQuery::Local();
  bad->method_ = 77;
  auto unknown_method = chi::GetIpcManager().Send(bad);
  REQUIRE(unknown_method.Wait(30));
  CHECK(unknown_method->GetReturnCode() == Code(ErrorCode::kUnknownMethod));

  chi::ShmServer::Stats before;
  REQUIRE(chi::ShmServer::ProbeStats(TestPort(1), &before).ok());
  for (int i = 0; i < 100; ++i) client.CustomFireAndForget(PoolQuery::Local(), "fire");
  CheckEcho(client, 100, 6);
  chi::ShmServer::Stats after;
  auto served_all = [&](const auto &s) { return s.tasks_served >= before.tasks_served + 101; };
  CHECK(AwaitStats(TestPort(1), served_all, 10, &after));
  const auto t0 = Clock::now();
  while (attached.Transport().Outstanding() != 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(attached.Transport().Outstanding() == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
}

TEST_CASE("four client processes send 10^4 tasks each at once and every answer is right") {
  const u32 port = TestPort(2);
  RuntimeProcess runtime(port);
  {
    AttachedClient attached(runtime.Info());
    CreateDemoPool();
  }
  std::vector<pid_t> clients;
  for (u32 k = 0; k < 4; ++k) {
    clients.push_back(chi_test::SpawnChild(
        "shm_load_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_CLIENT_ID", std::to_string(k)}}));
  }
  for (pid_t pid : clients) CHECK(chi_test::WaitChild(pid, 120) == 0);
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 0; }, 10, &stats));
  CHECK(stats.tasks_served >= 40000);
  CHECK(stats.reclaimed_clients == 0);
  CHECK(stats.broken_streams == 0);
}

TEST_CASE("a client SIGKILLed mid-stream is reclaimed; other clients keep being served") {
  const u32 port = TestPort(3);
  RuntimeProcess runtime(port);
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
  const u64 reclaimed_before = stats.reclaimed_clients;

  SUBCASE("killed with a task in flight and 64 KiB of a 4 MiB request in its ring") {
    ReadyPipe ready;
    pid_t pid = chi_test::SpawnChild(
        "shm_dying_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_READY_FD", ready.WriteFd()}});
    REQUIRE(ready.Wait(30));
    // The runtime holds the partial request while the client lives.
    auto holds_partial = [](const auto &s) {
      return s.clients == 2 && s.bytes_in_use >= (64u << 10);
    };
    CHECK(AwaitStats(port, holds_partial, 10, &stats));
    kill(pid, SIGKILL);
    CHECK(chi_test::WaitChild(pid, 30) == 128 + SIGKILL);
  }
  SUBCASE("killed at a random point while streaming 4 MiB echoes") {
    ReadyPipe ready;
    pid_t pid = chi_test::SpawnChild(
        "shm_streaming_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_READY_FD", ready.WriteFd()}});
    REQUIRE(ready.Wait(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    kill(pid, SIGKILL);
    CHECK(chi_test::WaitChild(pid, 30) == 128 + SIGKILL);
  }

  // Reclaiming the slot and returning the dead client's buffers are separate steps: wait
  // (bounded) for both; memory still held after 20 s is a leak and fails here.
  CHECK(AwaitStats(port,
                   [&](const auto &s) {
                     return s.reclaimed_clients == reclaimed_before + 1 && s.clients == 1 &&
                            s.bytes_in_use == 0;
                   },
                   20, &stats));
  CHECK(stats.bytes_in_use == 0);
  CheckEcho(client, 4u << 20, 7);  // the surviving client
  CHECK(chi_test::RunChild("shm_echo_client", {{"CHI_TEST_SHM_PORT", std::to_string(port)}}, 60) ==
        0);
  CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
}

TEST_CASE("a pending Wait returns kPeerDead when the runtime dies; a new runtime takes the port") {
  const u32 port = TestPort(4);
  auto runtime = std::make_unique<RuntimeProcess>(port);
  {
    AttachedClient attached(runtime->Info());
    auto client = CreateDemoPool();
    auto held = client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                     30000000000ull);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(held.IsComplete());
    CHECK(runtime->Kill() == 128 + SIGKILL);
    REQUIRE(held.Wait(5));  // the client notices the dead runtime within the wait's timeout
    CHECK(held->GetReturnCode() == Code(ErrorCode::kPeerDead));
    CHECK(std::string(held->GetMessage()).find("died") != std::string::npos);

    auto late = client.AsyncCustom(PoolQuery::Local(), "late");
    REQUIRE(late.Wait(5));
    CHECK(late->GetReturnCode() == Code(ErrorCode::kPeerDead));
    CHECK(attached.Transport().Failure() == ErrorCode::kPeerDead);
  }
  // The dead runtime's segment is still there: probes and connects say so.
  chi::ShmServerInfo stale;
  CHECK(chi::ShmServer::Probe(port, &stale).code() == ErrorCode::kPeerDead);
  std::unique_ptr<chi::ShmClientTransport> refused;
  chi::ShmServerInfo old_info = runtime->Info();
  CHECK(chi::ShmClientTransport::Connect(old_info, &refused).code() == ErrorCode::kPeerDead);

  // A new runtime replaces the stale segment and serves as before.
  runtime = std::make_unique<RuntimeProcess>(port);
  CHECK(runtime->Info().runtime_pid != old_info.runtime_pid);
  AttachedClient attached(runtime->Info());
  auto client = CreateDemoPool();
  CheckEcho(client, 1000, 8);
}

TEST_CASE("bad bytes in a request ring reset only that client's slot") {
  const u32 port = TestPort(5);
  RuntimeProcess runtime(port);
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));

  auto connect = [&] {
    std::unique_ptr<chi::ShmClientTransport> tr;
    chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &tr);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    return tr;
  };
  auto request_ring = [](chi::ShmClientTransport &tr) {
    return tr.Segment().RequestStream(tr.SlotIndex());
  };
  auto wake_runtime = [](chi::ShmClientTransport &tr) {
    tr.Segment().Header()->server_event_.Notify();
  };

  // A message that announces 1 GiB, beyond the runtime's 64 MiB limit.
  auto huge = connect();
  char head[16] = {};
  request_ring(*huge)->WritePiece(true, 1ull << 30, head, sizeof(head));
  wake_runtime(*huge);
  auto after_huge = EchoVia(*huge, "after the huge prefix");
  REQUIRE(after_huge.Wait(10));
  CHECK(after_huge->GetReturnCode() == Code(ErrorCode::kTooLarge));
  CHECK(huge->Failure() == ErrorCode::kTooLarge);
  CheckEcho(client, 5000, 10);

  // Bytes that are no record at all.
  auto garbage = connect();
  std::vector<char> junk(96, static_cast<char>(0xAB));
  request_ring(*garbage)->PublishUnframed(junk.data(), junk.size());
  wake_runtime(*garbage);
  auto after_junk = EchoVia(*garbage, "after the junk");
  REQUIRE(after_junk.Wait(10));
  CHECK(after_junk->GetReturnCode() == Code(ErrorCode::kMalformed));
  CheckEcho(client, 5000, 11);

  // A well-framed message whose content is garbage: an error answer, and the slot lives on.
  auto framed = connect();
  std::vector<char> nonsense(200, static_cast<char>(0x5A));
  request_ring(*framed)->WritePiece(true, nonsense.size(), nonsense.data(), nonsense.size());
  wake_runtime(*framed);
  const auto t0 = Clock::now();
  while (framed->StrayAnswers() == 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(framed->StrayAnswers() == 1);  // the error answer names no task of ours
  auto still_ok = EchoVia(*framed, "still served");
  REQUIRE(still_ok.Wait(10));
  CHECK(still_ok->GetReturnCode() == 0);
  CHECK(still_ok->data_.view() == "still served");
  CHECK(framed->Failure() == ErrorCode::kOk);

  REQUIRE(chi::ShmServer::ProbeStats(port, &stats).ok());
  CHECK(stats.broken_streams == 2);
  huge->Close();
  garbage->Close();
  framed->Close();
  CHECK(AwaitStats(port, [](const auto &s) { return s.reclaimed_clients == 2 && s.clients == 1; },
                   10, &stats));
  CheckEcho(client, 1u << 20, 12);
}

TEST_CASE("Connect, Start and Close fail with clear errors and free what they hold") {
  const u32 port = TestPort(6);
  chi::ShmServerInfo missing{chi::ShmSegmentName(port), 1u << 20, chi::kShmTransportVersion, port,
                             1};
  std::unique_ptr<chi::ShmClientTransport> tr;
  CHECK(chi::ShmClientTransport::Connect(missing, &tr).code() == ErrorCode::kNotFound);

  RuntimeProcess runtime(port);
  struct stat st {};
  const std::string os_name =
      "/dev/shm" + chi::PosixShmBackend::OsName(chi::ShmSegmentName(port));
  REQUIRE(stat(os_name.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  chi::ShmServerInfo wrong_version = runtime.Info();
  wrong_version.version += 1;
  chi::Status s = chi::ShmClientTransport::Connect(wrong_version, &tr);
  CHECK(s.code() == ErrorCode::kVersionMismatch);
  CHECK(std::string(s.message()).find("version") != std::string::npos);
  chi::ShmServerInfo wrong_size = runtime.Info();
  wrong_size.size += 4096;
  s = chi::ShmClientTransport::Connect(wrong_size, &tr);
  CHECK(s.code() == ErrorCode::kSizeMismatch);
  CHECK(tr == nullptr);

  // A second runtime on a live runtime's port is refused and names the owner.
  chi::RequestDispatcher no_runtime(nullptr, nullptr);
  chi::ShmServer second;
  s = second.Start(&no_runtime, chi::ShmServer::Options{}, port);
  CHECK(s.code() == ErrorCode::kAlreadyExists);
  CHECK(std::string(s.message()).find(std::to_string(runtime.Pid())) != std::string::npos);

  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  REQUIRE(chi::ShmClientTransport::Connect(runtime.Info(), &tr).ok());
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &x) { return x.clients == 2; }, 10, &stats));
  auto *hold = chi::NewTask<chimaera::demo::LockHoldTask>(chimaera::demo::LockMode::kRead,
                                                          30000000000ull, 0u);
  hold->pool_id_ = kPool;
  hold->pool_query_ = PoolQuery::Local();
  hold->method_ = chimaera::demo::Method::kLockHold;
  chi::GetIpcManager().Stamp(hold);
  REQUIRE(tr->Send(hold));
  chi::Future<chimaera::demo::LockHoldTask> held(hold);
  CHECK_FALSE(held.Wait(0.05f));
  tr->Close();
  REQUIRE(held.Wait(1));
  CHECK(held->GetReturnCode() == Code(ErrorCode::kShutdown));
  auto *after = chi::NewTask<chimaera::demo::CustomTask>();
  CHECK_FALSE(tr->Send(after));
  chi::DeleteTask(after);
  CHECK(AwaitStats(port, [](const auto &x) { return x.clients == 1; }, 10, &stats));
  CheckEcho(client, 64, 13);
}

TEST_CASE("awake workers take requests in themselves; once they park the poller serves again") {
  const u32 port = TestPort(0);  // the first test's runtime is gone by now
  RuntimeProcess runtime(port);
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  // Back to back: the worker that ran one task still polls when the next request lands.
  // A loaded machine may deschedule the worker now and then, so keep going (bounded)
  // until at least one request was taken in by a worker.
  chi::ShmServer::Stats stats;
  const auto start = Clock::now();
  u32 sent = 0;
  do {
    for (u32 i = 0; i < 200; ++i, ++sent) CheckEcho(client, 16, 100 + sent % 200);
    REQUIRE(chi::ShmServer::ProbeStats(port, &stats).ok());
  } while (stats.worker_taken == 0 && SecondsSince(start) < 20);
  CHECK(stats.worker_taken > 0);
  CHECK(stats.worker_taken <= stats.tasks_served);

  // Idle workers park and clear their bits, so clients wake the poller again.
  const chi::ShmSegmentHeader *header = attached.Transport().Segment().Header();
  auto readers = [&] { return header->worker_readers_.Load(chi::MemOrder::kSeqCst); };
  const auto t0 = Clock::now();
  while (readers() != 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(readers() == 0);
  // Requests sent while nobody polls the rings are still served (by the poller, or by a
  // worker it woke), whatever their size.
  for (u32 i = 0; i < 20; ++i) {
    CheckEcho(client, i % 2 == 0 ? 16 : 300000, 400 + i);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  chi::ShmServer::Stats after;
  REQUIRE(chi::ShmServer::ProbeStats(port, &after).ok());
  CHECK(after.tasks_served == stats.tasks_served + 20);
}

TEST_CASE("round trip of a 16 B task over shm, printed next to a two-process shm ping-pong") {
  // The floor: two processes bouncing a counter through one shared page.
  constexpr u32 kRounds = 200000;
  auto *page = static_cast<char *>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(page != MAP_FAILED);
  auto *ping = new (page) chi::Atomic<u64>(0);
  auto *pong = new (page + 256) chi::Atomic<u64>(0);
  pid_t pid = fork();
  if (pid == 0) {
    for (u64 i = 1; i <= kRounds; ++i) {
      for (u64 spins = 0; ping->Load(chi::MemOrder::kAcquire) != i; ++spins) {
        if (spins > (1ull << 32)) _exit(1);
        chi::CpuRelax();
      }
      pong->Store(i, chi::MemOrder::kRelease);
    }
    _exit(0);
  }
  std::vector<double> floor_ns;
  auto t = Clock::now();
  for (u64 i = 1; i <= kRounds; ++i) {
    ping->Store(i, chi::MemOrder::kRelease);
    while (pong->Load(chi::MemOrder::kAcquire) != i) chi::CpuRelax();
    if (i % 1000 == 0) {
      auto now = Clock::now();
      floor_ns.push_back(std::chrono::duration<double, std::nano>(now - t).count() / 1000);
      t = now;
    }
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  munmap(page, 4096);

  RuntimeProcess runtime(TestPort(7));
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  auto measure = [&](auto submit) {
    std::vector<double> samples;
    for (int batch = 0; batch < 40; ++batch) {
      auto t0 = Clock::now();
      for (int i = 0; i < 250; ++i) submit(i);
      samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 250);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
  };
  u32 wrong = 0;
  const std::string data(16, 'q');
  auto echo = [&](int) {
    auto f = client.AsyncCustom(PoolQuery::Local(), data);
    if (!f.Wait(10) || f->data_.size() != 16) ++wrong;
  };
  auto gpu = [&](int i) {
    auto f = client.AsyncGpuSubmit(PoolQuery::Local(), 1, static_cast<u32>(i));
    if (!f.Wait(10) || f->result_value_ != static_cast<u32>(i) * 2 + 1) ++wrong;
  };
  measure(echo);  // warm-up
  const double echo_ns = measure(echo);
  const double gpu_ns = measure(gpu);
  std::sort(floor_ns.begin(), floor_ns.end());
  const double floor = floor_ns[floor_ns.size() / 2];
  MESSAGE("shm round trip (median of 40 x 250): Custom 16 B " << echo_ns << " ns, GpuSubmit "
          << gpu_ns << " ns | two-process shm ping-pong " << floor << " ns | ratio "
          << echo_ns / floor << " / " << gpu_ns / floor << " | answers delivered by waiting "
          << "callers: " << attached.Transport().HelpedAnswers());
  CHECK(wrong == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
}

namespace {
/** A wait helper for the tests below: counts its runs and completes one task. */
struct CountingHelper {
  chi::Atomic<u32> runs;
  chi::Atomic<u32> inside;           ///< runs in progress
  chi::Atomic<u64> to_complete{0};   ///< a Task* to complete on the next run
  u64 hold_ns = 0;                   ///< how long each run lasts

  static void Run(void *ctx) {
    auto *h = static_cast<CountingHelper *>(ctx);
    h->inside.FetchAdd(1, chi::MemOrder::kSeqCst);
    h->runs.FetchAdd(1, chi::MemOrder::kSeqCst);
    if (u64 t = h->to_complete.Exchange(0, chi::MemOrder::kAcqRel)) {
      chi::CompleteTask(reinterpret_cast<chi::Task *>(t));
    }
    const auto until = Clock::now() + std::chrono::nanoseconds(h->hold_ns);
    while (Clock::now() < until) chi::CpuRelax();
    h->inside.FetchSub(1, chi::MemOrder::kSeqCst);
  }
};

/** A task only the test completes (never sent anywhere). */
chi::Future<chimaera::demo::CustomTask> LocalTask() {
  return chi::Future<chimaera::demo::CustomTask>(
      chi::NewTask<chimaera::demo::CustomTask>(chi::TaskBuffer("x", 1)));
}
}  // namespace

TEST_CASE("a thread spinning in Future::Wait runs every installed wait helper, up to four") {
  CountingHelper counting;
  chi::WaitHelper helper(&CountingHelper::Run, &counting);
  REQUIRE(chi::WaitHelper::Install(&helper));
  CountingHelper other_counting;  // a second owner (a GPU client beside a transport)
  chi::WaitHelper other(&CountingHelper::Run, &other_counting);
  REQUIRE(chi::WaitHelper::Install(&other));

  // Nobody but the first helper completes this task: Wait returns only because it ran.
  auto f = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(f.get()), chi::MemOrder::kRelease);
  CHECK(f.Wait(10));
  CHECK(counting.runs.Load() >= 1);
  // The second helper completes the next one (the first has nothing to complete).
  auto g = LocalTask();
  other_counting.to_complete.Store(reinterpret_cast<u64>(g.get()), chi::MemOrder::kRelease);
  CHECK(g.Wait(10));
  CHECK(other_counting.runs.Load() >= 1);

  // Four slots: two more fit, a fifth does not.
  CountingHelper spare_counting;
  chi::WaitHelper spare1(&CountingHelper::Run, &spare_counting);
  chi::WaitHelper spare2(&CountingHelper::Run, &spare_counting);
  chi::WaitHelper spare3(&CountingHelper::Run, &spare_counting);
  REQUIRE(chi::WaitHelper::Install(&spare1));
  REQUIRE(chi::WaitHelper::Install(&spare2));
  CHECK_FALSE(chi::WaitHelper::Install(&spare3));
  chi::WaitHelper::Remove(&spare3);  // not installed: changes nothing
  chi::WaitHelper::Remove(&spare1);
  chi::WaitHelper::Remove(&spare2);

  chi::WaitHelper::Remove(&other);  // the first keeps running
  auto k = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(k.get()), chi::MemOrder::kRelease);
  CHECK(k.Wait(10));

  chi::WaitHelper::Remove(&helper);
  const u32 runs = counting.runs.Load();
  auto h = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(h.get()), chi::MemOrder::kRelease);
  CHECK_FALSE(h.Wait(0.01f));  // no helper any more, so nothing completes it
  CHECK(counting.runs.Load() == runs);
  chi::CompleteTask(h.get());
  CHECK(h.Wait(1));
  REQUIRE(chi::WaitHelper::Install(&other));  // the slots are free again
  chi::WaitHelper::Remove(&other);
}

TEST_CASE("removing a wait helper waits for the threads running it") {
  CountingHelper counting;
  counting.hold_ns = 200000;
  chi::WaitHelper helper(&CountingHelper::Run, &counting);
  REQUIRE(chi::WaitHelper::Install(&helper));
  chi::Atomic<u32> stop;
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i) {
    spinners.emplace_back([&] {
      while (stop.Load(chi::MemOrder::kAcquire) == 0) chi::WaitHelper::Run();
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (counting.runs.Load() < 4 && Clock::now() < deadline) std::this_thread::yield();
  REQUIRE(counting.runs.Load() >= 4);
  for (int round = 0; round < 20; ++round) {
    chi::WaitHelper::Remove(&helper);
    CHECK(counting.inside.Load() == 0);  // nobody is inside once Remove returns
    const u32 runs = counting.runs.Load();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(counting.runs.Load() == runs);  // and nobody starts again
    REQUIRE(chi::WaitHelper::Install(&helper));
    const u32 before = counting.runs.Load();
    while (counting.runs.Load() == before && Clock::now() < deadline) std::this_thread::yield();
  }
  chi::WaitHelper::Remove(&helper);
  stop.Store(1, chi::MemOrder::kRelease);
  for (auto &t : spinners) t.join();
  CHECK(counting.inside.Load() == 0);
}

TEST_CASE("threads waiting at once deliver each other's answers and every task gets its own") {
  RuntimeProcess runtime(TestPort(1));  // that test's runtime is gone by now
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  constexpr u32 kThreads = 4;
  constexpr u32 kRounds = 1500;
  chi::Atomic<u32> wrong;
  std::vector<std::thread> threads;
  for (u32 id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      for (u32 i = 0; i < kRounds; ++i) {
        const std::string data = Pattern(16 + (i % 3) * 1000, id * 100000 + i);
        auto f = client.AsyncCustom(PoolQuery::Local(), data);
        auto g = client.AsyncGpuSubmit(PoolQuery::Local(), id, i);
        const bool ok = f.Wait(30) && f->GetReturnCode() == 0 && f->data_.view() == data &&
                        g.Wait(30) && g->GetReturnCode() == 0 && g->result_value_ == i * 2 + id;
        if (!ok) wrong.FetchAdd(1, chi::MemOrder::kRelaxed);
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(wrong.Load() == 0);
  CHECK(attached.Transport().Outstanding() == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
  CHECK(attached.Transport().Failure() == ErrorCode::kOk);
  MESSAGE("answers delivered by waiting callers: " << attached.Transport().HelpedAnswers()
          << " of " << 2 * kThreads * kRounds);
}
