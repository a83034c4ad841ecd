// Client memory the runtime may read: what RegisterMemory records, and the runtime's cache
// of opened CUDA/HIP IPC handles (opened lazily, once, and kept). Compiles without CUDA: the
// GPU calls come through GpuIpcOps, which GpuManager installs; host tests use a fake.
// Host memory of another process is never dereferenced: Read copies it with
// process_vm_readv, inside the registered range.
// Invariant: one open per (pid, device, handle bytes); an entry goes when its client registers
// a different handle at an overlapping address (address reuse) or when its process is dead.
#pragma once

#include <sys/uio.h>  // process_vm_readv: a client's host memory, read by the kernel
#include <unistd.h>   // getpid: the runtime's own registrations need no IPC open

#include <cerrno>   // errno of a failed process_vm_readv

#include <cstring>  // memcmp of handle bytes, memcpy of host reads, strerror
#include <mutex>    // registration is a control path (an open takes 45 us - 1.2 ms)
#include <new>      // placement new: a forked child's fresh lock
#include <vector>   // regions, mappings, read buffers

#include "chi/core/atomic.h"  // Atomic: the installed GPU operations
#include "chi/core/ids.h"     // PoolId of the pool hook
#include "chi/core/status.h"  // Status, ErrorCode
#include "chi/core/types.h"   // u32, u64

namespace chi::gpu {

/** Where registered memory lives (admin RegisterMemory; the seed's values). */
enum class MemoryType : u32 {
  kCpuMemory = 0,         ///< ordinary host memory
  kPinnedHostMemory = 1,  ///< host memory pinned for the GPU
  kGpuDeviceMemory = 2,   ///< device memory, shared through an IPC handle
};

/** An opaque CUDA/HIP IPC memory handle (both are 64 bytes). */
struct IpcHandleBytes {
  u64 words[8] = {};

  bool operator==(const IpcHandleBytes &o) const {
    return std::memcmp(words, o.words, sizeof(words)) == 0;
  }
  template <typename Ar>
  void serialize(Ar &ar) {
    ar(words[0], words[1], words[2], words[3], words[4], words[5], words[6], words[7]);
  }
};

/** One registration: a client's range and how the runtime reaches it. */
struct MemoryRegistration {
  u32 pid = 0;                               ///< the registering process
  MemoryType type = MemoryType::kCpuMemory;  ///< where the bytes live
  u32 device = 0;                            ///< GPU ordinal (kGpuDeviceMemory)
  u64 address = 0;                           ///< the client's address of the first byte
  u64 bytes = 0;                             ///< length of the range
  u64 alloc_offset = 0;  ///< address minus the base of its allocation (the handle's target)
  IpcHandleBytes handle;  ///< kGpuDeviceMemory: the allocation's IPC handle

  template <typename Ar>
  void serialize(Ar &ar) {
    u32 t = static_cast<u32>(type);
    ar(pid, t, device, address, bytes, alloc_offset, handle);
    type = static_cast<MemoryType>(t);
  }
};

/**
 * The GPU calls the runtime's cache needs (GpuManager installs them; no GPU: none).
 * open: maps another process's allocation; close: gives the mapping up (GpuManager defers
 * the unmap until its orchestrators stop: an unmap may wait for the whole device);
 * copy_to_host: device -> host on a stream of the runtime's own (never a device-wide wait).
 */
struct GpuIpcOps {
  Status (*open)(u32 device, const IpcHandleBytes &handle, void **base);
  void (*close)(u32 device, void *base);
  Status (*copy_to_host)(u32 device, void *dst, const void *src, u64 bytes);
};

/** The client side's GPU call: fills device, alloc_offset and handle for a device range. */
using DescribeDeviceMemoryFn = Status (*)(const void *ptr, u64 bytes, MemoryRegistration *reg);

/** The runtime's GpuManager: makes GPU gpu_id serve `pool` (for directly attached clients). */
using EnsureGpuPoolFn = Status (*)(u32 gpu_id, PoolId pool);

/**
 * The seams between CUDA-free code (admin handlers, IpcManager, this cache) and the GPU
 * build, which installs them at start; nullptr where this process has no GPU layer.
 */
struct GpuHooks {
  Atomic<const GpuIpcOps *> runtime_ops{nullptr};
  Atomic<EnsureGpuPoolFn> ensure_pool{nullptr};
  Atomic<DescribeDeviceMemoryFn> describe{nullptr};

