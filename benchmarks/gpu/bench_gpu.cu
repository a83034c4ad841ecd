// benchmarks/gpu: each GPU route's task round trip next to the raw mechanism it is built
// on, measured by this program in the same run on one GPU (the orchestrator paused while
// the floors run), plus an empty kernel launch + sync for contrast and the GPU->GPU task
// rate with many submitting warps next to a raw per-thread mailbox between two kernels.
//   CPU->GPU task        vs  pinned-flag CPU->GPU->CPU ping-pong (persistent kernel)
//   GPU->CPU task        vs  GPU-initiated pinned ping-pong (a CPU thread answers)
//   GPU->GPU task        vs  SM<->SM ping-pong through device memory
// Then the stages: the submit part of each route, a raw cpu2gpu slot round trip (the queue
// without a task), and one GPU thread timing fence, copy, publish, encode, serve, decode
// (stage_costs.cuh); the cpu2gpu owner probe and the mini orchestrator (owner_probe.cuh;
// --probe: every probe combination). Every device-side spin is bounded by a time limit and a pinned abort flag.
// Without a GPU it prints "skipped: no GPU" and exits 77 (the ctest smoke run uses --quick).
#include <chi/chi.h>
#include <chi/gpu/gpu_manager.h>
#include <chi/gpu/orchestrator.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>
#include <chi/runtime/chimaera.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../bench_util.h"
#include "bench_gpu_util.cuh"
#include "owner_probe.cuh"
#include "poll_probe.cuh"
#include "stage_costs.cuh"

CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

namespace {

using namespace bench_gpu;

// ---- Floors ------------------------------------------------------------------------

/** CPU pings, a persistent GPU thread pongs (pinned memory). */
__global__ void PongKernel(Flags *f, u32 iters) {
  for (u32 i = 1; i <= iters; ++i) {
    if (!DeviceWaitFor(&f->ping, i, &f->abort)) return;
    f->pong.Store(i, chi::MemOrder::kRelease);
  }
}

/** The GPU pings, a CPU thread pongs; batch averages of the round trip into out[]. */
__global__ void GpuPingKernel(Flags *f, u32 batches, u32 per_batch, double *out) {
  u32 i = 0;
  for (u32 b = 0; b < batches; ++b) {
    const u64 t0 = chi::gpu::ClockNs();
    for (u32 k = 0; k < per_batch; ++k) {
      ++i;
      f->ping.Store(i, chi::MemOrder::kRelease);
      if (!DeviceWaitFor(&f->pong, i, &f->abort)) return;
    }
    out[b] = static_cast<double>(chi::gpu::ClockNs() - t0) / per_batch;
  }
}

/** Block 0 and block 1 bounce two words in device memory; block 0 records batch averages. */
__global__ void SmPingPongKernel(Dev *a, Dev *b, const Sys *abort, u32 batches, u32 per_batch,
                                 double *out) {
  u32 i = 0;
  for (u32 bt = 0; bt < batches; ++bt) {
    const u64 t0 = chi::gpu::ClockNs();
    for (u32 k = 0; k < per_batch; ++k) {
      ++i;
      if (blockIdx.x == 0) {
        a->Store(i, chi::MemOrder::kRelease);
        if (!DeviceWaitFor(b, i, abort)) return;
      } else {
        if (!DeviceWaitFor(a, i, abort)) return;
        b->Store(i, chi::MemOrder::kRelease);
      }
    }
    if (blockIdx.x == 0) out[bt] = static_cast<double>(chi::gpu::ClockNs() - t0) / per_batch;
  }
}

__global__ void EmptyKernel() {}

/** Raw mailbox server: thread t answers `rounds` pings on mailbox t (floor of the task rate). */
__global__ void MailboxServer(Dev *req, Dev *ans, const Sys *abort, u32 rounds) {
  const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  for (u32 r = 1; r <= rounds; ++r) {
    if (!DeviceWaitFor(&req[t], r, abort)) return;
    ans[t].Store(r, chi::MemOrder::kRelease);
  }
}

/** Raw mailbox client: thread t pings mailbox t `rounds` times. */
__global__ void MailboxClient(Dev *req, Dev *ans, const Sys *abort, u32 rounds) {
  const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  for (u32 r = 1; r <= rounds; ++r) {
    req[t].Store(r, chi::MemOrder::kRelease);
    if (!DeviceWaitFor(&ans[t], r, abort)) return;
  }
}

// ---- Our routes from a kernel ------------------------------------------------------------

/**
 * One thread, sequential tasks on one route; batch averages into out[] and, of the time
 * spent submitting (claim, encode, post), into submit_out[]; wrong answers counted.
 */
__global__ void TaskLatencyKernel(chi::gpu::GpuInfo info, chi::PoolId pool, bool to_cpu,
                                  u32 batches, u32 per_batch, double *out, double *submit_out,
                                  u32 *wrong, Progress *progress) {
  CHIMAERA_GPU_INIT(info);
  chimaera::demo::Client client(pool);
  u32 v = 0;
  for (u32 b = 0; b < batches; ++b) {
    const u64 t0 = chi::gpu::ClockNs();
    u64 submitting = 0;
    for (u32 k = 0; k < per_batch; ++k, ++v) {
      const u64 s0 = chi::gpu::ClockNs();
      auto f = client.AsyncGpuSubmit(
          to_cpu ? chi::PoolQuery::ToLocalCpu() : chi::PoolQuery::Local(), 0, v);
      submitting += chi::gpu::ClockNs() - s0;
      if (!f.Wait(5) || f->result_value_ != (to_cpu ? v * 2 : v * 3)) {
        atomicAdd(wrong, 1u);
        return;
      }
      // relaxed: a report the host samples; nothing is ordered by it.
      progress->done.Store(v + 1, chi::MemOrder::kRelaxed);
      progress->clock_ns.Store(chi::gpu::ClockNs(), chi::MemOrder::kRelaxed);
    }
    out[b] = static_cast<double>(chi::gpu::ClockNs() - t0) / per_batch;
    submit_out[b] = static_cast<double>(submitting) / per_batch;
  }
}

/**
 * Every thread submits `count` GPU->GPU tasks back to back (the rate benchmark). Capped at
 * 88 registers: with an orchestrator block (256 x 168) on every SM (--blocks all), a client
 * block of 256 threads fits beside it only then; uncapped this kernel takes 92.
 */
__global__ void __maxnreg__(88) TaskRateKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 count, u32 *wrong) {
  CHIMAERA_GPU_INIT(info);
  chimaera::demo::Client client(pool);
  const u32 base = chi::gpu::GlobalThreadId() * count;
  for (u32 i = 0; i < count; ++i) {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, base + i);
    if (!f.Wait(5) || f->result_value_ != (base + i) * 3) {
      atomicAdd(wrong, 1u);
      return;
    }
  }
}

