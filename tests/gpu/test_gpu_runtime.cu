// The four GPU routes on a real GPU, in one process with an embedded runtime: CPU Local()
// (CPU handler), a kernel's Local() (GPU handler, gpu2gpu), the CPU's LocalGpuBcast and
// ToLocalGpu (cpu2gpu), a kernel's ToLocalCpu (gpu2cpu); parallel kernels, pause/resume,
// bad input, a kernel that dies holding a slot, a GPU->CPU task spinning on the GPU worker
// while other GPU->CPU requests are served, a forked child. Label gpu; without a GPU it
// prints "skipped: no GPU" and exits 77. Kernels only wait on the orchestrator, never the
// reverse, and the host never synchronises the whole device (the orchestrator never returns).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/gpu/gpu_manager.h>
#include <chi/gpu/orchestrator.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>
#include <chi/runtime/chimaera.h>

#include <chrono>  // the spin's head start
#include <string>
#include <thread>  // sleep_for
#include <vector>

#include "../child_process.h"  // ForkAndExit: a forked child's checks
#include "../spin_probe.h"     // the GPU->CPU task that holds the GPU worker
#include "gpu_test_main.h"      // main: GPU check, runtime, demo pool, doctest

CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

namespace {

using chi::u32;
using chi::u64;
using chimaera::demo::GpuRuntime;
using chimaera::demo::GpuSubmitTask;

const chi::PoolId kPool(420, 0);
constexpr u64 kKernelTimeoutNs = 120000000000ull;
constexpr float kTaskWaitSec = 5;  ///< a kernel's wait for one task; it stops at the first miss

/** Results a test kernel leaves in device memory. */
struct Counters {
  u32 correct;
  u32 wrong;
  u32 value;  ///< thread 0's last result
  u32 rc;     ///< thread 0's last return code (999: empty future)
};

/** Which route a kernel's AsyncGpuSubmit takes. */
enum Route : u32 { kLocal = 0, kToLocalCpu = 1, kToThisGpu = 2 };

/** Every thread submits `count` tasks one after another and checks each answer. */
__global__ void SubmitKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 route, u32 count,
                             u32 base, Counters *c) {
  CHIMAERA_GPU_INIT(info);
  chimaera::demo::Client client(pool);
  const u32 tid = chi::gpu::GlobalThreadId();
  for (u32 i = 0; i < count; ++i) {
    const u32 v = base + tid * count + i;
    const chi::PoolQuery q = route == kToLocalCpu  ? chi::PoolQuery::ToLocalCpu()
                             : route == kToThisGpu ? chi::PoolQuery::ToLocalGpu(info.gpu_id_)
                                                   : chi::PoolQuery::Local();
    auto f = client.AsyncGpuSubmit(q, 0, v);
    const u32 expected = route == kToLocalCpu ? v * 2 : v * 3;
    const bool ok = f.Wait(kTaskWaitSec) && f->GetReturnCode() == 0 && f->result_value_ == expected;
    atomicAdd(ok ? &c->correct : &c->wrong, 1u);
    if (tid == 0) {
      c->value = f.IsValid() ? f->result_value_ : 0;
      c->rc = f.IsValid() ? f->GetReturnCode() : 999;
    }
    if (!ok) return;  // one miss is enough to fail the test; do not wait out the rest
  }
}

/** Four futures outstanding at once per thread, two routes, then every wait. */
__global__ void AsyncKernel(chi::gpu::GpuInfo info, chi::PoolId pool, Counters *c) {
  CHIMAERA_GPU_INIT(info);
  chimaera::demo::Client client(pool);
  auto a = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 1);
  auto b = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalCpu(), 0, 2);
  auto d = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 3);
  auto e = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalCpu(), 0, 4);
  const bool ok = a.Wait(kTaskWaitSec) && b.Wait(kTaskWaitSec) && d.Wait(kTaskWaitSec) &&
                  e.Wait(kTaskWaitSec) && a->result_value_ == 3 && b->result_value_ == 4 &&
                  d->result_value_ == 9 && e->result_value_ == 8;
  atomicAdd(ok ? &c->correct : &c->wrong, 1u);
}

