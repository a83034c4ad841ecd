// Tasks of the admin module (chimaera::admin): pool creation and destruction,
// runtime stop, the Monitor report, client memory registration and GPU pool set-up.
// Method ids match chimaera_mod.yaml.
#pragma once

#include <string_view>  // names
#include <vector>       // report contents

#include "chi/core/fixed_string.h"   // names inside tasks
#include "chi/core/ids.h"            // PoolId
#include "chi/gpu/gpu_ipc_cache.h"   // MemoryRegistration (CUDA-free)
#include "chi/runtime/pool_manager.h"  // PoolStats
#include "chi/runtime/worker.h"      // WorkerStats
#include "chi/serialize/archive.h"   // report encoding
#include "chi/task/task.h"           // Task
#include "chi/task/task_buffer.h"    // params, report

namespace chimaera::admin {

/** Method ids (chimaera_mod.yaml). */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kMonitor = 9;
  static constexpr chi::MethodId kCreatePool = 10;
  static constexpr chi::MethodId kDestroyPool = 11;
  static constexpr chi::MethodId kStopRuntime = 12;
  static constexpr chi::MethodId kRegisterMemory = 13;
  static constexpr chi::MethodId kGpuAttachPool = 14;
};

/** Name under which the admin module registers. */
inline constexpr std::string_view kModuleName = "chimaera_admin";
/** Longest module or pool name a task carries. */
inline constexpr chi::u32 kNameBytes = 64;

/**
 * Creates a pool (or finds it, with get_or_create_). Also the task every
 * module's kCreate handler receives, once per container, to set itself up.
 */
struct CreatePoolTask : public chi::Task {
  CHI_IN chi::FixedString<kNameBytes> module_name_;
  CHI_IN chi::FixedString<kNameBytes> pool_name_;
  CHI_INOUT chi::PoolId new_pool_id_;   ///< requested id (null = pick one); the pool's id on return
  CHI_IN chi::u32 num_containers_ = 1;
  CHI_IN chi::u32 get_or_create_ = 1;   ///< 1: an existing pool of that name is returned
  CHI_IN chi::TaskBuffer params_;       ///< module-specific creation parameters

  CreatePoolTask() = default;
  CreatePoolTask(std::string_view module_name, std::string_view pool_name, chi::PoolId id,
                 chi::u32 num_containers, bool get_or_create)
      : module_name_(module_name), pool_name_(pool_name), new_pool_id_(id),
        num_containers_(num_containers), get_or_create_(get_or_create ? 1 : 0) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(module_name_, pool_name_, new_pool_id_, num_containers_, get_or_create_, params_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(new_pool_id_);
  }
};

/** Destroys a pool after its in-flight tasks finish. */
struct DestroyPoolTask : public chi::Task {
  CHI_IN chi::PoolId target_;

  DestroyPoolTask() = default;
  explicit DestroyPoolTask(chi::PoolId target) : target_(target) {}
  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(target_);
  }
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/** Asks the runtime to stop taking work and shut down. */
struct StopRuntimeTask : public chi::Task {
  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/**
 * Tells the runtime about a client's memory (IpcManager::RegisterMemory sends it). Device
 * memory carries its allocation's IPC handle; the runtime opens it on first use.
 */
struct RegisterMemoryTask : public chi::Task {
  CHI_IN chi::gpu::MemoryRegistration reg_;

  RegisterMemoryTask() = default;
  explicit RegisterMemoryTask(const chi::gpu::MemoryRegistration &reg) : reg_(reg) {}
  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(reg_);
  }
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/**
 * Makes sure GPU gpu_id_ of the runtime has a container for pool target_ (a client that
 * submits straight into the GPU's queue asks once per pool; the runtime's GpuManager builds it).
 */
struct GpuAttachPoolTask : public chi::Task {
  CHI_IN chi::u32 gpu_id_ = 0;
  CHI_IN chi::PoolId target_;

  GpuAttachPoolTask() = default;
  GpuAttachPoolTask(chi::u32 gpu_id, chi::PoolId target) : gpu_id_(gpu_id), target_(target) {}
  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(gpu_id_, target_);
  }
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/** Counters of one client-facing transport server (ZeroMQ ipc/tcp, shm). */
struct TransportStats {
  chi::FixedString<16> name_;         ///< "zmq", "shm"
  chi::u64 clients_ = 0;              ///< registered clients now
  chi::u64 clients_reaped_ = 0;       ///< clients forgotten because their process died
  chi::u64 tasks_outstanding_ = 0;    ///< remote tasks accepted, answer not yet sent
  chi::u64 bytes_held_ = 0;           ///< memory the server holds for clients
  chi::u64 requests_ = 0;             ///< task requests received
  chi::u64 requests_refused_ = 0;     ///< requests answered with an error
  chi::u64 answers_dropped_ = 0;      ///< answers whose client was gone
  chi::u64 sleeps_ = 0;               ///< times its own worker slept (zmq: the network worker)
  /** Requests found only after a sleep ran to its timeout: a lost wake-up. Expected 0. */
  chi::u64 late_wakeups_ = 0;
  /** Times a runtime thread moved off a CPU it kept sharing with a spinning client (shm). */
  chi::u64 cpu_moves_ = 0;
  /** Requests served while a task held the network worker without yielding (zmq). */
  chi::u64 rescued_ = 0;

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(name_, clients_, clients_reaped_, tasks_outstanding_, bytes_held_, requests_,
       requests_refused_, answers_dropped_, sleeps_, late_wakeups_, cpu_moves_, rescued_);
  }
};

/**
 * The runtime's memory kept for large messages between them: task payload blocks
 * (chi::LargeBlockCache) and the transports' emptied message buffers (message_buffer.h).
 */
struct PayloadCacheStats {
  chi::u64 blocks_ = 0;          ///< blocks kept for the next large payload
  chi::u64 bytes_ = 0;           ///< their mapped bytes
  chi::u64 resident_bytes_ = 0;  ///< of those, bytes whose pages were not lent to the kernel
  chi::u64 message_buffer_bytes_ = 0;  ///< emptied message buffers kept resident (warm budget)

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(blocks_, bytes_, resident_bytes_, message_buffer_bytes_);
  }
};

/** Statistics of every worker, pool and transport server, as decoded from a MonitorTask. */
struct MonitorReport {
  std::vector<chi::WorkerStats> workers_;
  std::vector<chi::PoolStats> pools_;
  std::vector<TransportStats> transports_;  ///< empty in an embedded runtime
  PayloadCacheStats payload_cache_;         ///< memory kept for large payloads

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(workers_, pools_, transports_, payload_cache_);
  }
};

/** Collects worker and pool statistics (encoded in report_). */
struct MonitorTask : public chi::Task {
  CHI_OUT chi::TaskBuffer report_;

  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(report_);
  }
  /** Decodes report_; an empty report on malformed bytes. */
  MonitorReport Decode() const {
    MonitorReport r;
    chi::InputArchive in(report_.data(), report_.size());
    in(r);
    if (!in.ok()) r = MonitorReport();
    return r;
  }
};

}  // namespace chimaera::admin