double PinnedPingPongNs(Bench &B, u32 iters) {
  std::memset(static_cast<void *>(B.flags), 0, sizeof(Flags));
  PongKernel<<<1, 1, 0, B.a>>>(B.flags, iters);
  std::vector<double> rt;
  for (u32 i = 1; i <= iters; ++i) {
    const double t0 = chi_bench::NowNs();
    B.flags->ping.Store(i, chi::MemOrder::kRelease);
    if (!HostWaitFor(&B.flags->pong, i)) Die("pinned ping-pong lost the GPU");
    rt.push_back(chi_bench::NowNs() - t0);
  }
  Wait(B.a, "pinned ping-pong");
  return chi_bench::Median(std::vector<double>(rt.begin() + iters / 10, rt.end()));
}

double GpuInitiatedPingPongNs(Bench &B, u32 batches, u32 per_batch) {
  std::memset(static_cast<void *>(B.flags), 0, sizeof(Flags));
  std::thread cpu([&] {
    for (u32 i = 1; i <= batches * per_batch; ++i) {
      if (!HostWaitFor(&B.flags->ping, i)) return;
      B.flags->pong.Store(i, chi::MemOrder::kRelease);
    }
  });
  GpuPingKernel<<<1, 1, 0, B.a>>>(B.flags, batches, per_batch, B.out);
  Wait(B.a, "GPU-initiated ping-pong");
  cpu.join();
  return chi_bench::Median(CopyBack(B.out, batches, B.a));
}