/** A client that dies holding a slot: claims one (and maybe posts) and never gives it back. */
__global__ void DyingKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 post) {
  CHIMAERA_GPU_INIT(info);
  if (post != 0) {
    chi::gpu::StartTask<GpuSubmitTask>(chi::gpu::BlockInfo(), pool, chi::PoolQuery::Local(),
                                       chimaera::demo::Method::kGpuSubmit, 0u, 5u);
  } else {
    u32 last = 0;
    chi::gpu::ClaimSlot(*info.gpu2gpu_, 0, &last);
  }
}

const chi::PoolId kSpinPool(421, 0);

/** What SpinKernel leaves in device memory. */
struct SpinResult {
  u64 end_ns;  ///< when the CPU task let go of its worker
  u32 rc;      ///< its return code (999: no answer)
  u32 role;    ///< the worker that ran it (spin_probe::RoleOf)
};

/** One thread asks the CPU for a SpinTask of spin_ns and waits for it. */
__global__ void SpinKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u64 spin_ns,
                           SpinResult *out) {
  CHIMAERA_GPU_INIT(info);
  auto f = chi::gpu::AsyncSubmit<spin_probe::SpinTask>(pool, chi::PoolQuery::ToLocalCpu(),
                                                       spin_probe::SpinProbe::kSpin, spin_ns);
  const bool done = f.Wait(4 * kTaskWaitSec);
  out->rc = done ? f->GetReturnCode() : 999;
  out->end_ns = done ? f->end_ns_ : 0;
  out->role = done ? f->role_ : 0;
}

/** A user kernel that knows nothing of chi (runs while the orchestrator is paused). */
__global__ void PlainKernel(u32 *x) { atomicAdd(x, 1u); }

/** Device memory and a stream for the tests, made before the runtime starts. */
struct Env {
  cudaStream_t stream = nullptr;
  cudaStream_t spin_stream = nullptr;  ///< SpinKernel's, beside the other kernels
  Counters *counters = nullptr;
  u32 *plain = nullptr;
  SpinResult *spin = nullptr;
};
Env g_env;

/** Runs `launch` on the test stream with fresh counters; returns them (bounded wait). */
template <typename Launch>
Counters Run(Launch launch) {
  Counters host{};
  REQUIRE(cudaMemsetAsync(g_env.counters, 0, sizeof(Counters), g_env.stream) == cudaSuccess);
  launch(g_env.stream);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  chi::Status st = chi::gpu::WaitStream(g_env.stream, kKernelTimeoutNs);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  REQUIRE(cudaMemcpyAsync(&host, g_env.counters, sizeof(host), cudaMemcpyDeviceToHost,
                          g_env.stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(g_env.stream) == cudaSuccess);
  return host;
}

/** Runs SubmitKernel on blocks x threads, `count` tasks per thread. */
Counters Submit(u32 route, u32 blocks, u32 threads, u32 count, u32 base = 0) {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  return Run([&](cudaStream_t s) {
    SubmitKernel<<<blocks, threads, 0, s>>>(info, kPool, route, count, base, g_env.counters);
  });
}

/** The demo GPU container's count of GpuSubmit tasks run on GPU 0. */
u64 GpuSubmits() {
  GpuRuntime state;
  chi::Status st = CHI_IPC->ReadGpuContainer(0, kPool, &state);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return state.gpu_submits_.Load();
}

u32 Rc(chi::ErrorCode c) { return static_cast<u32>(c); }

}  // namespace

TEST_CASE("the CPU's Local() runs the CPU handler: 123 -> 246") {
  chimaera::demo::Client client(kPool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 123);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->result_value_ == 246);
}

TEST_CASE("a kernel's Local() runs the GPU handler: 42 -> 126") {
  const u32 base = 42;
  Counters c = Submit(kLocal, 1, 1, 1, base);
  CHECK(c.rc == 0);
  CHECK(c.value == 126);
  CHECK(c.correct == 1);
}

TEST_CASE("the CPU's LocalGpuBcast and ToLocalGpu(0) run the GPU handler: 77 -> 231") {
  chimaera::demo::Client client(kPool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->result_value_ == 231);
  auto g = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
  REQUIRE(g.Wait(10));
  CHECK(g->result_value_ == 231);
  std::vector<chi::Future<GpuSubmitTask>> many;  // async: many outstanding at once
  for (u32 i = 0; i < 64; ++i)
    many.push_back(client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, i));
  REQUIRE(chi::WaitAll(many, 10));
  u32 right = 0;
  for (u32 i = 0; i < many.size(); ++i) right += many[i]->result_value_ == i * 3;
  CHECK(right == 64);
}

