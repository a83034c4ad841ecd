// A CUDA kernel of your own that calls a module's client: each thread sends one task that a
// GPU handler runs (PoolQuery::Local(), through the runtime's orchestrator kernel) and one
// that a CPU handler runs (PoolQuery::ToLocalCpu(), through the runtime's GPU worker), and
// waits for both. The host side embeds a runtime with a GPU (build with
// -DCHIMAERA_ENABLE_CUDA=ON). Without a GPU it says so and exits 77.
//
//   ./gpu_kernel [threads=64]
#include <chi/chi.h>
#include <chi/gpu/gpu_manager.h>          // CHI_IPC: the GPU set-up
#include <chi/gpu/orchestrator.h>         // CHI_GPU_MODULES: the orchestrator kernel
#include <chi/mods/demo/demo_client.h>    // the client, host and device
#include <chi/mods/demo/demo_runtime.h>   // registers the module's CPU half

#include <cstdio>
#include <cstdlib>

// The modules whose GPU handlers this program's orchestrator runs (in one .cu file).
CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

/** Each thread: value v gives v * 3 on the GPU handler and v * 2 on the CPU handler. */
__global__ void UserKernel(chi::IpcManagerGpuInfo info, chi::PoolId pool, unsigned *tally) {
  CHIMAERA_GPU_INIT(info);  // first line of any kernel that calls a client
  chimaera::demo::Client client(pool);
  const unsigned v = chi::gpu::GlobalThreadId();
  auto on_gpu = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, v);
  auto on_cpu = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalCpu(), 0, v);
  // Bounded waits: a kernel never waits without end (false: no answer in 5 s).
  const bool ok = on_gpu.Wait(5) && on_cpu.Wait(5) && on_gpu->GetReturnCode() == 0 &&
                  on_cpu->GetReturnCode() == 0 && on_gpu->result_value_ == v * 3 &&
                  on_cpu->result_value_ == v * 2;
  atomicAdd(&tally[ok ? 0 : 1], 1u);
}

int main(int argc, char **argv) {
  const unsigned threads = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 64;
  chi::gpu::PreferEagerModuleLoading();  // every kernel is loaded before the orchestrator runs
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  unsigned *tally = nullptr;
  if (cudaMalloc(&tally, 2 * sizeof(unsigned)) != cudaSuccess ||
      cudaMemset(tally, 0, 2 * sizeof(unsigned)) != cudaSuccess) {
    return 1;
  }
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 1;
  if (chi::Status st = CHI_IPC->StartError(); !st.ok()) {
    std::fprintf(stderr, "the runtime has no GPU: %s\n", st.ToString().c_str());
    return 1;
  }
  chimaera::demo::Client client;
  auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "gpu_pool", chi::PoolId(230, 0));
  if (!created.Wait(30) || created->GetReturnCode() != 0) return 1;
  const chi::IpcManagerGpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  UserKernel<<<1, threads, 0, stream>>>(info, client.GetPoolId(), tally);
  // Waits on this stream only: the orchestrator kernel never ends, so the device never idles.
  const chi::Status done = chi::gpu::WaitStream(stream, 60000000000ull);
  unsigned host[2] = {0, 0};
  cudaMemcpyAsync(host, tally, sizeof(host), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  std::printf("gpu_kernel: %u threads, %u right, %u wrong%s\n", threads, host[0], host[1],
              done.ok() ? "" : " (the kernel did not finish)");
  chi::CHIMAERA_FINALIZE();
  return done.ok() && host[0] == threads && host[1] == 0 ? 0 : 1;
}
