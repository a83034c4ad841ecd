// GPU containers: a module with GPU methods gives a GpuRuntime whose handlers run on the
// device. It lists them once (GpuMethodList); the application names its GPU modules once
// (CHI_GPU_MODULES in one .cu file, orchestrator.h) and GpuModuleList folds over them.
// Invariant: dispatch is resolved at compile time by (module index, method id): no device
// virtual call, no function pointer into another module's code, so the "illegal
// instruction from a cross-library vtable" class of bug cannot happen.
//
//   struct GpuRuntime {                       // trivially copyable: it is copied to the GPU
//     static constexpr std::string_view ModuleName() { return "chimaera_demo"; }
//     CHI_GPU_FUN void GpuSubmit(GpuSubmitTask &t, chi::gpu::GpuRunContext &rctx);
//     using GpuMethods = chi::gpu::GpuMethodList<
//         chi::gpu::GpuMethod<Method::kGpuSubmit, GpuSubmitTask, &GpuRuntime::GpuSubmit>>;
//   };
#pragma once

#include <new>          // placement new of a container's initial state (host)
#include <string_view>  // module names (host)
#include <type_traits>  // is_trivially_copyable

#include "chi/core/atomic.h"        // pool table words
#include "chi/core/ids.h"           // PoolId, MethodId
#include "chi/core/macros.h"        // CHI_GPU_FUN, CHI_CROSS_FUN
#include "chi/gpu/gpu_wire.h"       // EncodeAnswer, EncodeErrorAnswer
#include "chi/gpu/mailbox.h"        // kGpuPayloadBytes: the buffer a request is served in
#include "chi/serialize/archive.h"  // InputArchive
#include "chi/task/task.h"          // Task

namespace chi::gpu {

/** What a GPU handler knows about the task it runs. */
struct GpuRunContext {
  u32 gpu_id_ = 0;         ///< the GPU running the handler
  u32 server_thread_ = 0;  ///< the orchestrator thread (index in its launch)
  PoolId pool_id_;         ///< the pool of the task
  bool from_cpu_ = false;  ///< true for tasks that came through the cpu2gpu queue
};

/** One GPU method: id, task type and the GpuRuntime member that handles it. */
template <MethodId kId, typename TaskT, auto kHandler>
struct GpuMethod {
  static constexpr MethodId kMethodId = kId;
  using TaskType = TaskT;
  static constexpr auto kRun = kHandler;
};

/**
 * Decodes the inputs of one method's task (routing header already in `base`), runs the
 * handler and encodes the answer into `buf`, which held the request. Returns its length.
 */
template <typename MethodT, typename Runtime>
CHI_GPU_FUN u32 RunGpuMethod(Runtime &rt, const Task &base, InputArchive &in, u64 id,
                             char (&buf)[kGpuPayloadBytes],
                             u32 cap, GpuRunContext &rctx) {
  typename MethodT::TaskType task;
  task.CopyRouting(base);
  task.SerializeIn(in);
  if (!in.ok()) {
    return EncodeErrorAnswer(id, ErrorCode::kMalformed, "GPU task inputs are malformed", buf, cap);
  }
  (rt.*MethodT::kRun)(task, rctx);
  return EncodeAnswer(task, id, buf, cap);  // the request was fully read: buf is free
}

/** A GpuRuntime's method table. */
template <typename... Methods>
struct GpuMethodList {
  /** True when `method` has a GPU handler. */
  CHI_CROSS_FUN static constexpr bool Has(MethodId method) {
    return ((method == Methods::kMethodId) || ...);
  }

  /** Runs `method`; *found is false (and nothing is written) when it has no handler. */
  template <typename Runtime>
  CHI_GPU_FUN static u32 Run(Runtime &rt, MethodId method, const Task &base, InputArchive &in,
                             u64 id, char (&buf)[kGpuPayloadBytes], u32 cap,
                             GpuRunContext &rctx, bool *found) {
    u32 len = 0;
    *found = ((method == Methods::kMethodId
                   ? (len = RunGpuMethod<Methods>(rt, base, in, id, buf, cap, rctx), true)
                   : false) ||
              ...);
    return len;
  }
};

/** The application's GPU modules, in the order CHI_GPU_MODULES names them. */
template <typename... Modules>
struct GpuModuleList {
  static_assert((std::is_trivially_copyable_v<Modules> && ...),
                "a GpuRuntime is built on the host and copied to the GPU: keep it trivially "
                "copyable (chi::Atomic members are)");
  static constexpr u32 kCount = sizeof...(Modules);

  /** Index of the module registered under `name`, or -1 (host). */
  static int Find(std::string_view name) {
    int index = -1;
    int i = 0;
    (void)((Modules::ModuleName() == name ? (index = i, true) : (++i, false)) || ...);
    return index;
  }

  /** Bytes of module `index`'s container state (host). */
  static u64 StateBytes(u32 index) {
    u64 bytes = 0;
    u32 i = 0;
    (void)((i++ == index ? (bytes = sizeof(Modules), true) : false) || ...);
    return bytes;
  }