TEST_CASE("a kernel's ToLocalCpu() runs the CPU handler: 88 -> 176") {
  Counters c = Submit(kToLocalCpu, 1, 1, 1, 88);
  CHECK(c.rc == 0);
  CHECK(c.value == 176);
  Counters d = Submit(kToThisGpu, 1, 1, 1, 42);  // ToLocalGpu(this GPU) from a kernel
  CHECK(d.value == 126);
}

TEST_CASE("a kernel's futures can be outstanding together, on both routes") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  Counters c =
      Run([&](cudaStream_t s) { AsyncKernel<<<2, 64, 0, s>>>(info, kPool, g_env.counters); });
  CHECK(c.correct == 128);
  CHECK(c.wrong == 0);
}

TEST_CASE("1000 sequential round trips in every route are all correct") {
  CHECK(Submit(kLocal, 1, 1, 1000).correct == 1000);
  CHECK(Submit(kToLocalCpu, 1, 1, 1000).correct == 1000);
  CHECK(Submit(kToThisGpu, 1, 1, 1000).correct == 1000);
  chimaera::demo::Client client(kPool);
  u32 c2g = 0, local = 0;
  for (u32 i = 0; i < 1000; ++i) {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, i);
    c2g += f.Wait(10) && f->GetReturnCode() == 0 && f->result_value_ == i * 3;
    auto g = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i);
    local += g.Wait(10) && g->GetReturnCode() == 0 && g->result_value_ == i * 2;
    if (c2g + local != 2 * (i + 1)) break;  // stop at the first miss
  }
  CHECK(c2g == 1000);
  CHECK(local == 1000);
}

TEST_CASE("32 and 2048 GPU threads submitting 100 tasks each all get their answers") {
  const u64 before = GpuSubmits();
  Counters small = Submit(kLocal, 1, 32, 100);
  CHECK(small.correct == 3200);
  CHECK(small.wrong == 0);
  Counters big = Submit(kLocal, 8, 256, 100);
  CHECK(big.correct == 204800);
  CHECK(big.wrong == 0);
  CHECK(GpuSubmits() - before == 3200 + 204800);  // the container counted each one once
  Counters cpu = Submit(kToLocalCpu, 1, 32, 100);
  CHECK(cpu.correct == 3200);
  CHECK(cpu.wrong == 0);
}

