// The GPU runtime API behind one set of names for CUDA and HIP: devices, memory, pinned
// registration of POSIX shared memory, copies, streams, events, IPC handles, the stack
// limit and module preloading. Extends the alias layer of chi/memory/gpu_backend.h (which
// owns SetDevice, Malloc, Free, HostRegister and the IPC calls). Host code only.
// Invariant: nothing here waits on the device as a whole (no device-wide synchronize):
// a persistent orchestrator kernel would make such a wait last forever.
#pragma once

#if !defined(CHIMAERA_ENABLE_CUDA) && !defined(CHIMAERA_ENABLE_ROCM)
#error "chi/gpu/gpu_api.h needs CHIMAERA_ENABLE_CUDA or CHIMAERA_ENABLE_ROCM"
#endif

#include <time.h>  // nanosleep between stream polls

#include <cstdlib>  // setenv for the module-loading mode

#include "chi/core/status.h"         // Status, ErrorCode
#include "chi/core/types.h"          // u32, u64
#include "chi/memory/gpu_backend.h"  // chi::gpu alias layer, PinnedShmBackend, GpuDeviceBackend

namespace chi::gpu {

#if CHI_MEMORY_USE_HIP
using Stream = hipStream_t;
using Event = hipEvent_t;
inline Error GetDeviceCount(int *n) { return hipGetDeviceCount(n); }
inline Error GetDevice(int *id) { return hipGetDevice(id); }
inline Error MallocHost(void **p, size_t n) { return hipHostMalloc(p, n, hipHostMallocPortable); }
inline Error FreeHost(void *p) { return hipHostFree(p); }
inline Error Memset(void *p, int v, size_t n) { return hipMemset(p, v, n); }
inline Error MemsetAsync(void *p, int v, size_t n, Stream s) { return hipMemsetAsync(p, v, n, s); }
inline Error MemcpyAsync(void *dst, const void *src, size_t n, Stream s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyDefault, s);
}
inline Error StreamCreate(Stream *s) { return hipStreamCreateWithFlags(s, hipStreamNonBlocking); }
inline Error StreamDestroy(Stream s) { return hipStreamDestroy(s); }
inline Error StreamQuery(Stream s) { return hipStreamQuery(s); }
inline Error StreamSynchronize(Stream s) { return hipStreamSynchronize(s); }
inline constexpr Error kNotReady = hipErrorNotReady;
inline Error EventCreate(Event *e) { return hipEventCreate(e); }
inline Error EventRecord(Event e, Stream s) { return hipEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return hipEventSynchronize(e); }
inline Error EventElapsedMs(float *ms, Event a, Event b) { return hipEventElapsedTime(ms, a, b); }
inline Error EventDestroy(Event e) { return hipEventDestroy(e); }
// HIP sizes each kernel's scratch from the kernel itself (and HIP 5.2 has no stack limit).
inline Error SetStackLimit(size_t) { return hipSuccess; }
inline Error GetStackLimit(size_t *bytes) {
  *bytes = 0;
  return hipSuccess;
}
inline Error GetLastError() { return hipGetLastError(); }
inline Error MultiprocessorCount(int *n, int dev) {
  return hipDeviceGetAttribute(n, hipDeviceAttributeMultiprocessorCount, dev);
}
inline const char *DeviceName(int dev, char *buf, size_t n) {
  hipDeviceProp_t p;
  if (hipGetDeviceProperties(&p, dev) != hipSuccess) return "unknown";
  size_t i = 0;
  for (; i + 1 < n && p.name[i] != '\0'; ++i) buf[i] = p.name[i];
  buf[i] = '\0';
  return buf;
}
#else
using Stream = cudaStream_t;
using Event = cudaEvent_t;
inline Error GetDeviceCount(int *n) { return cudaGetDeviceCount(n); }
inline Error GetDevice(int *id) { return cudaGetDevice(id); }
inline Error MallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocPortable); }
inline Error FreeHost(void *p) { return cudaFreeHost(p); }
inline Error Memset(void *p, int v, size_t n) { return cudaMemset(p, v, n); }
inline Error MemsetAsync(void *p, int v, size_t n, Stream s) { return cudaMemsetAsync(p, v, n, s); }
inline Error MemcpyAsync(void *dst, const void *src, size_t n, Stream s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
}
inline Error StreamCreate(Stream *s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
inline Error StreamDestroy(Stream s) { return cudaStreamDestroy(s); }
inline Error StreamQuery(Stream s) { return cudaStreamQuery(s); }
inline Error StreamSynchronize(Stream s) { return cudaStreamSynchronize(s); }
inline constexpr Error kNotReady = cudaErrorNotReady;
inline Error EventCreate(Event *e) { return cudaEventCreate(e); }
inline Error EventRecord(Event e, Stream s) { return cudaEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return cudaEventSynchronize(e); }
inline Error EventElapsedMs(float *ms, Event a, Event b) { return cudaEventElapsedTime(ms, a, b); }
inline Error EventDestroy(Event e) { return cudaEventDestroy(e); }
inline Error SetStackLimit(size_t bytes) { return cudaDeviceSetLimit(cudaLimitStackSize, bytes); }
inline Error GetStackLimit(size_t *bytes) { return cudaDeviceGetLimit(bytes, cudaLimitStackSize); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error MultiprocessorCount(int *n, int dev) {
  return cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev);
}
inline const char *DeviceName(int dev, char *buf, size_t n) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "unknown";
  size_t i = 0;
  for (; i + 1 < n && p.name[i] != '\0'; ++i) buf[i] = p.name[i];
  buf[i] = '\0';
  return buf;
}
#endif

