// GPU memory backends: pinned host memory (a POSIX segment registered with the GPU, so
// several processes and the GPU share it) and device memory (shared through CUDA/HIP IPC
// handles). Used by the GPU queues and the device heaps. Invariant: as for every backend,
// a call either succeeds or leaves nothing registered, mapped or allocated.
#pragma once

#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)

#if defined(__HIPCC__) || (defined(CHIMAERA_ENABLE_ROCM) && !defined(CHIMAERA_ENABLE_CUDA))
#define CHI_MEMORY_USE_HIP 1
#include <hip/hip_runtime_api.h>  // hipMalloc, hipHostRegister, hipIpc*
#else
#define CHI_MEMORY_USE_HIP 0
#include <cuda_runtime_api.h>  // cudaMalloc, cudaHostRegister, cudaIpc*
#endif

#include <cstddef>      // size_t
#include <string>       // std::string for names
#include <string_view>  // names

#include "chi/core/status.h"               // Status, ErrorCode
#include "chi/core/types.h"                // u64
#include "chi/memory/backend.h"            // MemoryBackend, BackendHeader
#include "chi/memory/posix_shm_backend.h"  // PosixShmBackend: the pinned segment's storage

namespace chi {
namespace gpu {

// ---- The CUDA/HIP alias layer: one name per call this header needs ----
#if CHI_MEMORY_USE_HIP
using Error = hipError_t;
using IpcMemHandle = hipIpcMemHandle_t;
inline constexpr Error kSuccess = hipSuccess;
inline Error SetDevice(int id) { return hipSetDevice(id); }
inline Error Malloc(void **p, size_t n) { return hipMalloc(p, n); }
inline Error Free(void *p) { return hipFree(p); }
inline Error MemcpyToDevice(void *dst, const void *src, size_t n) {
  return hipMemcpy(dst, src, n, hipMemcpyHostToDevice);
}
inline Error MemcpyToHost(void *dst, const void *src, size_t n) {
  return hipMemcpy(dst, src, n, hipMemcpyDeviceToHost);
}
inline Error HostRegister(void *p, size_t n) {
  return hipHostRegister(p, n, hipHostRegisterPortable | hipHostRegisterMapped);
}
inline Error HostUnregister(void *p) { return hipHostUnregister(p); }
inline Error HostGetDevicePointer(void **dev, void *host) {
  return hipHostGetDevicePointer(dev, host, 0);
}
inline Error IpcGetMemHandle(IpcMemHandle *h, void *p) { return hipIpcGetMemHandle(h, p); }
inline Error IpcOpenMemHandle(void **p, IpcMemHandle h) {
  return hipIpcOpenMemHandle(p, h, hipIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void *p) { return hipIpcCloseMemHandle(p); }
inline const char *ErrorString(Error e) { return hipGetErrorString(e); }
#else
using Error = cudaError_t;
using IpcMemHandle = cudaIpcMemHandle_t;
inline constexpr Error kSuccess = cudaSuccess;
inline Error SetDevice(int id) { return cudaSetDevice(id); }
inline Error Malloc(void **p, size_t n) { return cudaMalloc(p, n); }
inline Error Free(void *p) { return cudaFree(p); }
inline Error MemcpyToDevice(void *dst, const void *src, size_t n) {
  return cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
}
inline Error MemcpyToHost(void *dst, const void *src, size_t n) {
  return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}
inline Error HostRegister(void *p, size_t n) {
  return cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped);
}
inline Error HostUnregister(void *p) { return cudaHostUnregister(p); }
inline Error HostGetDevicePointer(void **dev, void *host) {
  return cudaHostGetDevicePointer(dev, host, 0);
}
inline Error IpcGetMemHandle(IpcMemHandle *h, void *p) { return cudaIpcGetMemHandle(h, p); }
inline Error IpcOpenMemHandle(void **p, IpcMemHandle h) {
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void *p) { return cudaIpcCloseMemHandle(p); }
inline const char *ErrorString(Error e) { return cudaGetErrorString(e); }
#endif

}  // namespace gpu

/**
 * A POSIX segment that is also pinned and mapped for the GPU: host processes attach it
 * by name, kernels reach it through DevicePointer(). Use it through this type (its
 * Create/Attach/Detach add the GPU registration to PosixShmBackend's).
 */
class PinnedShmBackend : public PosixShmBackend {
 public:
  PinnedShmBackend() = default;
  /** Unregisters and unmaps (never unlinks). */
  ~PinnedShmBackend() { Detach(); }

  /** Creates segment `name` and pins it; undone completely if pinning fails. */
  Status Create(std::string_view name, u64 data_size,
                CreateMode mode = CreateMode::kExclusive) {
    if (Status st = PosixShmBackend::Create(name, data_size, mode); !st.ok()) return st;
    if (Status st = Pin(); !st.ok()) {
      PosixShmBackend::Destroy();
      return st;
    }
    return Status::Ok();
  }

  /** Attaches segment `name` and pins it in this process; undone if pinning fails. */
  Status Attach(std::string_view name) {
    if (Status st = PosixShmBackend::Attach(name); !st.ok()) return st;
    if (Status st = Pin(); !st.ok()) {
      PosixShmBackend::Detach();
      return st;
    }
    return Status::Ok();
  }

  /** Unpins and unmaps. Idempotent. */
  void Detach() {
    if (!IsAttached()) return;
    static_cast<void>(gpu::HostUnregister(Base()));  // teardown: unmapping follows anyway
    PosixShmBackend::Detach();
  }