  static GpuHooks &Get() {
    static GpuHooks hooks;
    return hooks;
  }
};

/**
 * Registered client ranges and the IPC mappings behind them. Opener provides
 * Status Open(u32 device, const IpcHandleBytes &, void **base), void Close(u32, void *)
 * and Status CopyToHost(u32 device, void *dst, const void *src, u64 bytes).
 * Calls are serialised by one mutex: this is the registration path, not the task path
 * (a runtime handler translates once per task and copies outside any queue).
 */
template <typename Opener>
class GpuIpcCache {
 public:
  explicit GpuIpcCache(Opener opener = Opener(), u32 self_pid = static_cast<u32>(getpid()))
      : opener_(opener), self_pid_(self_pid) {}
  ~GpuIpcCache() { Clear(); }
  GpuIpcCache(const GpuIpcCache &) = delete;
  GpuIpcCache &operator=(const GpuIpcCache &) = delete;

  /**
   * Records r. A region of the same client that overlaps r with another handle or type is
   * dropped first (the client freed it and reused the address), and its mapping closed once
   * nothing else uses it. Nothing is opened here.
   */
  Status Register(const MemoryRegistration &r) {
    if (r.pid == 0 || r.bytes == 0 || r.address == 0 || r.address + r.bytes < r.address) {
      return Status::Error(ErrorCode::kInvalidArgument,
                           "RegisterMemory: null address, zero size or a range that wraps");
    }
    if (static_cast<u32>(r.type) > static_cast<u32>(MemoryType::kGpuDeviceMemory)) {
      return Status::Errorf(ErrorCode::kInvalidArgument, "RegisterMemory: unknown memory type %u",
                            static_cast<u32>(r.type));
    }
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < regions_.size();) {
      const MemoryRegistration &o = regions_[i];
      const bool overlaps = o.pid == r.pid && o.address < r.address + r.bytes &&
                            r.address < o.address + o.bytes;
      if (overlaps && SameTarget(o, r) && o.address == r.address) {
        regions_[i] = r;  // the same memory registered again: keep its mapping
        return Status::Ok();
      }
      if (overlaps) {
        RemoveRegion(i);
        continue;
      }
      ++i;
    }
    regions_.push_back(r);
    return Status::Ok();
  }

  /**
   * The runtime's address of client `pid`'s [address, address + bytes), opening the IPC
   * handle on first use. kNotFound when no single registration covers the range.
   * The pointer stays valid until that client re-registers the address or dies.
   */
  Status Translate(u32 pid, u64 address, u64 bytes, void **out, MemoryType *type = nullptr,
                   u32 *device = nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    bool remote = false;
    if (Status st = TranslateLocked(pid, address, bytes, out, type, device, &remote); !st.ok()) {
      return st;
    }
    if (remote) {
      *out = nullptr;
      return Status::Errorf(ErrorCode::kUnsupported,
                            "host memory of process %u can be read (Read), not mapped into the "
                            "runtime",
                            pid);
    }
    return Status::Ok();
  }

  /**
   * Copies client `pid`'s range into *out: the runtime's own memory directly, device
   * memory through the opener, another process's host memory with process_vm_readv (the
   * kernel checks the runtime may read it; nothing outside the registered range is asked).
   */
  Status Read(u32 pid, u64 address, u64 bytes, std::vector<char> *out) {
    std::lock_guard<std::mutex> g(mu_);  // held while copying: no close can race the copy
    void *p = nullptr;
    MemoryType type = MemoryType::kCpuMemory;
    u32 device = 0;
    bool remote = false;
    if (Status st = TranslateLocked(pid, address, bytes, &p, &type, &device, &remote); !st.ok()) {
      return st;
    }
    out->resize(bytes);
    if (remote) return ReadProcessMemory(pid, address, bytes, out->data());
    if (type != MemoryType::kGpuDeviceMemory) {
      std::memcpy(out->data(), p, bytes);
      return Status::Ok();
    }
    return opener_.CopyToHost(device, out->data(), p, bytes);
  }