double SmPingPongNs(Bench &B, u32 batches, u32 per_batch) {
  Ok(cudaMemsetAsync(B.words, 0, 2 * sizeof(Dev), B.a), "clear words");
  SmPingPongKernel<<<2, 1, 0, B.a>>>(B.words, B.words + 32, &B.flags->abort, batches, per_batch,
                                     B.out);
  Wait(B.a, "SM ping-pong");
  return chi_bench::Median(CopyBack(B.out, batches, B.a));
}

double LaunchSyncNs(Bench &B, u32 iters) {
  std::vector<double> v;
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    EmptyKernel<<<1, 1, 0, B.a>>>();
    Ok(cudaStreamSynchronize(B.a), "empty kernel");
    v.push_back(chi_bench::NowNs() - t0);
  }
  return chi_bench::Median(v);
}

double MailboxRate(Bench &B, u32 rounds) {
  const u32 n = B.blocks * B.threads;
  Ok(cudaMemsetAsync(B.req, 0, n * sizeof(Dev), B.a), "clear mailboxes");
  Ok(cudaMemsetAsync(B.ans, 0, n * sizeof(Dev), B.a), "clear mailboxes");
  Ok(cudaStreamSynchronize(B.a), "clear mailboxes");
  cudaEvent_t e0, e1;
  Ok(cudaEventCreate(&e0), "event");
  Ok(cudaEventCreate(&e1), "event");
  MailboxServer<<<B.blocks, B.threads, 0, B.b>>>(B.req, B.ans, &B.flags->abort, rounds);
  Ok(cudaEventRecord(e0, B.a), "event");
  MailboxClient<<<B.blocks, B.threads, 0, B.a>>>(B.req, B.ans, &B.flags->abort, rounds);
  Ok(cudaEventRecord(e1, B.a), "event");
  Wait(B.a, "mailbox client");
  Wait(B.b, "mailbox server");
  float ms = 0;
  Ok(cudaEventElapsedTime(&ms, e0, e1), "event");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return static_cast<double>(n) * rounds / (ms * 1e-3);
}

/** Median CPU->GPU task round trip; *submit_ns: the median time AsyncGpuSubmit took. */
double CpuToGpuTaskNs(u32 iters, double *submit_ns) {
  chimaera::demo::Client client(kPool);
  std::vector<double> v;
  std::vector<double> sub;
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, i);
    sub.push_back(chi_bench::NowNs() - t0);
    if (!f.Wait(10) || f->result_value_ != i * 3) Die("a CPU->GPU task failed");
    v.push_back(chi_bench::NowNs() - t0);
  }
  *submit_ns = chi_bench::Median(std::vector<double>(sub.begin() + iters / 10, sub.end()));
  return chi_bench::Median(std::vector<double>(v.begin() + iters / 10, v.end()));
}

/**
 * Median round trip of a 4-byte request through a real cpu2gpu slot, polled by the caller:
 * the orchestrator answers it with an error at once (no copy-in, no handler), so this is
 * the queue's own cost (post, GPU poll, answer) without the task's.
 */
double RawSlotRoundTripNs(u32 iters) {
  std::vector<double> v;
  std::vector<char> answer;
  const char bytes[4] = {1, 2, 3, 4};
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    if (!CHI_IPC->RawRequest(0, bytes, sizeof(bytes), &answer, kHostTimeoutNs).ok()) {
      Die("a raw cpu2gpu request got no answer");
    }
    v.push_back(chi_bench::NowNs() - t0);
  }
  return chi_bench::Median(std::vector<double>(v.begin() + iters / 10, v.end()));
}

double CpuLocalTaskNs(u32 iters) {
  chimaera::demo::Client client(kPool);
  std::vector<double> v;
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i);
    f.Wait(10);
    v.push_back(chi_bench::NowNs() - t0);
  }
  return chi_bench::Median(v);
}

/**
 * The CPU side of a GPU->CPU task alone: a host thread plays the kernel (the same client
 * code) through a gpu2cpu queue in host memory registered with the GPU worker, so the figure
 * is the worker's sweep, dispatch, hop to a CPU worker, handler and answer, with no PCIe.
 * *raw_ns: the same queue's round trip for a malformed request the GPU worker answers itself.
 */
