// A pure client process (CHIMAERA_INIT(kClient, false), built with CUDA) and a standalone
// runtime with a GPU in a child process (fork + exec of this binary with --server): Local()
// through the CPU transport, the handshake's GPU queue attachment, LocalGpuBcast/ToLocalGpu
// straight into the attached cpu2gpu queue (no CPU transport hop), RegisterMemory of device
// memory (and of host memory, copied by the kernel) read back by the runtime, bad input, a client killed holding cpu2gpu slots, a forked
// child, and GPU-route tasks sent through the CPU transport once the direct route is detached.
// Label gpu; without a GPU it prints "skipped: no GPU" and exits 77.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/gpu/gpu_manager.h>
#include <chi/gpu/host_slots.h>
#include <chi/gpu/orchestrator.h>
#include <chi/mods/admin/admin_client.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>
#include <chi/runtime/chimaera.h>

#include "../child_process.h"  // ForkAndExit: a forked child's checks

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

namespace {

using chi::u32;
using chi::u64;

const chi::PoolId kPool(430, 0);
constexpr float kWaitSec = 30;
constexpr u32 kBlocks = 1;
constexpr u32 kThreads = 64;
constexpr u32 kDepth = 64;
pid_t g_server = 0;

/** Waits (bounded) for a child; its exit code, 128 + signal, or -1 when it had to be killed. */
int WaitChild(pid_t pid, int timeout_ms) {
  int status = 0;
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

/** This binary again, with one argument naming its role. */
pid_t Spawn(const char *role) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "test_gpu_client_process", role, nullptr);
    _exit(127);
  }
  return pid;
}

/** Sum of the request counters of the runtime's CPU transports (Monitor). */
u64 TransportRequests() {
  auto f = chimaera::admin::Client().AsyncMonitor(chi::PoolQuery::Local());
  REQUIRE(f.Wait(kWaitSec));
  REQUIRE(f->GetReturnCode() == 0);
  u64 n = 0;
  for (const auto &t : f->Decode().transports_) n += t.requests_;
  return n;
}

const chi::gpu::GpuClientQueues &Attached() { return CHI_IPC->ClientQueues(); }

}  // namespace

TEST_CASE("client process: Local() GpuSubmit runs the runtime's CPU handler: 42 -> 84") {
  chimaera::demo::Client client(kPool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 42);
  REQUIRE(f.Wait(kWaitSec));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->result_value_ == 84);
}

TEST_CASE("client process: five Local() GpuSubmits 100..104 all come back right") {
  chimaera::demo::Client client(kPool);
  for (u32 v = 100; v <= 104; ++v) {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, v);
    REQUIRE(f.Wait(kWaitSec));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->result_value_ == v * 2);
  }
}

TEST_CASE("client process: the handshake attached the runtime's GPU queues (slot counts match)") {
  REQUIRE(Attached().NumGpus() >= 1);
  chi::gpu::GpuQueueConfig qc;
  qc.server_threads = kBlocks * kThreads;
  qc.depth = kDepth;
  u32 c2g = 0, g2g = 0, g2c = 0;
  chi::gpu::GpuQueueSet::Geometry(qc, &c2g, &g2g, &g2c);
  CHECK(Attached().Info(0).cpu2gpu_slots == c2g);
  CHECK(Attached().Info(0).gpu2gpu_slots == g2g);
  CHECK(Attached().Info(0).gpu2cpu_slots == g2c);
  CHECK(Attached().Cpu2Gpu(0).num_slots_ == c2g);
  CHECK(Attached().Cpu2Gpu(0).payload_ != nullptr);
  CHECK(Attached().Pinned(0));  // registered with the driver in this process too
}