TEST_CASE("a paused orchestrator frees the GPU for another kernel and resumes serving") {
  chimaera::demo::Client client(kPool);
  REQUIRE(CHI_IPC->PauseGpuOrchestrator().ok());
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
  CHECK_FALSE(f.Wait(0.2f));  // posted, but nobody serves it while paused
  REQUIRE(cudaMemsetAsync(g_env.plain, 0, sizeof(u32), g_env.stream) == cudaSuccess);
  PlainKernel<<<1, 1, 0, g_env.stream>>>(g_env.plain);
  REQUIRE(chi::gpu::WaitStream(g_env.stream, kKernelTimeoutNs).ok());
  u32 plain = 0;
  REQUIRE(cudaMemcpy(&plain, g_env.plain, sizeof(u32), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(plain == 1);
  REQUIRE(CHI_IPC->ResumeGpuOrchestrator().ok());
  REQUIRE(f.Wait(10));
  CHECK(f->result_value_ == 231);
  CHECK(Submit(kLocal, 1, 1, 1, 42).value == 126);
}

TEST_CASE("bad GPU input is answered with an error, and the GPU keeps serving") {
  chimaera::demo::Client client(kPool);
  SUBCASE("ToLocalGpu(99)") {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(99), 0, 1);
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == Rc(chi::ErrorCode::kInvalidArgument));
  }
  SUBCASE("a method with no GPU handler") {
    auto f = client.AsyncCustom(chi::PoolQuery::ToLocalGpu(0), "hi");
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == Rc(chi::ErrorCode::kUnknownMethod));
  }
  SUBCASE("a task larger than the copy space") {
    auto f = client.AsyncCustom(chi::PoolQuery::ToLocalGpu(0), std::string(4000, 'x'));
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == Rc(chi::ErrorCode::kTooLarge));
  }
  SUBCASE("a pool that does not exist") {
    chimaera::demo::Client nowhere(chi::PoolId(999, 0));
    auto f = nowhere.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 1);
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == Rc(chi::ErrorCode::kUnknownPool));
  }
  SUBCASE("malformed bytes reach the orchestrator") {
    std::vector<char> junk(96, '\x7f');
    std::vector<char> answer;
    REQUIRE(CHI_IPC->RawRequest(0, junk.data(), 96, &answer, 10000000000ull).ok());
    chi::Task t;
    chi::DecodeAnswer(&t, answer.data(), answer.size());
    CHECK(t.GetReturnCode() == Rc(chi::ErrorCode::kMalformed));
  }
  SUBCASE("a well-formed request for a pool the GPU does not serve") {
    GpuSubmitTask task(0, 1);
    task.pool_id_ = chi::PoolId(999, 0);
    task.pool_query_ = chi::PoolQuery::ToLocalGpu(0);
    task.method_ = chimaera::demo::Method::kGpuSubmit;
    alignas(16) char buf[256];
    chi::ErrorCode err = chi::ErrorCode::kOk;
    const u32 len = chi::gpu::EncodeRequest(task, 1, buf, sizeof(buf), &err);
    REQUIRE(len > 0);
    std::vector<char> answer;
    REQUIRE(CHI_IPC->RawRequest(0, buf, len, &answer, 10000000000ull).ok());
    chi::Task t;
    chi::DecodeAnswer(&t, answer.data(), answer.size());
    CHECK(t.GetReturnCode() == Rc(chi::ErrorCode::kUnknownPool));
  }
  CHECK(Submit(kLocal, 1, 1, 1, 42).value == 126);
}

TEST_CASE("a kernel that dies holding a slot leaves a reclaimable slot, never a hung GPU") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  u32 held = 0, held_cpu = 0;
  REQUIRE(CHI_IPC->CountHeldSlots(0, &held, &held_cpu).ok());
  REQUIRE(held == 0);
  Run([&](cudaStream_t s) { DyingKernel<<<1, 1, 0, s>>>(info, kPool, 0); });
  Run([&](cudaStream_t s) { DyingKernel<<<1, 1, 0, s>>>(info, kPool, 1); });
  REQUIRE(CHI_IPC->CountHeldSlots(0, &held, &held_cpu).ok());
  CHECK(held == 2);
  CHECK(Submit(kLocal, 1, 32, 10).correct == 320);  // the others probe past them
  REQUIRE(CHI_IPC->ReclaimGpuSlots(0).ok());
  REQUIRE(CHI_IPC->CountHeldSlots(0, &held, &held_cpu).ok());
  CHECK(held == 0);
  CHECK(Submit(kLocal, 1, 32, 10).correct == 320);  // the reclaimed slots serve again
}

TEST_CASE("ToLocalGpu(1) reaches the second GPU when there is one") {
  if (CHI_IPC->NumGpus() < 2) {
    MESSAGE("one GPU: ToLocalGpu(1) is an error here");
    chimaera::demo::Client client(kPool);
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(1), 0, 77);
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == Rc(chi::ErrorCode::kInvalidArgument));
    return;
  }
  chimaera::demo::Client client(kPool);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(1), 1, 77);
  REQUIRE(f.Wait(10));
  CHECK(f->result_value_ == 232);
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 0);  // reaching GPU 1 did not move this thread off its own GPU
  auto g = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);  // every GPU
  REQUIRE(g.Wait(10));
  CHECK(g->result_value_ == 231);
}