  /** Drops every region and mapping of `pid`; returns how many regions went. */
  u32 DropPid(u32 pid) {
    std::lock_guard<std::mutex> g(mu_);
    u32 n = 0;
    for (size_t i = 0; i < regions_.size();) {
      if (regions_[i].pid == pid) {
        RemoveRegion(i);
        ++n;
      } else {
        ++i;
      }
    }
    return n;
  }

  /** Drops the regions of every process for which alive(pid) is false. */
  template <typename Alive>
  u32 DropDead(Alive alive) {
    std::vector<u32> dead;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const MemoryRegistration &r : regions_) {
        bool seen = false;
        for (u32 d : dead) seen |= d == r.pid;
        if (!seen && r.pid != self_pid_ && !alive(r.pid)) dead.push_back(r.pid);
      }
    }
    u32 n = 0;
    for (u32 pid : dead) n += DropPid(pid);
    return n;
  }

  /** Forgets everything, closing every open mapping. */
  void Clear() {
    std::lock_guard<std::mutex> g(mu_);
    while (!regions_.empty()) RemoveRegion(regions_.size() - 1);
  }

  /**
   * In a forked child: the registrations and their mappings are the parent's (device
   * mappings do not survive fork). A fresh lock and an empty cache, nothing closed; the
   * child's own pid from now on.
   */
  void ForgetAfterFork() {
    new (&mu_) std::mutex();
    regions_.clear();
    maps_.clear();
    self_pid_ = static_cast<u32>(getpid());
  }

  size_t Regions() const {
    std::lock_guard<std::mutex> g(mu_);
    return regions_.size();
  }
  size_t OpenMappings() const {
    std::lock_guard<std::mutex> g(mu_);
    return maps_.size();
  }
  /** IPC opens and closes so far (each open is slow: the cache exists to keep this low). */
  u64 Opens() const { return opens_.Load(MemOrder::kRelaxed); }    // relaxed: a statistic
  u64 Closes() const { return closes_.Load(MemOrder::kRelaxed); }  // relaxed: a statistic

 private:
  /** One opened IPC handle, shared by the regions of one allocation. */
  struct Mapping {
    u32 pid;
    u32 device;
    IpcHandleBytes handle;
    void *base;
  };

  static bool SameTarget(const MemoryRegistration &a, const MemoryRegistration &b) {
    return a.type == b.type && a.device == b.device && a.handle == b.handle &&
           a.address - a.alloc_offset == b.address - b.alloc_offset;
  }
  static bool SameKey(const Mapping &m, const MemoryRegistration &r) {
    return m.pid == r.pid && m.device == r.device && m.handle == r.handle;
  }

  /** Removes region i; closes its mapping when no other region uses it. */
  void RemoveRegion(size_t i) {
    const MemoryRegistration r = regions_[i];
    regions_[i] = regions_.back();
    regions_.pop_back();
    if (r.type != MemoryType::kGpuDeviceMemory) return;
    for (const MemoryRegistration &o : regions_) {
      if (o.type == MemoryType::kGpuDeviceMemory && o.pid == r.pid && o.device == r.device &&
          o.handle == r.handle) {
        return;  // still in use
      }
    }
    for (size_t k = 0; k < maps_.size(); ++k) {
      if (!SameKey(maps_[k], r)) continue;
      opener_.Close(maps_[k].device, maps_[k].base);
      closes_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
      maps_[k] = maps_.back();
      maps_.pop_back();
      return;
    }
  }

  /** Reads [address, address + bytes) of process pid's memory into dst (process_vm_readv). */
  static Status ReadProcessMemory(u32 pid, u64 address, u64 bytes, char *dst) {
    u64 done = 0;
    while (done < bytes) {
      iovec local{dst + done, bytes - done};
      iovec remote{reinterpret_cast<void *>(address + done), bytes - done};
      const ssize_t n = process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
      if (n <= 0) {
        const int err = n < 0 ? errno : EFAULT;
        return Status::Errorf(err == EPERM || err == ESRCH ? ErrorCode::kPermissionDenied
                                                           : ErrorCode::kIo,
                              "reading %llu bytes of process %u at 0x%llx: %s",
                              static_cast<unsigned long long>(bytes), pid,
                              static_cast<unsigned long long>(address + done),
                              std::strerror(err));
      }
      done += static_cast<u64>(n);
    }
    return Status::Ok();
  }

  /**
   * Finds the registration covering client pid's range. *remote: it is host memory of
   * another process, which only Read may copy (no pointer of ours reaches it).
   */
  Status TranslateLocked(u32 pid, u64 address, u64 bytes, void **out, MemoryType *type,
                         u32 *device, bool *remote) {
    *remote = false;
    for (const MemoryRegistration &r : regions_) {
      if (r.pid != pid || address < r.address || address - r.address > r.bytes ||
          bytes > r.bytes - (address - r.address)) {
        continue;
      }
      if (type != nullptr) *type = r.type;
      if (device != nullptr) *device = r.device;
      const u64 into = address - r.address;
      if (r.pid == self_pid_) {
        *out = reinterpret_cast<void *>(address);  // our own memory: the address is ours
        return Status::Ok();
      }
      if (r.type != MemoryType::kGpuDeviceMemory) {
        *remote = true;
        return Status::Ok();
      }
      void *base = nullptr;
      for (const Mapping &m : maps_) {
        if (SameKey(m, r)) base = m.base;
      }
      if (base == nullptr) {
        if (Status st = opener_.Open(r.device, r.handle, &base); !st.ok()) return st;
        opens_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
        maps_.push_back(Mapping{r.pid, r.device, r.handle, base});
      }
      *out = static_cast<char *>(base) + r.alloc_offset + into;
      return Status::Ok();
    }
    return Status::Errorf(ErrorCode::kNotFound,
                          "process %u registered no memory covering 0x%llx + %llu bytes", pid,
                          static_cast<unsigned long long>(address),
                          static_cast<unsigned long long>(bytes));
  }

  Opener opener_;
  u32 self_pid_;
  mutable std::mutex mu_;
  std::vector<MemoryRegistration> regions_;
  std::vector<Mapping> maps_;
  Atomic<u64> opens_;
  Atomic<u64> closes_;
};

