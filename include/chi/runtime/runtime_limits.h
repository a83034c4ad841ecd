// RuntimeLimits: the bounds a runtime holds everything that crosses into it to (the
// config's `limits:` section), and the process-wide live copy that handlers and the
// answer encoders read. Every byte a client sends is untrusted: these bounds keep one
// request from costing the runtime unbounded memory or time. Chimaera::Init applies the
// configured values when a runtime starts; until then the defaults hold.
#pragma once

#include "chi/core/atomic.h"  // the live values, read from any thread
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** Default of limits.max_output_size: the largest buffer a client decodes (1 GiB). */
inline constexpr u64 kDefaultMaxOutputSize = 1ull << 30;
/**
 * Default of limits.max_subtask_depth. Each level of a chain of waiting subtasks holds a
 * suspended fiber: 256 levels of the default 64 KiB stacks take 16 MiB, while the deepest
 * chains the project's own code builds (WaitTest benchmarks) are 200 levels.
 */
inline constexpr u32 kDefaultMaxSubtaskDepth = 256;
/** Default of limits.max_hostfile_size: a hostfile, as written or expanded (1 MiB). */
inline constexpr u64 kDefaultMaxHostfileSize = 1ull << 20;
/** Default of limits.max_hosts: hosts a hostfile may name once its ranges are expanded. */
inline constexpr u32 kDefaultMaxHosts = 65536;

/** The bounds of the config's `limits:` section; the defaults are the default file's. */
struct RuntimeLimits {
  u64 max_output_size = kDefaultMaxOutputSize;      ///< yaml: limits.max_output_size
  u32 max_subtask_depth = kDefaultMaxSubtaskDepth;  ///< yaml: limits.max_subtask_depth
  u32 max_hosts = kDefaultMaxHosts;                 ///< yaml: limits.max_hosts
  u64 max_hostfile_size = kDefaultMaxHostfileSize;  ///< yaml: limits.max_hostfile_size

  bool operator==(const RuntimeLimits &) const = default;
};

namespace detail {

/** The live output bound (see MaxOutputSize); written only while a runtime starts. */
inline Atomic<u64> live_max_output_size{kDefaultMaxOutputSize};

}  // namespace detail

/**
 * Makes `limits` the bounds of this process's runtime: called by Chimaera::Init before its
 * workers take tasks. The subtask depth bound goes to the IpcManager (AttachRuntime),
 * which checks it where it stamps a subtask.
 */
inline void ApplyRuntimeLimits(const RuntimeLimits &limits) {
  // relaxed: workers and servers that read it are started (or handed tasks) afterwards.
  detail::live_max_output_size.Store(limits.max_output_size, MemOrder::kRelaxed);
}

/**
 * The largest output a task may produce for its caller (limits.max_output_size of the
 * running runtime): handlers that allocate output on request check it first, and answers
 * encoded for callers in other processes are held to it.
 */
inline u64 MaxOutputSize() {
  return detail::live_max_output_size.Load(MemOrder::kRelaxed);  // relaxed: see Apply
}

}  // namespace chi