  /** Constructs module `index`'s initial container state at host memory `mem` (host). */
  static void ConstructState(u32 index, void *mem) {
    u32 i = 0;
    (void)((i++ == index ? (new (mem) Modules(), true) : false) || ...);
  }

  /** Runs `method` on module `index`'s container `state`; returns the answer's length. */
  CHI_GPU_FUN static u32 Run(u32 index, void *state, MethodId method, const Task &base,
                             InputArchive &in, u64 id, char (&buf)[kGpuPayloadBytes], u32 cap,
                             GpuRunContext &rctx) {
    u32 len = 0;
    bool found = false;
    u32 i = 0;
    (void)((i++ == index ? (len = Modules::GpuMethods::Run(*static_cast<Modules *>(state), method,
                                                           base, in, id, buf, cap, rctx, &found),
                            true)
                         : false) ||
           ...);
    if (found) return len;
    return EncodeErrorAnswer(id, ErrorCode::kUnknownMethod,
                             "the pool's GPU container has no handler for this method", buf, cap);
  }
};

// ---- Pool table: which GPU container serves a pool ------------------------------------

/** Pools with GPU containers one GPU can hold. */
inline constexpr u32 kMaxGpuPools = 64;

/** One pool's GPU container; written by the host only, read by the orchestrator. */
struct GpuPoolEntry {
  Atomic<u64, MemScope::kDevice> key_;     ///< PoolId::ToU64(); 0 = empty
  Atomic<u64, MemScope::kDevice> module_;  ///< module index
  Atomic<u64, MemScope::kDevice> state_;   ///< device address of the container state
};

/** A pool binding as the host builds it. */
struct GpuPoolBinding {
  PoolId pool;
  u32 module;
  void *state;
};

/** The last lookup of one orchestrator thread (most tasks of a warp go to one pool). */
struct GpuPoolCache {
  u32 version_ = ~0u;
  u64 key_ = 0;
  u32 module_ = 0;
  void *state_ = nullptr;
};

/**
 * Pool -> (module, container state), open addressing, double-buffered: the host rewrites
 * the idle copy, then moves version_ to it, so a reader never sees a half-written table.
 */
struct GpuPoolTable {
  Atomic<u32, MemScope::kDevice> version_;  ///< tables_[version_ & 1] is live
  GpuPoolEntry tables_[2][kMaxGpuPools];

  /** Finds the container of `pool`; false when this GPU has none. */
  CHI_CROSS_FUN bool Lookup(PoolId pool, u32 *module, void **state, GpuPoolCache *cache) const {
    // acquire: the live table was completely written before version_ named it.
    const u32 v = version_.Load(MemOrder::kAcquire);
    const u64 key = pool.ToU64();
    if (cache->version_ == v && cache->key_ == key) {
      *module = cache->module_;
      *state = cache->state_;
      return true;
    }
    const GpuPoolEntry *t = tables_[v & 1];
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      const GpuPoolEntry &e = t[(Home(key) + i) % kMaxGpuPools];
      const u64 k = e.key_.Load(MemOrder::kRelaxed);  // relaxed: ordered by the acquire above
      if (k == 0) return false;
      if (k != key) continue;
      *cache = GpuPoolCache{v, key, static_cast<u32>(e.module_.Load(MemOrder::kRelaxed)),
                            reinterpret_cast<void *>(e.state_.Load(MemOrder::kRelaxed))};
      *module = cache->module_;
      *state = cache->state_;
      return true;
    }
    return false;
  }

  /** Host: rewrites copy `which` with `n` bindings (n <= kMaxGpuPools). */
  void Fill(u32 which, const GpuPoolBinding *b, u32 n) {
    GpuPoolEntry *t = tables_[which & 1];
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      t[i].key_.Store(0, MemOrder::kRelaxed);  // relaxed: published by the version flip
      t[i].module_.Store(0, MemOrder::kRelaxed);
      t[i].state_.Store(0, MemOrder::kRelaxed);
    }
    for (u32 j = 0; j < n && j < kMaxGpuPools; ++j) {
      const u64 key = b[j].pool.ToU64();
      u32 at = Home(key);
      while (t[at].key_.Load(MemOrder::kRelaxed) != 0) at = (at + 1) % kMaxGpuPools;
      t[at].key_.Store(key, MemOrder::kRelaxed);
      t[at].module_.Store(b[j].module, MemOrder::kRelaxed);
      t[at].state_.Store(reinterpret_cast<u64>(b[j].state), MemOrder::kRelaxed);
    }
  }

  /** Host, when the table is host memory: installs `n` bindings. */
  void Publish(const GpuPoolBinding *b, u32 n) {
    const u32 v = version_.Load(MemOrder::kRelaxed);  // relaxed: the host is the only writer
    Fill(v + 1, b, n);
    version_.Store(v + 1, MemOrder::kRelease);  // release: publishes the filled copy
  }

 private:
  CHI_CROSS_FUN static u32 Home(u64 key) {
    return static_cast<u32>((key * 0x9E3779B97F4A7C15ull) >> 58) % kMaxGpuPools;
  }
};

}  // namespace chi::gpu