TEST_CASE("client process: LocalGpuBcast 77 -> 231 goes straight into the cpu2gpu queue") {
  REQUIRE(Attached().NumGpus() >= 1);
  chimaera::demo::Client client(kPool);
  auto warm = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 1);  // pool set-up
  REQUIRE(warm.Wait(kWaitSec));
  REQUIRE_MESSAGE(warm->GetReturnCode() == 0, warm->GetMessage());
  constexpr u32 kTasks = 10;
  const u64 posted = Attached().Posted();
  const u64 requests = TransportRequests();
  for (u32 i = 0; i < kTasks; ++i) {
    auto f = i % 2 == 0 ? client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77)
                        : client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
    REQUIRE(f.Wait(kWaitSec));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->result_value_ == 231);  // the GPU handler
  }
  // A LocalGpuBcast posts one replica per GPU; ToLocalGpu(0) posts one.
  CHECK(Attached().Posted() - posted == kTasks / 2 * Attached().NumGpus() + kTasks / 2);
  // Only the two Monitor calls may have crossed the CPU transport, not the ten GPU tasks.
  CHECK(TransportRequests() - requests <= 2);
}

TEST_CASE("client process: RegisterMemory of 4 MiB of device memory; the runtime reads it") {
  constexpr u64 kBytes = 4ull << 20;
  std::vector<char> host(kBytes);
  for (u64 i = 0; i < kBytes; ++i) host[i] = static_cast<char>((i * 7 + 3) % 251);
  char *dev = nullptr;
  REQUIRE(cudaMalloc(&dev, kBytes) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice) == cudaSuccess);
  chi::Status st = CHI_IPC->RegisterMemory(dev, kBytes, chi::gpu::MemoryType::kGpuDeviceMemory);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  chimaera::demo::Client client(kPool);
  auto whole = client.AsyncReadRegistered(chi::PoolQuery::Local(), dev, kBytes);
  REQUIRE(whole.Wait(kWaitSec));
  REQUIRE_MESSAGE(whole->GetReturnCode() == 0, whole->GetMessage());
  CHECK(whole->checksum_ == chimaera::demo::Checksum(host.data(), kBytes));
  u64 first = 0;
  std::memcpy(&first, host.data(), 8);
  CHECK(whole->first_ == first);
  auto part = client.AsyncReadRegistered(chi::PoolQuery::Local(), dev + (1 << 20), 4096);
  REQUIRE(part.Wait(kWaitSec));
  REQUIRE(part->GetReturnCode() == 0);
  CHECK(part->checksum_ == chimaera::demo::Checksum(host.data() + (1 << 20), 4096));
  // A sub-range registered on its own shares the allocation's handle and offset.
  REQUIRE(CHI_IPC->RegisterMemory(dev + 4096, 8192, chi::gpu::MemoryType::kGpuDeviceMemory).ok());
  auto sub = client.AsyncReadRegistered(chi::PoolQuery::Local(), dev + 4096, 8192);
  REQUIRE(sub.Wait(kWaitSec));
  REQUIRE(sub->GetReturnCode() == 0);
  CHECK(sub->checksum_ == chimaera::demo::Checksum(host.data() + 4096, 8192));
  REQUIRE(cudaFree(dev) == cudaSuccess);
}

TEST_CASE("client process: bad RegisterMemory and ReadRegistered input gets clear errors") {
  using chi::gpu::MemoryType;
  CHECK(CHI_IPC->RegisterMemory(nullptr, 16, MemoryType::kGpuDeviceMemory).code() ==
        chi::ErrorCode::kInvalidArgument);
  char *dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 4096) == cudaSuccess);
  CHECK(CHI_IPC->RegisterMemory(dev, 0, MemoryType::kGpuDeviceMemory).code() ==
        chi::ErrorCode::kInvalidArgument);
  CHECK(CHI_IPC->RegisterMemory(dev, 8192, MemoryType::kGpuDeviceMemory).code() ==
        chi::ErrorCode::kInvalidArgument);  // runs past the allocation
  std::vector<char> heap(64);
  const chi::Status not_device =
      CHI_IPC->RegisterMemory(heap.data(), heap.size(), MemoryType::kGpuDeviceMemory);
  CHECK(not_device.code() == chi::ErrorCode::kInvalidArgument);
  CHECK(std::string(not_device.message()).find("not device memory") != std::string::npos);
  // A pure client's heap is copied by the kernel (process_vm_readv), never mapped.
  for (size_t i = 0; i < heap.size(); ++i) heap[i] = static_cast<char>(i + 1);
  REQUIRE(CHI_IPC->RegisterMemory(heap.data(), heap.size(), MemoryType::kCpuMemory).ok());
  chimaera::demo::Client client(kPool);
  auto mine = client.AsyncReadRegistered(chi::PoolQuery::Local(), heap.data(), heap.size());
  REQUIRE(mine.Wait(kWaitSec));
  REQUIRE_MESSAGE(mine->GetReturnCode() == 0, mine->GetMessage());
  CHECK(mine->checksum_ == chimaera::demo::Checksum(heap.data(), heap.size()));
  auto f = client.AsyncReadRegistered(chi::PoolQuery::Local(), dev, 16);  // never registered
  REQUIRE(f.Wait(kWaitSec));
  CHECK(f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kNotFound));
  REQUIRE(cudaFree(dev) == cudaSuccess);
}