  /** Unpins, unmaps and removes the name. */
  Status Destroy() {
    if (!IsAttached()) {
      return Status::Error(ErrorCode::kInvalidArgument, "Destroy: no segment is attached");
    }
    std::string name(Name());
    Detach();
    return DestroyByName(name);
  }

  /** The region's base as the GPU addresses it (equal to Base() under unified addressing). */
  void *DevicePointer() const {
    void *dev = nullptr;
    if (!IsAttached() || gpu::HostGetDevicePointer(&dev, Base()) != gpu::kSuccess) return nullptr;
    return dev;
  }

 private:
  /** Registers the whole mapping with the GPU runtime. */
  Status Pin() {
    gpu::Error e = gpu::HostRegister(Base(), Size());
    if (e == gpu::kSuccess) return Status::Ok();
    return Status::Errorf(ErrorCode::kIo, "cannot pin segment '%s' for the GPU: %s", Name(),
                          gpu::ErrorString(e));
  }
};

/**
 * Device memory on one GPU, laid out like a segment (header first). The creator owns the
 * allocation and publishes IpcHandle(); other processes Attach with it. Base() is a device
 * pointer: the host never dereferences it (headers travel by memcpy).
 */
class GpuDeviceBackend : public MemoryBackend {
 public:
  GpuDeviceBackend() = default;
  /** Frees (owner) or closes (attacher) the device region. */
  ~GpuDeviceBackend() { Detach(); }

  /** Allocates at least `data_size` usable bytes on GPU `gpu_id` and exports an IPC handle. */
  Status Create(std::string_view name, u64 data_size, int gpu_id) {
    if (IsAttached() || data_size == 0) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot create device region '%.64s': %s", std::string(name).c_str(),
                            IsAttached() ? "this handle is in use" : "size is zero");
    }
    if (Status st = Check(gpu::SetDevice(gpu_id), "select GPU", name); !st.ok()) return st;
    const u64 size = RegionSize(data_size);
    void *base = nullptr;
    if (Status st = Check(gpu::Malloc(&base, size), "allocate", name); !st.ok()) return st;
    BackendHeader header{};
    WriteHeader(&header, BackendKind::kGpuDevice, size);
    Status st = Check(gpu::MemcpyToDevice(base, &header, sizeof(header)), "write header", name);
    if (st.ok()) st = Check(gpu::IpcGetMemHandle(&ipc_handle_, base), "export IPC handle", name);
    if (!st.ok()) {
      static_cast<void>(gpu::Free(base));  // undoing a failed Create; st says why
      return st;
    }
    owner_ = true;
    gpu_id_ = gpu_id;
    SetRegion(static_cast<char *>(base), size, name);
    return Status::Ok();
  }

  /** Opens another process's device region from its IPC handle and checks its header. */
  Status Attach(std::string_view name, const gpu::IpcMemHandle &handle, int gpu_id) {
    if (IsAttached()) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot attach device region '%.64s': this handle is in use",
                            std::string(name).c_str());
    }
    if (Status st = Check(gpu::SetDevice(gpu_id), "select GPU", name); !st.ok()) return st;
    void *base = nullptr;
    if (Status st = Check(gpu::IpcOpenMemHandle(&base, handle), "open IPC handle", name);
        !st.ok()) {
      return st;
    }
    BackendHeader header{};
    Status st = Check(gpu::MemcpyToHost(&header, base, sizeof(header)), "read header", name);
    if (st.ok() && (header.magic_.Load(MemOrder::kRelaxed) != kBackendMagic ||  // a copy: no race
                    header.version_ != kBackendVersion)) {
      st = Status::Errorf(ErrorCode::kVersionMismatch,
                          "device region '%.64s' has no chi header of version %u",
                          std::string(name).c_str(), kBackendVersion);
    }
    if (!st.ok()) {
      static_cast<void>(gpu::IpcCloseMemHandle(base));  // undoing a failed Attach; st says why
      return st;
    }
    owner_ = false;
    gpu_id_ = gpu_id;
    ipc_handle_ = handle;
    SetRegion(static_cast<char *>(base), header.size_, name);
    return Status::Ok();
  }

  /** Frees (owner) or closes (attacher) the region. Idempotent. */
  void Detach() {
    if (!IsAttached()) return;
    char *base = Base();
    ClearRegion();
    // Teardown: there is nothing useful to do if the GPU runtime refuses.
    if (owner_) {
      static_cast<void>(gpu::Free(base));
    } else {
      static_cast<void>(gpu::IpcCloseMemHandle(base));
    }
  }

  /** Same as Detach: device memory has no name to remove. */
  Status Destroy() {
    Detach();
    return Status::Ok();
  }

  /** What other processes pass to Attach (valid after Create). */
  const gpu::IpcMemHandle &IpcHandle() const { return ipc_handle_; }
  int GpuId() const { return gpu_id_; }

 private:
  /** Turns a CUDA/HIP error into a Status naming the region and the step. */
  static Status Check(gpu::Error e, const char *what, std::string_view name) {
    if (e == gpu::kSuccess) return Status::Ok();
    return Status::Errorf(ErrorCode::kIo, "device region '%.64s': cannot %s: %s",
                          std::string(name).c_str(), what, gpu::ErrorString(e));
  }

  gpu::IpcMemHandle ipc_handle_{};
  bool owner_ = false;
  int gpu_id_ = 0;
};

}  // namespace chi

#endif  // CHIMAERA_ENABLE_CUDA || CHIMAERA_ENABLE_ROCM