/** The opener of the runtime's own cache: the installed GpuIpcOps, or a clear refusal. */
struct HookedIpcOpener {
  Status Open(u32 device, const IpcHandleBytes &h, void **base) const {
    const GpuIpcOps *ops = GpuHooks::Get().runtime_ops.Load(MemOrder::kAcquire);
    if (ops == nullptr) return NoGpu();
    return ops->open(device, h, base);
  }
  void Close(u32 device, void *base) const {
    if (const GpuIpcOps *ops = GpuHooks::Get().runtime_ops.Load(MemOrder::kAcquire)) {
      ops->close(device, base);
    }
  }
  Status CopyToHost(u32 device, void *dst, const void *src, u64 bytes) const {
    const GpuIpcOps *ops = GpuHooks::Get().runtime_ops.Load(MemOrder::kAcquire);
    if (ops == nullptr) return NoGpu();
    return ops->copy_to_host(device, dst, src, bytes);
  }
  static Status NoGpu() {
    return Status::Error(ErrorCode::kUnsupported,
                         "this runtime has no GPU (or was built without CUDA/HIP): it cannot "
                         "open device memory of another process");
  }
};

/** The runtime's registrations (admin RegisterMemory fills it; handlers read through it). */
inline GpuIpcCache<HookedIpcOpener> &ClientMemory() {
  static GpuIpcCache<HookedIpcOpener> cache;
  return cache;
}

}  // namespace chi::gpu
