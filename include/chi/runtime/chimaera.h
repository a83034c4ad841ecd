// Chimaera: the process-wide runtime object and CHIMAERA_INIT / CHIMAERA_FINALIZE.
// With a runtime (kServer, or kClient with default_with_runtime / CHI_WITH_RUNTIME=1)
// it loads the config, starts the workers, creates the admin pool and the pools
// listed under `compose:`; kServer also creates the shared segments and serves
// pure clients over ZeroMQ. A pure client connects to that runtime through the
// transport CHI_IPC_MODE names. One instance per process (made before main). A child
// made by fork inherits none of it: it starts uninitialized and may CHIMAERA_INIT its own.
#pragma once

#include <pthread.h>  // pthread_atfork: a forked child forgets the parent's runtime
#include <unistd.h>   // getppid

#include <cstdio>   // fprintf for init errors
#include <climits>  // INT_MAX
#include <cstdlib>  // getenv, atexit
#include <memory>   // unique_ptr
#include <mutex>    // init/finalize are serialised
#include <new>      // placement new: a forked child's fresh init lock
#include <string>   // last error text

#include "chi/core/atomic.h"                // Atomic: the published instance, the stop flag
#include "chi/core/fork_epoch.h"            // KeepInherited: what a forked child abandons
#include "chi/core/macros.h"                // CHI_LIKELY
#include "chi/core/status.h"                // Status
#include "chi/memory/large_block_cache.h"   // the warm payload limit set from the config
#include "chi/memory/shm_room.h"            // does /dev/shm have room for our segments
#include "chi/mods/admin/admin_runtime.h"   // the admin module is always present
#include "chi/runtime/config.h"             // ServerConfig, LoadServerConfig
#include "chi/runtime/ipc_manager.h"        // IpcManager
#include "chi/runtime/pool_manager.h"       // PoolManager
#include "chi/runtime/runtime_limits.h"     // ApplyRuntimeLimits: the config's limits
#include "chi/runtime/work_orchestrator.h"  // WorkOrchestrator
#include "chi/transport/client_connect.h"   // RuntimeSegments, ConnectAnswer
#include "chi/transport/message_buffer.h"   // the warm message budget set from the config
#include "chi/transport/shm_transport.h"    // ShmServer, ShmClientTransport
#include "chi/transport/stale_segments.h"   // other ports' leftovers, swept at start
#include "chi/transport/zmq_client.h"       // pure clients over ipc/tcp
#include "chi/transport/zmq_server.h"       // the runtime's network worker
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
#include "chi/gpu/gpu_manager.h"  // GPU orchestrators, queues and the GPU worker
#endif

namespace chi {

/** How this process takes part: a client (maybe embedding a runtime) or the runtime. */
enum class ChimaeraMode : u32 { kClient = 0, kServer = 1, kRuntime = kServer };

/** The runtime and client state of this process. */
class Chimaera {
 public:
  /**
   * The process's instance (made before main: see ForgetParentState). On every submit:
   * one load and branch; the construction stays out of line (inlined, it made every call
   * save and restore six registers).
   */
  static Chimaera &Get() {
    // acquire: the instance is constructed before its address is published.
    Chimaera *made = instance_.Load(MemOrder::kAcquire);
    return CHI_LIKELY(made != nullptr) ? *made : Make();
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
      SetWarmMessageBudget(config_.warm_message_bytes);
      LargeBlockCache::Instance().SetWarmLimit(config_.warm_payload_bytes);
      st = with_runtime ? StartRuntime() : ConnectToRuntime();
    }
    if (st.ok() && mode == ChimaeraMode::kServer) st = StartServers();
    if (!st.ok()) {
      last_error_ = st;
      std::fprintf(stderr, "chi: CHIMAERA_INIT failed: %s\n", st.ToString().c_str());
      StopRuntime();
      Disconnect();
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
    Disconnect();
    initialized_ = false;
  }