double CpuSideOfGpuToCpuNs(u32 iters, double *raw_ns) {
  using Q = chi::gpu::GpuQueue<chi::MemScope::kSystem>;
  constexpr u32 kSlots = 8;
  const u64 bytes[3] = {Q::SharedBytes(kSlots, chi::gpu::kGpuPayloadBytes),
                        Q::ClientBytes(kSlots, true), Q::ServerBytes(kSlots)};
  char *mem[3];
  for (u32 i = 0; i < 3; ++i) {
    mem[i] = static_cast<char *>(std::aligned_alloc(64, (bytes[i] + 63) / 64 * 64));
    std::memset(mem[i], 0, bytes[i]);
  }
  Q q = Q::Make(kSlots, chi::gpu::kGpuPayloadBytes, 5000000000ull, mem[0], mem[1], true,
                      mem[2], nullptr);
  if (!CHI_IPC->RegisterGpuQueue(q).ok()) Die("cannot register a host gpu2cpu queue");
  chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  info.gpu2cpu_ = &q;
  std::vector<double> raw;  // a 4-byte request: the worker answers "malformed" itself
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    u32 last = 0;
    const u32 s = q.TryClaim(0, ~0u, &last);
    if (s == chi::gpu::kNoSlot) Die("no free slot in the host gpu2cpu queue");
    const u32 seq = chi::gpu::NextSeq(last);
    q.records_[s].seq_ = seq;
    alignas(16) char buf[chi::gpu::kGpuPayloadBytes] = {};
    q.PostInline(s, seq, buf, 4);
    u32 len = 0;
    while (!q.TakeAnswer(s, seq, buf, &len)) {
    }
    q.Release(s, seq, false);
    raw.push_back(chi_bench::NowNs() - t0);
  }
  *raw_ns = chi_bench::Median(std::vector<double>(raw.begin() + iters / 10, raw.end()));
  std::vector<double> v;
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    auto *t = chi::gpu::StartTask<chimaera::demo::GpuSubmitTask>(
        info, kPool, chi::PoolQuery::ToLocalCpu(), chimaera::demo::Method::kGpuSubmit, 0u, i);
    if (t == nullptr || !chi::gpu::WaitTask(t, 10) || t->result_value_ != i * 2) {
      Die("wrong answer from the host-side gpu2cpu queue");
    }
    chi::gpu::ReleaseTask(t);
    v.push_back(chi_bench::NowNs() - t0);
  }
  if (!CHI_IPC->UnregisterGpuQueue(q).ok()) Die("cannot unregister the host gpu2cpu queue");
  for (char *m : mem) std::free(m);
  return chi_bench::Median(std::vector<double>(v.begin() + iters / 10, v.end()));
}

/** Median round trip of an atomic flag between two CPU threads (the CPU side's floor). */
double CpuPingPongNs(u32 iters) {
  alignas(64) std::atomic<u64> ping{0};
  alignas(64) std::atomic<u64> pong{0};
  std::thread peer([&] {
    for (u64 i = 1; i <= iters; ++i) {
      while (ping.load(std::memory_order_acquire) != i) {
      }
      pong.store(i, std::memory_order_release);
    }
  });
  std::vector<double> v;
  for (u64 i = 1; i <= iters; ++i) {
    const double t0 = chi_bench::NowNs();
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) {
    }
    v.push_back(chi_bench::NowNs() - t0);
  }
  peer.join();
  return chi_bench::Median(v);
}

/** Median task round trip from a kernel; *submit_ns: the part spent submitting. */
double KernelTaskNs(Bench &B, bool to_cpu, u32 batches, u32 per_batch, u32 *wrong,
                    double *submit_ns) {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  Ok(cudaMemsetAsync(B.wrong, 0, sizeof(u32), B.a), "clear");
  std::memset(static_cast<void *>(B.progress), 0, sizeof(Progress));
  TaskLatencyKernel<<<1, 1, 0, B.a>>>(info, kPool, to_cpu, batches, per_batch, B.out,
                                      B.out + 2048, B.wrong, B.progress);
  WaitReporting(B.a, to_cpu ? "GPU->CPU tasks" : "GPU->GPU tasks", B.progress);
  u32 w = 0;
  Ok(cudaMemcpy(&w, B.wrong, sizeof(u32), cudaMemcpyDeviceToHost), "copy back");
  *wrong += w;
  std::vector<double> sub = CopyBack(B.out + 2048, batches, B.a);
  *submit_ns = chi_bench::Median(std::vector<double>(sub.begin() + 1, sub.end()));
  std::vector<double> v = CopyBack(B.out, batches, B.a);
  return chi_bench::Median(std::vector<double>(v.begin() + 1, v.end()));  // batch 0: warm-up
}

