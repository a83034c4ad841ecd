// Chimaera: the process-wide runtime object and CHIMAERA_INIT / CHIMAERA_FINALIZE.
// With a runtime (kServer, or kClient with default_with_runtime / CHI_WITH_RUNTIME=1)
// it loads the config, starts the workers, creates the admin pool and the pools
// listed under `compose:`. One instance per process (function-local static).
#pragma once

#include <cstdio>   // fprintf for init errors
#include <climits>  // INT_MAX
#include <cstdlib>  // getenv, atexit
#include <memory>   // unique_ptr
#include <mutex>    // init/finalize are serialised
#include <string>   // last error text

#include "chi/core/status.h"                // Status
#include "chi/mods/admin/admin_runtime.h"   // the admin module is always present
#include "chi/runtime/config.h"             // ServerConfig, LoadServerConfig
#include "chi/runtime/ipc_manager.h"        // IpcManager
#include "chi/runtime/pool_manager.h"       // PoolManager
#include "chi/runtime/work_orchestrator.h"  // WorkOrchestrator

namespace chi {

/** How this process takes part: a client (maybe embedding a runtime) or the runtime. */
enum class ChimaeraMode : u32 { kClient = 0, kServer = 1, kRuntime = kServer };

/** The runtime and client state of this process. */
class Chimaera {
 public:
  /** The process's instance. */
  static Chimaera &Get() {
    static Chimaera instance;
    return instance;
  }

  /** See CHIMAERA_INIT. */
  bool Init(ChimaeraMode mode, bool default_with_runtime) {
    std::lock_guard<std::mutex> g(mu_);
    if (initialized_) return true;
    bool with_runtime = mode == ChimaeraMode::kServer || default_with_runtime;
    if (const char *env = std::getenv("CHI_WITH_RUNTIME"); env != nullptr && env[0] != '\0') {
      with_runtime = env[0] == '1' || mode == ChimaeraMode::kServer;
    }
    Status st = LoadServerConfig(&config_);
    if (st.ok()) {
      st = with_runtime ? StartRuntime()
                        : Status::Error(ErrorCode::kUnsupported,
                                        "a pure client (no embedded runtime) needs a standalone "
                                        "runtime transport, which this build does not provide");
    }
    if (!st.ok()) {
      last_error_ = st;
      std::fprintf(stderr, "chi: CHIMAERA_INIT failed: %s\n", st.ToString().c_str());
      StopRuntime();
      return false;
    }
    mode_ = mode;
    initialized_ = true;
    if (!atexit_registered_) {
      atexit_registered_ = true;
      std::atexit([] { Chimaera::Get().Finalize(); });
    }
    return true;
  }

  /** See CHIMAERA_FINALIZE. */
  void Finalize() {
    std::lock_guard<std::mutex> g(mu_);
    if (!initialized_) return;
    StopRuntime();
    initialized_ = false;
  }

  bool IsInitialized() const { return initialized_; }
  bool HasRuntime() const { return orch_ != nullptr; }
  ChimaeraMode GetMode() const { return mode_; }
  const ServerConfig &GetConfig() const { return config_; }
  /** Why the last Init failed. */
  const Status &LastError() const { return last_error_; }
  IpcManager &Ipc() { return ipc_; }
  PoolManager *Pools() { return pools_.get(); }
  WorkOrchestrator *Orchestrator() { return orch_.get(); }

  /** Marks the runtime as asked to stop (StopRuntime task); no new tasks are taken. */
  void RequestStop() {
    stop_requested_.Store(1, MemOrder::kRelease);
    FutexWake(stop_requested_.Raw(), INT_MAX);
  }
  /** Blocks until StopRuntime was requested (standalone runtime's main loop). */
  void WaitForStop() {
    while (stop_requested_.Load(MemOrder::kAcquire) == 0) FutexWait(stop_requested_.Raw(), 0);
  }
  bool StopRequested() const { return stop_requested_.Load(MemOrder::kAcquire) != 0; }

 private:
  Chimaera() = default;

  Status StartRuntime() {
    stop_requested_.Store(0, MemOrder::kRelease);
    pools_ = std::make_unique<PoolManager>(0);
    orch_ = std::make_unique<WorkOrchestrator>();
    WorkerConfig wc;
    wc.low_latency = config_.low_latency_workers;
    wc.high_latency = config_.high_latency_workers;
    wc.queue_depth = config_.queue_depth;
    wc.lanes_per_worker = config_.lanes_per_worker;
    wc.stack_bytes = config_.fiber_stack_bytes;
    if (Status st = orch_->Start(wc, pools_.get(), 0); !st.ok()) return st;
    ipc_.AttachRuntime(orch_.get(), 0);
    if (Status st = chimaera::admin::CreateAdminPool(*pools_, *orch_,
                                                     [] { Chimaera::Get().RequestStop(); });
        !st.ok()) {
      return st;
    }
    for (const ComposeEntry &e : config_.compose) {
      Status st = chimaera::admin::ComposePool(ipc_, e);
      if (!st.ok()) {
        return Status::Errorf(ErrorCode::kBadConfig, "compose pool '%s' (%s): %s",
                              e.pool_name.c_str(), e.mod_name.c_str(), st.message());
      }
    }
    return Status::Ok();
  }

  void StopRuntime() {
    if (orch_ != nullptr) orch_->Stop();
    ipc_.AttachRuntime(nullptr, 0);
    orch_.reset();
    pools_.reset();  // destroys every container
  }

  std::mutex mu_;
  bool initialized_ = false;
  bool atexit_registered_ = false;
  ChimaeraMode mode_ = ChimaeraMode::kClient;
  ServerConfig config_;
  Status last_error_;
  IpcManager ipc_;
  std::unique_ptr<PoolManager> pools_;
  std::unique_ptr<WorkOrchestrator> orch_;
  Atomic<u32> stop_requested_;
};

/**
 * Starts chi in this process. kClient with default_with_runtime = true embeds a
 * runtime (the main use); CHI_WITH_RUNTIME=0|1 overrides that default. A second
 * call is a no-op. Returns false (and prints why) when start-up fails.
 */
inline bool CHIMAERA_INIT(ChimaeraMode mode, bool default_with_runtime = false) {
  return Chimaera::Get().Init(mode, default_with_runtime);
}

/** Stops the embedded runtime (draining queued tasks). Idempotent; also runs at exit. */
inline void CHIMAERA_FINALIZE() { Chimaera::Get().Finalize(); }

/** The process's IpcManager (task submission). */
inline IpcManager &GetIpcManager() { return Chimaera::Get().Ipc(); }

}  // namespace chi