  bool IsInitialized() const { return initialized_; }
  bool HasRuntime() const { return orch_ != nullptr; }
  /**
   * A pure client: the handshake answer (pid, port, segments) of the runtime it talks to
   * now; after a reconnect, the restarted runtime's.
   */
  ConnectAnswer GetConnectAnswer() const {
    ConnectAnswer answer;
    if (transport_ != nullptr && transport_->CopyConnectAnswer(&answer)) return answer;
    if (connect_answer_ != nullptr) answer = *connect_answer_;
    return answer;
  }
  /** A pure client's transport (nullptr otherwise). */
  ClientTransport *GetTransport() { return transport_.get(); }
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
  /** Registers ForgetParentState for every later fork (the instance lives until exit). */
  Chimaera() {
    pthread_atfork(nullptr, nullptr, [] { Get().ForgetParentState(); });
  }

  /**
   * In a child made by fork (only the forking thread lives on there): the runtime, the
   * connection and their threads are the parent's. They are kept, untouched and never
   * destroyed (KeepInherited): no shm slot is given back, no segment removed, no thread
   * joined, no socket closed, so the parent serves on as before. The child may call
   * CHIMAERA_INIT for a runtime or connection of its own; until then its tasks fail
   * naming the fork. Allocates and frees nothing: an allocator lock that a parent's
   * thread held at the fork stays held here (a test counts this thread's allocations).
   */
  void ForgetParentState() {
    new (&mu_) std::mutex();  // a parent thread may have held it; none of them runs here
    const bool inherited = initialized_ || orch_ != nullptr || transport_ != nullptr;
    ipc_.ForgetAfterFork(inherited ? static_cast<u32>(getppid()) : 0);
    KeepInherited(std::move(transport_));
    KeepInherited(std::move(dispatcher_));
    KeepInherited(std::move(orch_));
    KeepInherited(std::move(pools_));
    // relaxed: the child has one thread while fork handlers run.
    KeepInherited(std::unique_ptr<ZmqServer>(zmq_server_.Exchange(nullptr, MemOrder::kRelaxed)));
    KeepInherited(std::unique_ptr<ShmServer>(shm_server_.Exchange(nullptr, MemOrder::kRelaxed)));
    for (std::unique_ptr<PosixShmBackend> &seg : client_segments_) KeepInherited(std::move(seg));
    client_segments_.clear();
    segments_.Abandon();
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    gpu::GpuManager::Get().ForgetAfterFork();  // its threads and CUDA/HIP state too
#endif
    KeepInherited(std::move(connect_answer_));
    initialized_ = false;
  }

  /** Constructs the instance once (thread-safe) and publishes its address for Get. */
  [[gnu::noinline]] static Chimaera &Make() {
    static Chimaera instance;
    instance_.Store(&instance, MemOrder::kRelease);  // release: see Get
    return instance;
  }

  /** Get's fast path: the instance once made (constant-initialized, so usable at any time). */
  static inline Atomic<Chimaera *> instance_;
  /** The instance, made before main: a fork while another thread made it would leave the
   * child waiting forever on its construction guard. */
  static inline Chimaera &made_ = Get();

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
    ApplyRuntimeLimits(config_.limits);  // before any handler or answer encoder reads them
    if (Status st = orch_->Start(wc, pools_.get(), 0); !st.ok()) return st;
    ipc_.AttachRuntime(orch_.get(), 0, config_.limits.max_subtask_depth);
    if (Status st = chimaera::admin::CreateAdminPool(
            *pools_, *orch_, [] { Chimaera::Get().RequestStop(); },
            [] { return Chimaera::Get().CollectTransportStats(); });
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
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    // After composition: the orchestrators occupy SMs. A GPU problem is logged and then
    // answered on every GPU route; the CPU runtime still starts.
    gpu::GpuManager::Get().Start(config_, pools_.get(), orch_.get(), &ipc_);
#endif
    return Status::Ok();
  }