TEST_CASE("a GPU->CPU task spinning on the GPU worker does not hold up other GPU->CPU requests") {
  // The GPU worker runs the tasks of gpu2cpu requests itself; one that never yields holds it
  // for its whole length. Meanwhile its rescue thread takes the other requests in and hands
  // them to the low-latency workers (poller_rescue.h); without it, the 320 requests below
  // would all be answered only after the spin.
  spin_probe::CreatePool(kSpinPool);
  constexpr u64 kSpinNs = 1500000000ull;  // far longer than the round trips below
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  REQUIRE(cudaMemsetAsync(g_env.spin, 0, sizeof(SpinResult), g_env.spin_stream) == cudaSuccess);
  SpinKernel<<<1, 1, 0, g_env.spin_stream>>>(info, kSpinPool, kSpinNs, g_env.spin);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // it holds the worker now
  const u64 sent = chi::NowNs();
  Counters c = Submit(kToLocalCpu, 1, 32, 10);
  const u64 served = chi::NowNs();  // CLOCK_MONOTONIC, as the task's stamp
  REQUIRE(chi::gpu::WaitStream(g_env.spin_stream, kKernelTimeoutNs).ok());
  SpinResult spin{};
  REQUIRE(cudaMemcpy(&spin, g_env.spin, sizeof(spin), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(c.correct == 320);
  CHECK(c.wrong == 0);
  CHECK(spin.rc == 0);
  CHECK(spin.role == spin_probe::RoleOf(chi::WorkerRole::kGpuPoller));  // it holds gpu2cpu
  MESSAGE("320 GPU->CPU round trips behind the spin took "
          << static_cast<double>(served - sent) / 1e6 << " ms; the spin ended "
          << (static_cast<double>(spin.end_ns) - static_cast<double>(served)) / 1e6
          << " ms after them");
  CHECK(served < spin.end_ns);  // all were answered while the spin went on
}

TEST_CASE("a forked child leaves the parent's GPUs alone and its own runtime names the fork") {
  const std::string parent = std::to_string(getpid());
  const int rc = chi_test::ForkAndExit([&](chi_test::ChildChecks &checks) {
    checks.Expect(!chi::Chimaera::Get().IsInitialized(), "the child starts uninitialized");
    checks.Expect(CHI_IPC->NumGpus() == 0, "the child holds none of the parent's GPUs");
    unsetenv("CHI_SERVER_CONF");  // the parent removed its config file after its start
    if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) {
      checks.Expect(false, "the child's CHIMAERA_INIT: " +
                               chi::Chimaera::Get().LastError().ToString());
      return;
    }
    chimaera::demo::Client client;
    auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "gpu_fork_child", kPool);
    checks.Expect(created.Wait(30) && created->GetReturnCode() == 0,
                  "the child's runtime creates the demo pool");
    auto cpu = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 123);
    checks.Expect(cpu.Wait(10) && cpu->GetReturnCode() == 0 && cpu->result_value_ == 246,
                  "the child's CPU Local(): 123 -> 246");
    auto gpu = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);
    checks.Expect(gpu.Wait(10), "the child's LocalGpuBcast completes");
    checks.Expect(gpu->GetReturnCode() == Rc(chi::ErrorCode::kUnsupported),
                  "it fails with kUnsupported, got " + std::to_string(gpu->GetReturnCode()));
    checks.Expect(std::string(gpu->GetMessage()).find("forked from process " + parent) !=
                      std::string::npos,
                  std::string("the failure names the fork: ") + gpu->GetMessage());
  });
  // 124: the child hung at exit (before the fix: joining the parent's GPU worker thread).
  CHECK(rc == 0);
  chimaera::demo::Client client(kPool);  // the parent's GPUs serve on
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);
  REQUIRE(f.Wait(10));
  CHECK(f->result_value_ == 231);
  CHECK(Submit(kLocal, 1, 32, 10).correct == 320);
  CHECK(Submit(kToLocalCpu, 1, 32, 10).correct == 320);
}

/** The test memory and kernels, then the runtime and the tests (gpu_test_main.h). */
int main(int argc, char **argv) {
  return chi_gpu_test::RunWithRuntime(argc, argv, "gpu_runtime_test", kPool, [] {
    return cudaStreamCreateWithFlags(&g_env.stream, cudaStreamNonBlocking) == cudaSuccess &&
           cudaStreamCreateWithFlags(&g_env.spin_stream, cudaStreamNonBlocking) == cudaSuccess &&
           cudaMalloc(&g_env.counters, sizeof(Counters)) == cudaSuccess &&
           cudaMalloc(&g_env.plain, sizeof(u32)) == cudaSuccess &&
           cudaMalloc(&g_env.spin, sizeof(SpinResult)) == cudaSuccess &&
           chi::gpu::PreloadKernel(SpinKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(SubmitKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(AsyncKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(DyingKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(PlainKernel) == cudaSuccess;
  });
}
