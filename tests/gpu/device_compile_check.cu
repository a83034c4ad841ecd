// Device-side compile check of include/chi/gpu: the orchestrator kernel instantiated for the
// demo module, a client kernel that submits on both GPU routes and waits, and one that uses
// CHI_GPU_HEAP and a GpuArena. Compiled (not
// run) by nvcc (sm_90) and hipcc (gfx90a) from tests/packaging.cmake.
// Under hipcc the module client (demo_client.h) is left out: it reaches the runtime's
// yaml-cpp headers, on which Debian 12's clang 15 crashes in C++20 HIP mode; kernels there
// call chi::gpu::AsyncSubmit, which is what the client's AsyncGpuSubmit does on the device.
#include <chi/gpu/gpu_arena.h>
#include <chi/gpu/gpu_client.h>
#include <chi/gpu/orchestrator.h>
#include <chi/mods/demo/demo_tasks.h>
#if !CHI_GPU_HIP
#include <chi/mods/demo/demo_client.h>
#endif

#if CHI_GPU_HIP
#include <hip/hip_runtime.h>  // threadIdx, blockIdx under hipcc
#endif

CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

namespace chi_gpu_device_check {

using chi::u32;

/** Local() (GPU handler) and ToLocalCpu() (CPU handler) from one thread, then both waits. */
__global__ void ClientKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 *out) {
  CHIMAERA_GPU_INIT(info);
  using chimaera::demo::GpuSubmitTask;
  using chimaera::demo::Method;
  auto on_gpu = chi::gpu::AsyncSubmit<GpuSubmitTask>(pool, chi::PoolQuery::Local(),
                                                     Method::kGpuSubmit, 0u, 42u);
  auto on_cpu = chi::gpu::AsyncSubmit<GpuSubmitTask>(pool, chi::PoolQuery::ToLocalCpu(),
                                                     Method::kGpuSubmit, 0u, 88u);
  if (on_gpu.Wait() && on_cpu.Wait(1.0f) && on_gpu.IsComplete()) {
    out[0] = on_gpu->result_value_;
    out[1] = on_cpu->result_value_;
  }
#if !CHI_GPU_HIP
  chimaera::demo::Client client(pool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 7);
  if (f.Wait()) out[2] = f->result_value_;
#endif
}

/** The multi-block variant of the client set-up. */
__global__ void MultiBlockKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 *out) {
  CHIMAERA_GPU_INIT_BLOCKS(info, gridDim.x);
  if (threadIdx.x != 0) return;
  auto f = chi::gpu::AsyncSubmit<chimaera::demo::GpuSubmitTask>(
      pool, chi::PoolQuery::ToLocalGpu(info.gpu_id_), chimaera::demo::Method::kGpuSubmit, 0u,
      blockIdx.x);
  if (f.Wait()) out[blockIdx.x] = f->result_value_;
}

/** CHI_GPU_HEAP and a per-thread arena: allocate, fill, free, reset. */
__global__ void HeapKernel(chi::gpu::GpuInfo info, u32 *out) {
  CHIMAERA_GPU_INIT(info);
  auto *p = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(64 * sizeof(u32)));
  if (p == nullptr) return;
  for (u32 i = 0; i < 64; ++i) p[i] = i;
  chi::gpu::GpuArena arena = chi::gpu::GpuArena::FromHeap(CHI_GPU_HEAP, 1024);
  auto *scratch = static_cast<u32 *>(arena.Allocate(sizeof(u32)));
  if (scratch != nullptr) *scratch = p[63];
  arena.Reset();
  arena.ReturnTo(CHI_GPU_HEAP);
  out[threadIdx.x] = p[threadIdx.x % 64] + static_cast<u32>(CHI_GPU_HEAP->BytesInUse() != 0);
  CHI_GPU_HEAP->Free(p);
}

}  // namespace chi_gpu_device_check