double TaskRate(Bench &B, u32 blocks, u32 count, u32 *wrong) {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  Ok(cudaMemsetAsync(B.wrong, 0, sizeof(u32), B.a), "clear");
  cudaEvent_t e0, e1;
  Ok(cudaEventCreate(&e0), "event");
  Ok(cudaEventCreate(&e1), "event");
  Ok(cudaEventRecord(e0, B.a), "event");
  TaskRateKernel<<<blocks, B.threads, 0, B.a>>>(info, kPool, count, B.wrong);
  Ok(cudaEventRecord(e1, B.a), "event");
  Wait(B.a, "task rate");
  float ms = 0;
  Ok(cudaEventElapsedTime(&ms, e0, e1), "event");
  u32 w = 0;
  Ok(cudaMemcpy(&w, B.wrong, sizeof(u32), cudaMemcpyDeviceToHost), "copy back");
  *wrong += w;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return static_cast<double>(blocks) * B.threads * count / (ms * 1e-3);
}

}  // namespace

/** Runs one measurement, printing its figure and how long it took as soon as it is done. */
template <typename Fn>
double Step(const char *name, const char *unit, Fn fn) {
  const double t0 = chi_bench::NowNs();
  const double v = fn();
  std::printf("  [%s] %.1f %s (%.0f ms)\n", name, v, unit, (chi_bench::NowNs() - t0) / 1e6);
  return v;
}

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each line reaches the log, even if we are killed
  Bench B;
  u32 blocks = 0;  // orchestrator blocks; 0 = half the SMs (client kernels get the other half)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) B.quick = true;
    if (std::strcmp(argv[i], "--probe") == 0) B.probe = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      B.threads = static_cast<u32>(std::atoi(argv[++i]));
      if (B.threads == 0 || B.threads > 1024 || B.threads % 32 != 0) Die("--threads: 32..1024");
    }
    if (std::strcmp(argv[i], "--blocks") == 0 && i + 1 < argc) {
      ++i;
      blocks = std::strcmp(argv[i], "all") == 0 ? ~0u : static_cast<u32>(std::atoi(argv[i]));
    }
  }
  chi::gpu::PreferEagerModuleLoading();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  int sms = 0;
  Ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  B.sms = static_cast<u32>(sms);
  if (blocks == 0) blocks = B.sms / 2;
  if (blocks > B.sms) blocks = B.sms;  // "all": one block per SM
  B.blocks = blocks;
  char name[256];
  std::printf("bench_gpu on %s (%u SMs), orchestrator %u x %u threads%s\n",
              chi::gpu::DeviceName(0, name, sizeof(name)), B.sms, blocks, B.threads,
              B.quick ? ", quick" : "");
  // The orchestrator: `blocks` blocks of 256 threads (every server thread owns a slot).
  const std::string conf = "/tmp/chi_bench_gpu_" + std::to_string(getpid()) + ".yaml";
  if (FILE *f = std::fopen(conf.c_str(), "w")) {
    std::fprintf(f, "gpu:\n  blocks: %u\n  threads_per_block: %u\n  queue_depth: 256\n", blocks,
                 B.threads);
    std::fclose(f);
  }
  setenv("CHI_SERVER_CONF", conf.c_str(), 1);
  const u32 n = B.sms * B.threads;
  Ok(cudaStreamCreateWithFlags(&B.a, cudaStreamNonBlocking), "stream");
  Ok(cudaStreamCreateWithFlags(&B.b, cudaStreamNonBlocking), "stream");
  Ok(cudaHostAlloc(&B.flags, sizeof(Flags), cudaHostAllocPortable), "pinned flags");
  Ok(cudaHostAlloc(&B.progress, sizeof(Progress), cudaHostAllocPortable), "pinned progress");
  std::memset(static_cast<void *>(B.flags), 0, sizeof(Flags));
  Ok(cudaMalloc(&B.words, 64 * sizeof(Dev)), "device words");
  Ok(cudaMalloc(&B.req, n * sizeof(Dev)), "mailboxes");
  Ok(cudaMalloc(&B.ans, n * sizeof(Dev)), "mailboxes");
  Ok(cudaMalloc(&B.out, 4096 * sizeof(double)), "batch results");
  Ok(cudaMalloc(&B.wrong, sizeof(u32)), "counter");
  // Every kernel is loaded before the orchestrator starts (see PreferEagerModuleLoading).
  Ok(chi::gpu::PreloadKernel(PongKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(GpuPingKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(SmPingPongKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(EmptyKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(MailboxServer), "load kernels");
  Ok(chi::gpu::PreloadKernel(MailboxClient), "load kernels");
  Ok(chi::gpu::PreloadKernel(TaskLatencyKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(TaskRateKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(StageKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(owner_probe::OwnerKernel), "load kernels");
  Ok(chi::gpu::PreloadKernel(
         owner_probe::MiniOrchestrator<chi::gpu::GpuModuleList<chimaera::demo::GpuRuntime>>),
     "load kernels");
  ProbeMemory probe;
  probe.Allocate();
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) Die("CHIMAERA_INIT failed");
  std::remove(conf.c_str());
  if (!CHI_IPC->StartError().ok()) Die(CHI_IPC->StartError().ToString().c_str());
  chimaera::demo::Client client;
  auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "bench_gpu", kPool);
  if (!created.Wait(30) || created->GetReturnCode() != 0) Die("cannot create the demo pool");

  const u32 iters = B.quick ? 200 : 5000;
  const u32 batches = B.quick ? 10 : 50;
  const u32 per_batch = B.quick ? 10 : 100;
  u32 wrong = 0;

  // Floors, with the orchestrator paused (nothing else on the GPU).
  if (!CHI_IPC->PauseGpuOrchestrator().ok()) Die("pause");
  const double floor_c2g =
      Step("pinned ping-pong", "ns", [&] { return PinnedPingPongNs(B, iters); });
  const double floor_g2c = Step("GPU-initiated ping-pong", "ns",
                                [&] { return GpuInitiatedPingPongNs(B, batches, per_batch); });
  const double floor_g2g =
      Step("SM ping-pong", "ns", [&] { return SmPingPongNs(B, batches, per_batch); });
  const double launch =
      Step("launch + sync", "ns", [&] { return LaunchSyncNs(B, B.quick ? 50 : 2000); });
  const double floor_rate =
      Step("mailbox rate", "/s", [&] { return MailboxRate(B, B.quick ? 10 : 200); });
  const StageCosts stage = StageCostsOnDevice(B, B.quick ? 20 : 1000);
  PollProbe(B.a, B.quick ? 100 : 2000);
  PollPingPong(B.flags, B.a, B.quick ? 100 : 2000);
  if (!B.quick) {
    OwnerProbe(B, probe, iters, B.probe, "GPU otherwise idle");
    MiniOrchestratorProbe(B, iters, 1, 32);
    MiniOrchestratorProbe(B, iters, 1, 256);
    MiniOrchestratorProbe(B, iters, B.blocks, B.threads);
    MiniOrchestratorProbe(B, iters, B.blocks, B.threads, true);
  }
  if (!CHI_IPC->ResumeGpuOrchestrator().ok()) Die("resume");
  if (!B.quick) OwnerProbe(B, probe, iters, false, "orchestrator running");

  // Ours.
  const double cpu_local = Step("CPU Local task", "ns", [&] { return CpuLocalTaskNs(iters); });
  double c2g_submit = 0, g2g_submit = 0, g2c_submit = 0;
  const double c2g =
      Step("CPU->GPU task", "ns", [&] { return CpuToGpuTaskNs(iters, &c2g_submit); });
  const double raw_c2g =
      Step("raw cpu2gpu slot round trip", "ns", [&] { return RawSlotRoundTripNs(iters); });
  const double g2g = Step("GPU->GPU task", "ns", [&] {
    return KernelTaskNs(B, false, batches, per_batch, &wrong, &g2g_submit);
  });
  const double g2c = Step("GPU->CPU task", "ns", [&] {
    return KernelTaskNs(B, true, batches / 2, per_batch, &wrong, &g2c_submit);
  });
  double g2c_cpu_raw = 0;
  const double g2c_cpu =
      Step("GPU->CPU CPU side", "ns", [&] { return CpuSideOfGpuToCpuNs(iters, &g2c_cpu_raw); });
  const double cpu_floor = Step("CPU thread ping-pong", "ns", [&] { return CpuPingPongNs(iters); });
  Step("GPU->GPU rate, warm-up", "/s", [&] { return TaskRate(B, B.blocks, 2, &wrong); });
  const double rate =
      Step("GPU->GPU rate", "/s", [&] { return TaskRate(B, B.blocks, B.quick ? 4 : 50, &wrong); });
  const double rate_one_block = Step("GPU->GPU rate, 1 block", "/s",
                                     [&] { return TaskRate(B, 1, B.quick ? 4 : 200, &wrong); });

  std::printf("\n%-44s %10s   %-40s %10s   %s\n", "route (median round trip)", "ours", "floor",
              "floor", "ratio");
  chi_bench::ReportLatency("CPU->GPU task (LocalGpuBcast)", c2g,
                           "pinned flag CPU->GPU->CPU ping-pong", floor_c2g);
  chi_bench::ReportLatency("GPU->CPU task (ToLocalCpu from a kernel)", g2c,
                           "GPU-initiated pinned ping-pong", floor_g2c);
  chi_bench::ReportLatency("GPU->GPU task (Local from a kernel)", g2g,
                           "SM<->SM device-memory ping-pong", floor_g2g);
  chi_bench::ReportLatency("CPU->GPU task vs a kernel launch", c2g,
                           "empty kernel launch + stream sync", launch);
  chi_bench::ReportLatency("CPU Local() task (CPU handler, reference)", cpu_local,
                           "pinned flag CPU->GPU->CPU ping-pong", floor_c2g);
  char label[96];
  std::snprintf(label, sizeof(label), "GPU->GPU tasks/s, %u x %u client threads", B.blocks,
                B.threads);
  std::snprintf(name, sizeof(name), "raw per-thread mailbox, %u x %u", B.blocks, B.threads);
  chi_bench::ReportRate(label, rate, name, floor_rate);
  std::snprintf(label, sizeof(label), "GPU->GPU tasks/s, 1 x %u threads", B.threads);
  chi_bench::ReportRate(label, rate_one_block);
  std::printf("\nstages (ns; device figures: one thread, mean of %u rounds each)\n",
              B.quick ? 20u : 1000u);
  std::printf("  CPU->GPU: submit (AsyncGpuSubmit) %.0f of %.0f; raw slot round trip %.0f\n",
              c2g_submit, c2g, raw_c2g);
  std::printf("  GPU->GPU: submit %.0f of %.0f;  GPU->CPU: submit %.0f of %.0f\n", g2g_submit,
              g2g, g2c_submit, g2c);
  std::printf("  GPU->CPU's CPU side (a host thread as the client, host memory) %.0f, a"
              " malformed request answered by the GPU worker %.0f; CPU thread ping-pong %.0f\n",
              g2c_cpu, g2c_cpu_raw, cpu_floor);
  std::printf("  request %.0f B; fence.sys %.0f; fence + copy from pinned %.0f, from device"
              " %.0f\n",
              stage.len, stage.fence_sys, stage.copy_pinned, stage.copy_device);
  std::printf("  publish (payload + release word): pinned %.0f, device %.0f\n",
              stage.publish_pinned, stage.publish_device);
  std::printf("  encode request %.0f; serve (decode, run, encode answer) %.0f; decode answer"
              " %.0f\n",
              stage.encode, stage.handle, stage.decode);
  std::printf("  ServeSlot from pinned: 4-byte request %.0f, demo task %.0f; claim + release"
              " of a device slot %.0f\n",
              stage.serve_raw, stage.serve_task, stage.claim_release);
  std::printf("  StartOn (a kernel's whole submit, one thread, device queue) %.0f\n",
              stage.start_on);
  std::printf("  one ClockNs read %.0f; ClaimSlot + release %.0f\n", stage.clock_read,
              stage.claim_slot);
  std::printf("wrong answers: %u\n", wrong);
  chi::CHIMAERA_FINALIZE();
  probe.Free();
  return wrong == 0 ? 0 : 1;
}