TEST_CASE("client process: a client killed holding cpu2gpu slots does not leak them") {
  REQUIRE(Attached().NumGpus() >= 1);
  const auto &q = Attached().Cpu2Gpu(0);
  const pid_t dying = Spawn("--dying-client");
  REQUIRE(dying > 0);
  CHECK(WaitChild(dying, 60000) == 128 + SIGKILL);
  const u32 last = q.num_slots_ - 1;
  // It claimed both before it died (else it would have exited with 5 or 6); the reaper may
  // already have freed them (it looks every 100 ms), but nobody else may hold them.
  for (const u32 s : {last, last - 1}) {
    const u32 owner = chi::gpu::HostSlotOwner(q, s);
    CHECK((owner == static_cast<u32>(dying) || owner == 0));
  }
  bool reaped = false;
  for (int i = 0; i < 2000 && !reaped; ++i) {  // bounded: 10 s (the reaper looks every 100 ms)
    reaped = chi::gpu::HostSlotOwner(q, last) == 0 && chi::gpu::HostSlotOwner(q, last - 1) == 0;
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(reaped);
  const u32 me = static_cast<u32>(getpid());
  REQUIRE(chi::gpu::ClaimHostSlot(q, last, me) == last);  // usable again
  chi::gpu::ReleaseHostSlot(q, last);
  chimaera::demo::Client client(kPool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 5);
  REQUIRE(f.Wait(kWaitSec));
  CHECK(f->result_value_ == 15);
}

// Last: it detaches this process's direct route for good.
TEST_CASE("client process: a forked child leaves the direct route alone and uses the runtime") {
  REQUIRE(Attached().NumGpus() >= 1);
  chimaera::demo::Client client(kPool);
  const int rc = chi_test::ForkAndExit([](chi_test::ChildChecks &checks) {
    checks.Expect(!chi::Chimaera::Get().IsInitialized(), "the child starts uninitialized");
    checks.Expect(Attached().NumGpus() == 0, "the child holds none of the parent's GPU queues");
    if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {
      checks.Expect(false, "the child's CHIMAERA_INIT: " +
                               chi::Chimaera::Get().LastError().ToString());
      return;
    }
    // Pinning the queues would need the driver state the parent holds: no direct route.
    checks.Expect(Attached().NumGpus() == 0, "the child attached no GPU queue");
    chimaera::demo::Client c(kPool);
    auto cpu = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 42);
    checks.Expect(cpu.Wait(kWaitSec) && cpu->GetReturnCode() == 0 && cpu->result_value_ == 84,
                  "the child's Local(): 42 -> 84");
    auto gpu = c.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);
    checks.Expect(gpu.Wait(kWaitSec) && gpu->GetReturnCode() == 0 && gpu->result_value_ == 231,
                  std::string("the child's LocalGpuBcast through the runtime: 77 -> 231: ") +
                      (gpu.IsComplete() ? gpu->GetMessage() : "no answer"));
  });
  // 124: the child hung at exit (before the fix: joining the parent's GPU worker thread).
  CHECK(rc == 0);
  const u64 posted = Attached().Posted();  // the parent's direct route serves on
  for (u32 i = 0; i < 10; ++i) {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
    REQUIRE(f.Wait(kWaitSec));
    CHECK(f->result_value_ == 231);
  }
  CHECK(Attached().Posted() - posted == 10);
}