  /**
   * Removes what dead runtimes of this user left on other ports (StaleSweepOptions: at
   * least a minute old, nothing a live process owns) and says so on stderr.
   */
  void SweepOtherPorts() {
    StaleSweepOptions o;
    o.skip_port = config_.port;  // our own port's leftovers went in segments_.Create
    const StaleSweep s = SweepStaleSegments(o);
    if (s.ports.empty()) return;
    std::fprintf(stderr,
                 "chi: removed %u segments and %u ipc socket files left by dead runtimes on "
                 "%zu other ports\n",
                 s.segments, s.sockets, s.ports.size());
  }

  /**
   * Refuses to serve when /dev/shm cannot back every page the segments that carry messages
   * may take (shm_room.h): the transport's rings and the two data segments. The main
   * segment is left out: only its header, already written, is ever used.
   */
  Status CheckShmRoom() const {
    const u32 port = config_.port;
    ShmRoom room;
    Status st = MeasureShmRoom({ShmSegmentName(port), RuntimeSegmentName(port, "cdata"),
                                RuntimeSegmentName(port, "rdata")},
                               &room);
    if (!st.ok() || room.Fits()) return st;
    constexpr u64 kMiB = 1ull << 20;
    // Within Status's 160 characters for any sizes the config accepts.
    return Status::Errorf(ErrorCode::kOutOfMemory,
                          "%s: %llu MiB free < %llu MiB the segments may fill (else SIGBUS); "
                          "lower shm.main_size, shm.client_data_size, shm.runtime_data_size "
                          "or --shm-size",
                          kShmDir, static_cast<unsigned long long>(room.free / kMiB),
                          static_cast<unsigned long long>((room.unbacked + kMiB - 1) / kMiB));
  }

  /**
   * kServer: the segments (a live runtime on the port is an error, a dead one's
   * leftovers are removed), the ZeroMQ endpoints (the handshake), the shm server, the
   * check that /dev/shm can back them, then clients are let in with an answer that names
   * all of them.
   */
  Status StartServers() {
    if (Status st = segments_.Create(config_, config_.port); !st.ok()) return st;
    SweepOtherPorts();
    dispatcher_ = std::make_unique<RequestDispatcher>(pools_.get(), orch_.get());
    dispatcher_->RouteGpuTo(ipc_.GpuRoute());  // other processes' GPU-route tasks
    auto zmq = std::make_unique<ZmqServer>();
    ZmqServer::Options opt;
    opt.port = config_.port;
    opt.spin_ns = static_cast<u64>(config_.zmq_worker_spin_us) * 1000;
    opt.max_request_bytes = config_.client_data_bytes;  // one message's bound, as for shm
    opt.client_key = segments_.Key();  // tcp clients of this user prove themselves with it
    if (Status st = zmq->Start(dispatcher_.get(), opt); !st.ok()) return st;
    zmq_server_.Store(zmq.release(), MemOrder::kRelease);  // release: Monitor reads it
    auto shm = std::make_unique<ShmServer>();
    if (Status st = shm->Start(dispatcher_.get(), config_, config_.port); !st.ok()) return st;
    if (Status st = CheckShmRoom(); !st.ok()) return st;  // shm's destructor removes its segment
    ConnectAnswer answer;
    answer.runtime_pid = static_cast<u32>(getpid());
    answer.node_id = 0;
    answer.port = config_.port;
    answer.segments = segments_.Describe();
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    answer.gpu_info = gpu::GpuManager::Get().DescribeQueuesForClients();  // direct GPU route
#endif
    ShmServerInfo shm_info = shm->Info();
    OutputArchive info_ar(answer.shm_info);
    info_ar(shm_info);
    shm_server_.Store(shm.release(), MemOrder::kRelease);  // release: Monitor reads it
    zmq_server_.Load(MemOrder::kAcquire)->Open(answer);    // clients are let in
    return Status::Ok();
  }

