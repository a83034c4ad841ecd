// GpuModuleRegistry: how the one .cu file that names the application's GPU modules
// (CHI_GPU_MODULES in orchestrator.h) hands them to the runtime, which may be compiled by
// a plain C++ compiler: a table of host functions, including the kernel launcher.
// Invariant: one list per process; the first registration wins and later ones are refused,
// so the orchestrator never mixes two dispatch tables.
#pragma once

#include <string_view>  // module names

#include "chi/core/atomic.h"     // the published table pointer
#include "chi/core/types.h"      // u32, u64
#include "chi/gpu/gpu_server.h"  // ServerArgs

namespace chi::gpu {

/** The application's GPU module list, type-erased (all host functions). */
struct GpuModuleTable {
  /** Index of the GPU module registered under a host module name, or -1. */
  int (*find_module)(std::string_view name);
  /** Bytes of a module's container state. */
  u64 (*state_bytes)(u32 index);
  /** Builds a module's initial container state in host memory (then copied to the GPU). */
  void (*construct_state)(u32 index, void *mem);
  /** Launches the orchestrator on `stream` (a cudaStream_t/hipStream_t); a GPU error code. */
  int (*launch)(const ServerArgs &args, u32 blocks, u32 threads, void *stream);
  /** How many blocks of `threads` can be resident at once on the current GPU; an error code. */
  int (*max_resident_blocks)(u32 threads, u32 *blocks);
  /** The orchestrator's stack frame in bytes (for the stack-size limit); an error code. */
  int (*kernel_stack_bytes)(u64 *bytes);
};

/** Where CHI_GPU_MODULES publishes its table. */
class GpuModuleRegistry {
 public:
  /** Publishes `table` (static storage); false when another list was registered first. */
  static bool Set(const GpuModuleTable *table) {
    const GpuModuleTable *none = nullptr;
    // acq_rel: publishes the table's contents; exactly one registration wins.
    return Slot().CompareExchange(none, table, MemOrder::kAcqRel);
  }
  /** The registered table, or nullptr when no .cu file named its GPU modules. */
  static const GpuModuleTable *Get() { return Slot().Load(MemOrder::kAcquire); }

 private:
  static Atomic<const GpuModuleTable *> &Slot() {
    static Atomic<const GpuModuleTable *> slot{nullptr};
    return slot;
  }
};

}  // namespace chi::gpu
