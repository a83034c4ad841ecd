// The CUDA/HIP half of memory registration: a client describes a device range (its device,
// its allocation's IPC handle, its offset in that allocation) and a runtime opens and closes
// such handles. Both are installed into GpuHooks (gpu_ipc_cache.h) by the GPU build, so the
// CUDA-free code (IpcManager, admin, the cache) reaches them. Host code only.
// Invariant: an IPC handle always names a whole allocation, so the offset travels with it.
#pragma once

#include <cstring>  // memcpy of the handle bytes

#include "chi/core/status.h"        // Status, ErrorCode
#include "chi/gpu/gpu_api.h"        // the CUDA/HIP layer (IpcGetMemHandle, IpcOpenMemHandle)
#include "chi/gpu/gpu_ipc_cache.h"  // MemoryRegistration, IpcHandleBytes, GpuHooks

namespace chi::gpu {

static_assert(sizeof(IpcMemHandle) <= sizeof(IpcHandleBytes), "an IPC handle fits the bytes");

/**
 * The device, base and size of the allocation holding device pointer p.
 * kInvalidArgument when p is not device memory of this process.
 */
inline Status DeviceAllocationOf(const void *p, int *device, char **base, u64 *size) {
#if CHI_MEMORY_USE_HIP
  hipPointerAttribute_t a;
  if (hipPointerGetAttributes(&a, p) != hipSuccess || a.memoryType != hipMemoryTypeDevice) {
    static_cast<void>(hipGetLastError());  // clear the sticky-free error of a failed query
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "RegisterMemory: %p is not device memory of this process", p);
  }
  *device = a.device;
  hipDeviceptr_t b = nullptr;
  size_t n = 0;
  if (hipMemGetAddressRange(&b, &n, const_cast<void *>(p)) != hipSuccess) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "RegisterMemory: no allocation contains %p", p);
  }
  *base = static_cast<char *>(b);
  *size = n;
  return Status::Ok();
#else
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    static_cast<void>(cudaGetLastError());  // clear the error of a failed query
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "RegisterMemory: %p is not device memory of this process", p);
  }
  *device = a.device;
  // The runtime API has no allocation-range query: ask the driver's, through the runtime.
  using RangeFn = int (*)(unsigned long long *, size_t *, unsigned long long);
  static const RangeFn range = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<RangeFn>(nullptr);
    }
    return reinterpret_cast<RangeFn>(fn);
  }();
  if (range == nullptr) {
    return Status::Error(ErrorCode::kUnsupported,
                         "RegisterMemory: the CUDA driver offers no cuMemGetAddressRange");
  }
  unsigned long long b = 0;
  size_t n = 0;
  if (range(&b, &n, reinterpret_cast<unsigned long long>(p)) != 0) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "RegisterMemory: no allocation contains %p", p);
  }
  *base = reinterpret_cast<char *>(b);
  *size = n;
  return Status::Ok();
#endif
}

/**
 * Client side (GpuHooks::describe): fills reg's device, alloc_offset and handle for the
 * device range [ptr, ptr + bytes), which must lie inside one allocation.
 */
inline Status DescribeDeviceMemory(const void *ptr, u64 bytes, MemoryRegistration *reg) {
  int device = 0;
  char *base = nullptr;
  u64 size = 0;
  if (Status st = DeviceAllocationOf(ptr, &device, &base, &size); !st.ok()) return st;
  const u64 offset = static_cast<u64>(static_cast<const char *>(ptr) - base);
  if (bytes > size - offset) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "RegisterMemory: %llu bytes from %p run past the end of its "
                          "%llu-byte allocation",
                          static_cast<unsigned long long>(bytes), ptr,
                          static_cast<unsigned long long>(size));
  }
  IpcMemHandle h;
  if (Error e = IpcGetMemHandle(&h, base); e != kSuccess) {
    return Status::Errorf(ErrorCode::kUnsupported,
                          "RegisterMemory: cannot export an IPC handle for %p: %s", ptr,
                          ErrorString(e));
  }
  reg->device = static_cast<u32>(device);
  reg->alloc_offset = offset;
  reg->handle = IpcHandleBytes();
  std::memcpy(reg->handle.words, &h, sizeof(h));
  return Status::Ok();
}

/** Runtime side: maps another process's allocation on `device` (slow: cache the result). */
inline Status OpenIpcHandle(u32 device, const IpcHandleBytes &bytes, void **base) {
  const DeviceScope scope(static_cast<int>(device));  // the caller keeps its own GPU
  if (!scope.status().ok()) return scope.status();
  IpcMemHandle h;
  std::memcpy(&h, bytes.words, sizeof(h));
  return Check(IpcOpenMemHandle(base, h), "open a client's IPC memory handle");
}

/**
 * Runtime side: unmaps what OpenIpcHandle mapped. It may wait for the whole device: call it
 * only while no orchestrator runs (GpuManager retires mappings until then).
 */
inline void CloseIpcHandle(u32 device, void *base) {
  // Teardown: a refusal leaves nothing we could undo.
  const DeviceScope scope(static_cast<int>(device));
  static_cast<void>(IpcCloseMemHandle(base));
}

/** Installs DescribeDeviceMemory for IpcManager::RegisterMemory in every GPU build. */
inline const bool kDeviceMemoryDescriberInstalled = [] {
  GpuHooks::Get().describe.Store(&DescribeDeviceMemory, MemOrder::kRelease);  // before use
  return true;
}();

}  // namespace chi::gpu