  /** The counters Monitor reports for each transport server (worker thread). */
  std::vector<chimaera::admin::TransportStats> CollectTransportStats() {
    std::vector<chimaera::admin::TransportStats> out;
    if (ZmqServer *z = zmq_server_.Load(MemOrder::kAcquire)) {
      const ZmqServerStats s = z->Stats();
      chimaera::admin::TransportStats t;
      t.name_ = "zmq";
      t.clients_ = s.clients;
      t.clients_reaped_ = s.clients_reaped;
      t.tasks_outstanding_ = s.tasks_outstanding;
      t.bytes_held_ = s.bytes_held;
      t.requests_ = s.requests;
      t.requests_refused_ = s.requests_refused;
      t.answers_dropped_ = s.answers_dropped;
      t.sleeps_ = s.sleeps;
      t.late_wakeups_ = s.late_wakeups;
      t.rescued_ = s.rescued;
      out.push_back(t);
    }
    if (ShmServer *shm = shm_server_.Load(MemOrder::kAcquire)) {
      const ShmServer::Stats s = shm->GetStats();
      chimaera::admin::TransportStats t;
      t.name_ = "shm";
      t.clients_ = s.clients;
      t.clients_reaped_ = s.reclaimed_clients;
      t.tasks_outstanding_ = shm->TasksOutstanding();
      t.bytes_held_ = s.bytes_in_use;
      t.requests_ = s.tasks_served;
      t.requests_refused_ = s.broken_streams;
      t.cpu_moves_ = s.cpu_moves;
      out.push_back(t);
    }
    return out;
  }

  /**
   * A pure client: handshake with the runtime on this node (networking.port), attach
   * its segments (version and size checked), then route every task through the
   * transport networking.ipc_mode names. networking.connect_timeout_s bounds the first
   * connection; networking.reconnect_timeout_s is how long tasks wait for a runtime
   * that went away to return (shm repeats this handshake to rejoin it);
   * networking.zmq_spin_us is how long the client's ZeroMQ network thread busy-polls
   * after activity before it sleeps; networking.hang_timeout_s is how long tasks wait
   * on a live runtime that shows no sign of life. Each has a CHI_* environment
   * override (config.h). The default mode stays shm: bench_cross_process measured shm
   * round trips of 0.3-1 us against 54-95 us over ZeroMQ ipc/tcp on one node (the 2-core
   * VM and the 16-core host); tcp is the mode that also works when the runtime is on
   * another host.
   */
  Status ConnectToRuntime() {
    ZmqClientOptions &opt = handshake_opt_;
    opt.mode = config_.ipc_mode == "tcp" ? "tcp" : "ipc";
    opt.port = config_.port;
    opt.connect_timeout_sec = config_.connect_timeout_sec;
    opt.reconnect_sec = config_.reconnect_timeout_sec;
    opt.hang_timeout_sec = config_.hang_timeout_sec;
    opt.spin_ns = static_cast<u64>(config_.zmq_spin_us) * 1000;
    std::unique_ptr<ZmqClientTransport> zmq;
    ConnectAnswer answer;
    if (Status st = ZmqClientTransport::Connect(opt, &zmq, &answer); !st.ok()) return st;
    if (Status st = AttachRuntimeSegments(answer, &client_segments_); !st.ok()) return st;
    connect_answer_ = std::make_unique<ConnectAnswer>(answer);
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    if (Status st = gpu::GpuManager::Get().AttachClientQueues(answer.gpu_info, &ipc_); !st.ok()) {
      std::fprintf(stderr, "chi: GPU tasks go through the runtime: %s\n", st.ToString().c_str());
    }
#endif
    if (config_.ipc_mode == "shm") {  // the handshake told us where the shm segment is
      ShmServerInfo info;
      if (Status st = ShmInfoOf(answer, &info); !st.ok()) return st;
      ShmRejoin rejoin;
      rejoin.handshake = &ShmHandshake;
      rejoin.ctx = &handshake_opt_;
      rejoin.reconnect_sec = config_.reconnect_timeout_sec;
      rejoin.client.hang_timeout_sec = config_.hang_timeout_sec;
      std::unique_ptr<ShmClientTransport> shm;
      if (Status st = ShmClientTransport::Connect(info, &shm, rejoin.client); !st.ok()) return st;
      zmq->Close();  // the shm slot is the registration from here on
      transport_ = std::make_unique<ShmReconnectingTransport>(std::move(shm), rejoin, answer);
      ipc_.AttachTransport(transport_.get(), answer.node_id);
      return Status::Ok();
    }
    transport_ = std::move(zmq);
    ipc_.AttachTransport(transport_.get(), answer.node_id);
    return Status::Ok();
  }