/** A failed call as a Status naming what was being done. */
inline Status Check(Error e, const char *what) {
  if (e == kSuccess) return Status::Ok();
  return Status::Errorf(ErrorCode::kIo, "%s: %s", what, ErrorString(e));
}

/**
 * Selects GPU `id` for the calling thread while in scope, then gives the thread back the GPU
 * it had: the runtime's calls run on application threads (a CPU->GPU submit, CHIMAERA_INIT),
 * and an application's own streams and events belong to the GPU it chose.
 */
class DeviceScope {
 public:
  explicit DeviceScope(int id) {
    restore_ = GetDevice(&previous_) == kSuccess && previous_ != id;
    status_ = Check(SetDevice(id), "select GPU");
  }
  ~DeviceScope() {
    if (restore_) static_cast<void>(SetDevice(previous_));
  }
  DeviceScope(const DeviceScope &) = delete;
  DeviceScope &operator=(const DeviceScope &) = delete;

  /** Whether the selection worked. */
  const Status &status() const { return status_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  Status status_;
};

/**
 * Selects eager module loading. Lazy loading (CUDA's default) may need a context-wide
 * synchronisation to load a kernel, which never comes while a persistent kernel runs: the
 * first launch of a not-yet-loaded kernel can then deadlock (CUDA's lazy-loading notes).
 * Effective only before the process's first GPU call; a program that starts CUDA earlier
 * must set CUDA_MODULE_LOADING=EAGER itself or PreloadKernel every kernel before
 * CHIMAERA_INIT.
 */
inline void PreferEagerModuleLoading() { setenv("CUDA_MODULE_LOADING", "EAGER", 1); }

/** Loads `kernel`'s module now (call before the orchestrator starts, under lazy loading). */
template <typename Kernel>
Error PreloadKernel(Kernel *kernel) {
#if CHI_MEMORY_USE_HIP
  hipFuncAttributes attr;
  return hipFuncGetAttributes(&attr, reinterpret_cast<const void *>(kernel));
#else
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, kernel);
#endif
}

/**
 * Waits until `stream` has no pending work, polling with growing sleeps up to timeout_ns.
 * Returns kTimeout instead of hanging when a kernel on it never finishes.
 */
inline Status WaitStream(Stream s, u64 timeout_ns) {
  u64 waited = 0;
  u64 nap = 2000;
  for (;;) {
    const Error e = StreamQuery(s);
    if (e == kSuccess) return Status::Ok();
    if (e != kNotReady) return Check(e, "stream query");
    if (waited >= timeout_ns) {
      return Status::Errorf(ErrorCode::kTimeout, "GPU stream still busy after %llu ms",
                            static_cast<unsigned long long>(timeout_ns / 1000000));
    }
    timespec ts{0, static_cast<long>(nap)};
    nanosleep(&ts, nullptr);
    waited += nap;
    nap = nap < 1000000 ? nap * 2 : nap;
  }
}

}  // namespace chi::gpu
