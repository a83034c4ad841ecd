// Shared parts of the shared-memory transport tests (test_shm_transport*.cc): the runtime
// child process a test binary re-executes itself as, the parent's view of that runtime and
// of this process as its client, and helpers that poll its counters and check echoes.
// Included by one file per binary.
#pragma once

#include <doctest/doctest.h>
#include <poll.h>       // waiting for a child's ready byte
#include <signal.h>     // SIGKILL
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: children never outlive the test
#include <unistd.h>     // getpid, pipe, read, write

#include <chrono>   // deadlines and timing
#include <cstdio>   // fprintf in child routines
#include <cstdlib>  // getenv, strtoul
#include <memory>   // the client transports
#include <string>   // payloads, env values
#include <thread>   // sleep_for while polling from tests

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // the child runtime serves the demo module
#include <chi/transport/shm_transport.h>

#include "child_process.h"
#include "test_ports.h"

namespace shm_test {

using chi::ErrorCode;
using chi::PoolQuery;
using chi::u32;
using chi::u64;
using Clock = std::chrono::steady_clock;

/** The demo pool every test creates through its runtime. */
inline constexpr chi::PoolId kPool(300, 0);

/** An ErrorCode as the u32 a task's return code holds. */
inline u32 Code(ErrorCode c) { return static_cast<u32>(c); }

/** Reads an integer environment variable of a child routine. */
inline u32 EnvU32(const char *name, u32 fallback) {
  const char *v = std::getenv(name);
  return v == nullptr ? fallback : static_cast<u32>(std::strtoul(v, nullptr, 10));
}

/** Reads a 64-bit integer environment variable of a child routine. */
inline u64 EnvU64(const char *name, u64 fallback) {
  const char *v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoull(v, nullptr, 10);
}

/** Port k (< 8) of this test process, so parallel runs never share a segment (test_ports.h). */
inline u32 TestPort(u32 k) { return chi_test::kShmTransportPorts.Port(k); }

/** Seconds elapsed since t0 (bounds the polling loops). */
inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/** Bytes that differ per size and seed, so a mixed-up answer cannot pass. */
inline std::string Pattern(u64 size, u32 seed) {
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
inline bool AwaitRuntime(u32 port, double sec, chi::ShmServerInfo *info, pid_t expect_pid = 0) {
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
inline void DieWithParent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

/** Name of the test runtime's client (role "cdata") or runtime ("rdata") data segment. */
inline std::string DataSegmentName(u32 port, const char *role) {
  return chi::RuntimeSegmentName(port, role);
}

/**
 * A runtime serving shm clients on CHI_TEST_SHM_PORT until StopRuntime (or a kill). With
 * CHI_TEST_SHM_DATA = n it also shares two data segments of n bytes (8 slots share each).
 */
inline int RuntimeMain() {
  DieWithParent();
  const u32 port = EnvU32("CHI_TEST_SHM_PORT", 0);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 2;
  chi::Chimaera &rt = chi::Chimaera::Get();
  chi::RequestDispatcher dispatcher(rt.Pools(), rt.Orchestrator());
  chi::ShmServer server;
  chi::ShmServer::Options o;
  o.num_slots = EnvU32("CHI_TEST_SHM_SLOTS", 8);
  o.ring_bytes = EnvU32("CHI_TEST_SHM_RING", 256u << 10);
  o.max_message_bytes = EnvU64("CHI_TEST_SHM_MAX_MESSAGE", 64ull << 20);
  chi::PosixShmBackend data[2];
  if (const u32 data_bytes = EnvU32("CHI_TEST_SHM_DATA", 0); data_bytes != 0) {
    const char *roles[2] = {"cdata", "rdata"};
    for (int k = 0; k < 2; ++k) {
      chi::Status made = data[k].Create(DataSegmentName(port, roles[k]), data_bytes,
                                        chi::CreateMode::kReplace);
      if (!made.ok()) {
        std::fprintf(stderr, "shm runtime: %s\n", made.ToString().c_str());
        return 3;
      }
    }
    o.request_data_segment = DataSegmentName(port, roles[0]);
    o.answer_data_segment = DataSegmentName(port, roles[1]);
  }
  chi::Status st = server.Start(&dispatcher, o, port);
  if (!st.ok()) {
    std::fprintf(stderr, "shm runtime: %s\n", st.ToString().c_str());
    return 3;
  }
  rt.WaitForStop();
  server.Stop();
  for (chi::PosixShmBackend &d : data) {
    if (d.IsAttached()) (void)d.Destroy();
  }
  chi::CHIMAERA_FINALIZE();
  return 0;
}
inline chi_test::ChildRoutine kRuntimeRoutine("shm_runtime", RuntimeMain);

/** Connects this process to the runtime of CHI_TEST_SHM_PORT as a pure client. */
inline std::unique_ptr<chi::ShmClientTransport> ConnectFromChild(chi_test::ChildChecks *checks) {
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

// ---- Parent-side fixtures ----

/** A runtime child process on `port`; killed (and its segment removed) at scope exit. */
class RuntimeProcess {
 public:
  /**
   * data_bytes: the size of each data segment (0: none; large messages then stream);
   * slots: the client slots it serves; server_conf: a configuration file for the runtime
   * (CHI_SERVER_CONF; "" for the defaults); max_message: the largest message it takes.
   */
  explicit RuntimeProcess(u32 port, u32 ring_bytes = 256u << 10, u32 data_bytes = 0,
                          u32 slots = 8, const std::string &server_conf = "",
                          u64 max_message = 64ull << 20)
      : port_(port), data_bytes_(data_bytes) {
    pid_ = chi_test::SpawnChild("shm_runtime",
                                {{"CHI_TEST_SHM_PORT", std::to_string(port)},
                                 {"CHI_TEST_SHM_RING", std::to_string(ring_bytes)},
                                 {"CHI_TEST_SHM_DATA", std::to_string(data_bytes)},
                                 {"CHI_TEST_SHM_SLOTS", std::to_string(slots)},
                                 {"CHI_TEST_SHM_MAX_MESSAGE", std::to_string(max_message)},
                                 {"CHI_SERVER_CONF", server_conf}});
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
    if (data_bytes_ != 0) {  // this test's runtime made them (a killed one leaves them)
      for (const char *role : {"cdata", "rdata"}) {
        (void)chi::PosixShmBackend::DestroyByName(DataSegmentName(port_, role));
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
  u32 data_bytes_;
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
inline chimaera::demo::Client CreateDemoPool() {
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(PoolQuery::Dynamic(), "shm_demo", kPool);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/** An echo task sent through one particular transport (not the attached one). */
inline chi::Future<chimaera::demo::CustomTask> EchoVia(chi::ShmClientTransport &tr,
                                                       const std::string &data) {
  auto *t = chi::NewTask<chimaera::demo::CustomTask>(chi::TaskBuffer(data.data(), data.size()));
  t->pool_id_ = kPool;
  t->pool_query_ = PoolQuery::Local();
  t->method_ = chimaera::demo::Method::kCustom;
  chi::GetIpcManager().Stamp(t);
  REQUIRE(tr.Send(t));
  return chi::Future<chimaera::demo::CustomTask>(t);
}

/** Sends one byte on the pipe named by CHI_TEST_READY_FD (a child reached its point). */
inline void SignalReady() {
  int fd = static_cast<int>(EnvU32("CHI_TEST_READY_FD", 0));
  char c = 'r';
  if (write(fd, &c, 1) != 1) std::fprintf(stderr, "ready pipe write failed\n");
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

/** Checks one echo through the attached transport. */
inline void CheckEcho(chimaera::demo::Client &client, u64 size, u32 seed) {
  const std::string data = Pattern(size, seed);
  auto f = client.AsyncCustom(PoolQuery::Local(), data);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  CHECK(f->data_.size() == size);
  CHECK(f->data_.view() == data);
}

}  // namespace shm_test