  /** The shm server's description in a handshake answer (kUnsupported when it has none). */
  static Status ShmInfoOf(const ConnectAnswer &answer, ShmServerInfo *info) {
    return ShmInfoFromAnswer(answer, info);
  }

  /**
   * The shm client's way back to a restarted runtime (ShmRejoin; its reconnect thread):
   * a fresh ClientConnect handshake over ZeroMQ, waiting at most timeout_sec.
   */
  static Status ShmHandshake(void *ctx, double timeout_sec, ConnectAnswer *answer) {
    ZmqClientOptions opt = *static_cast<const ZmqClientOptions *>(ctx);
    opt.connect_timeout_sec = timeout_sec;
    std::unique_ptr<ZmqClientTransport> zmq;
    if (Status st = ZmqClientTransport::Connect(opt, &zmq, answer); !st.ok()) return st;
    zmq->Close();  // as at start: the new shm slot is the registration
    return Status::Ok();
  }

  /** Stops the servers (after draining the workers), the workers, and the segments. */
  void StopRuntime() {
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    gpu::GpuManager::Get().Stop();  // first: its GPU->CPU tasks still need the workers
#endif
    ZmqServer *zmq = zmq_server_.Load(MemOrder::kAcquire);
    // New remote tasks get kShutdown answers; the network worker finishes its tasks and
    // stops (before the workers: its tasks may wait on theirs).
    if (zmq != nullptr) zmq->BeginShutdown();
    // Accepted tasks finish and their answers queue.
    // The workers are joined before a server goes, so no Monitor task can still read it.
    if (orch_ != nullptr) orch_->Stop();
    if (zmq != nullptr) {
      zmq->Stop();  // sends the answers, tells clients, closes
      zmq_server_.Store(nullptr, MemOrder::kRelease);
      delete zmq;
    }
    if (ShmServer *shm = shm_server_.Exchange(nullptr, MemOrder::kAcqRel)) {
      shm->Stop();  // nothing is in flight any more; tells clients, removes its segment
      delete shm;
    }
    dispatcher_.reset();
    segments_.Destroy();
    ipc_.AttachRuntime(nullptr, 0);
    orch_.reset();
    pools_.reset();  // destroys every container
  }

  /** A pure client: fails what is pending, closes the transport, detaches the segments. */
  void Disconnect() {
#if defined(CHIMAERA_ENABLE_CUDA) || defined(CHIMAERA_ENABLE_ROCM)
    gpu::GpuManager::Get().DetachClientQueues();  // GPU tasks still waiting fail first
#endif
    ipc_.AttachTransport(nullptr, 0);
    if (transport_ != nullptr) transport_->Close();
    transport_.reset();
    client_segments_.clear();
    connect_answer_.reset();
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
  // standalone runtime (kServer)
  RuntimeSegments segments_;
  std::unique_ptr<RequestDispatcher> dispatcher_;
  Atomic<ZmqServer *> zmq_server_{nullptr};
  Atomic<ShmServer *> shm_server_{nullptr};
  // pure client
  std::unique_ptr<ClientTransport> transport_;
  std::vector<std::unique_ptr<PosixShmBackend>> client_segments_;
  /** The handshake's answer; behind a pointer so a forked child keeps it (KeepInherited). */
  std::unique_ptr<ConnectAnswer> connect_answer_;
  ZmqClientOptions handshake_opt_;  ///< read by the shm reconnect thread (ShmHandshake)
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
