// The persistent GPU orchestrator kernel and CHI_GPU_MODULES, which instantiates it for
// the application's GPU modules in one .cu file and hands the launcher to the runtime:
//
//   // gpu_modules.cu (compiled by nvcc or hipcc)
//   #include <chi/gpu/orchestrator.h>
//   #include <chi/mods/demo/demo_tasks.h>
//   CHI_GPU_MODULES(chimaera::demo::GpuRuntime);
//
// Every thread of the launch is a server (gpu_server.h): blocks x threads_per_block of
// them, all resident at once, each owning its slots. Invariant: the kernel returns only
// when the host sets the exit flag; the runtime checks at launch that every block fits on
// the GPU at once (a block that never starts would leave its slots unserved).
#pragma once

#include "chi/core/macros.h"  // CHI_GPU_CUDA, CHI_GPU_HIP

#if !CHI_GPU_CUDA && !CHI_GPU_HIP
#error "chi/gpu/orchestrator.h is compiled by nvcc or hipcc (it defines the kernel)"
#endif

#include "chi/gpu/gpu_api.h"          // Stream, GetLastError, occupancy
#include "chi/gpu/gpu_container.h"    // GpuModuleList
#include "chi/gpu/gpu_server.h"       // ServeLoop, ServerArgs
#include "chi/gpu/module_registry.h"  // GpuModuleTable, GpuModuleRegistry

namespace chi::gpu {

/**
 * Registers an orchestrator thread may use. Its poll batches keep their words in registers
 * (gpu_server.h), which took it from 96 to 175. 168 is the fewest with no spills; a cap of
 * 128 spilled 104 bytes and made the raw cpu2gpu round trip 0.7 us slower (H200). An
 * orchestrator block of 256 threads leaves an SM room for a client block of 256 threads
 * using up to 88 registers.
 */
#if CHI_GPU_CUDA
#define CHI_ORCHESTRATOR_MAX_REGS __maxnreg__(168)
#else
#define CHI_ORCHESTRATOR_MAX_REGS
#endif

/** The orchestrator: serves this GPU's queues with the module list's handlers. */
template <typename ModuleList>
__global__ void CHI_ORCHESTRATOR_MAX_REGS OrchestratorKernel(ServerArgs args) {
  const u32 tid = blockIdx.x * blockDim.x + threadIdx.x;
  const u32 threads = gridDim.x * blockDim.x;
  ServeLoop<ModuleList>(args, tid, threads);
}

/**
 * Launches ModuleList's orchestrator (host). It asks for the largest shared-memory carveout:
 * an SM's split between L1 and shared memory changes only when the SM is idle, so with an
 * orchestrator block on every SM a client kernel needing more shared memory than the split
 * left could not start until the orchestrator pauses. The orchestrator itself uses none.
 */
template <typename ModuleList>
int LaunchOrchestrator(const ServerArgs &args, u32 blocks, u32 threads, void *stream) {
#if !CHI_MEMORY_USE_HIP
  const Error e = cudaFuncSetAttribute(OrchestratorKernel<ModuleList>,
                                       cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared);
  if (e != kSuccess) return static_cast<int>(e);
#endif
  OrchestratorKernel<ModuleList><<<blocks, threads, 0, static_cast<Stream>(stream)>>>(args);
  return static_cast<int>(GetLastError());
}

/** Blocks of `threads` resident at once on the current GPU (host). */
template <typename ModuleList>
int MaxResidentBlocks(u32 threads, u32 *blocks) {
  int dev = 0;
  int per_sm = 0;
  int sms = 0;
  Error e = GetDevice(&dev);
#if CHI_MEMORY_USE_HIP
  if (e == kSuccess) {
    e = hipOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, reinterpret_cast<const void *>(&OrchestratorKernel<ModuleList>),
        static_cast<int>(threads), 0);
  }
#else
  if (e == kSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, OrchestratorKernel<ModuleList>,
                                                      static_cast<int>(threads), 0);
  }
#endif
  if (e == kSuccess) e = MultiprocessorCount(&sms, dev);
  *blocks = e == kSuccess ? static_cast<u32>(per_sm * sms) : 0;
  return static_cast<int>(e);
}

/** The orchestrator's per-thread stack frame (host); also loads its module. */
template <typename ModuleList>
int KernelStackBytes(u64 *bytes) {
#if CHI_MEMORY_USE_HIP
  hipFuncAttributes attr;
  const Error e =
      hipFuncGetAttributes(&attr, reinterpret_cast<const void *>(&OrchestratorKernel<ModuleList>));
#else
  cudaFuncAttributes attr;
  const Error e = cudaFuncGetAttributes(&attr, OrchestratorKernel<ModuleList>);
#endif
  *bytes = e == kSuccess ? static_cast<u64>(attr.localSizeBytes) : 0;
  return static_cast<int>(e);
}

/** The type-erased table for GpuModuleList<Modules...> (static storage). */
template <typename... Modules>
const GpuModuleTable *GpuModuleTableFor() {
  using List = GpuModuleList<Modules...>;
  static const GpuModuleTable table{&List::Find,
                                    &List::StateBytes,
                                    &List::ConstructState,
                                    &LaunchOrchestrator<List>,
                                    &MaxResidentBlocks<List>,
                                    &KernelStackBytes<List>};
  return &table;
}

/** Registers the application's GPU modules with the runtime (before CHIMAERA_INIT). */
template <typename... Modules>
bool RegisterGpuModules() {
  return GpuModuleRegistry::Set(GpuModuleTableFor<Modules...>());
}

}  // namespace chi::gpu

/** Names the application's GPU modules; use once, at namespace scope of one .cu file. */
#define CHI_GPU_MODULES(...)                                       \
  static const bool chi_gpu_modules_registered_ [[maybe_unused]] = \
      ::chi::gpu::RegisterGpuModules<__VA_ARGS__>()