TEST_CASE("client process: without the direct route, GPU tasks reach the GPU through the runtime") {
  CHI_IPC->DetachClientQueues();
  REQUIRE(Attached().NumGpus() == 0);
  chimaera::demo::Client client(kPool);
  const u64 requests = TransportRequests();
  constexpr u32 kTasks = 4;
  for (u32 i = 0; i < kTasks; ++i) {
    auto f = i % 2 == 0 ? client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77)
                        : client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
    REQUIRE(f.Wait(kWaitSec));
    CHECK_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
    CHECK(f->result_value_ == 231);  // the GPU handler, reached through the runtime
  }
  CHECK(TransportRequests() - requests >= kTasks);  // they crossed the CPU transport
  auto bad = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(99), 0, 1);
  REQUIRE(bad.Wait(kWaitSec));
  CHECK(bad->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kInvalidArgument));
}

namespace {

/** The runtime: serves until StopRuntime (dies with the test). */
int ServerMain() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true)) return 3;
  if (!CHI_IPC->StartError().ok() || CHI_IPC->NumGpus() == 0) {
    std::printf("server: GPU runtime did not start: %s\n", CHI_IPC->StartError().ToString().c_str());
    return 4;
  }
  chi::Chimaera::Get().WaitForStop();
  chi::CHIMAERA_FINALIZE();
  return 0;
}

/** A client that claims the last two cpu2gpu slots, posts in one, and is killed. */
int DyingClientMain() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) return 3;
  if (CHI_IPC->ClientQueues().NumGpus() == 0) return 4;
  const auto &q = CHI_IPC->ClientQueues().Cpu2Gpu(0);
  const u32 me = static_cast<u32>(getpid());
  const u32 last = q.num_slots_ - 1;
  if (chi::gpu::ClaimHostSlot(q, last, me) != last) return 5;
  if (chi::gpu::ClaimHostSlot(q, last - 1, me) != last - 1) return 6;
  q.Post(last, chi::gpu::NextHostSeq(q, last), 0);  // an empty request: answered with an error
  raise(SIGKILL);
  return 7;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::strcmp(argv[1], "--server") == 0) return ServerMain();
  if (argc > 1 && std::strcmp(argv[1], "--dying-client") == 0) return DyingClientMain();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  const std::string port = std::to_string(31000 + getpid() % 2000);
  const std::string conf = "/tmp/chi_gpu_client_test_" + std::to_string(getpid()) + ".yaml";
  if (FILE *f = std::fopen(conf.c_str(), "w")) {
    std::fprintf(f, "gpu:\n  blocks: %u\n  threads_per_block: %u\n  queue_depth: %u\n", kBlocks,
                 kThreads, kDepth);
    std::fclose(f);
  }
  setenv("CHI_SERVER_CONF", conf.c_str(), 1);
  setenv("CHI_PORT", port.c_str(), 1);
  setenv("CHI_CONNECT_TIMEOUT", "60", 1);  // the runtime's GPU start-up takes seconds
  g_server = Spawn("--server");
  setenv("CHI_WITH_RUNTIME", "0", 1);
  int rc = 1;
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {
    std::printf("cannot connect to the runtime\n");
  } else {
    chimaera::demo::Client client;
    auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "gpu_client_process", kPool);
    if (!created.Wait(kWaitSec) || created->GetReturnCode() != 0) {
      std::printf("cannot create the demo pool\n");
    } else {
      doctest::Context context(argc, argv);
      rc = context.run();
    }
    chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local()).Wait(kWaitSec);
    chi::CHIMAERA_FINALIZE();
  }
  const int server_rc = WaitChild(g_server, 30000);
  std::remove(conf.c_str());
  if (server_rc != 0) {
    std::printf("runtime exited with %d\n", server_rc);
    if (rc == 0) rc = 1;
  }
  return rc;
}
