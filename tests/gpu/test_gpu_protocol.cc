// The GPU routes with CPU threads playing the GPU: the same mailbox, orchestrator loop,
// client and GPU-worker code as on a real GPU, over plain memory, in every build: every
// route's round trip, bad routes, abandoned slots, sequence wrap, abort, and user gpu2cpu
// queues. The queue's inline answer and request words, alone, are in test_gpu_queue_inline.cc;
// what a real GPU adds (scopes, PCIe, kernels) is covered by test_gpu_runtime (label gpu).
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/gpu/gpu_client.h>
#include <chi/gpu/gpu_server.h>
#include <chi/gpu/gpu_worker.h>
#include <chi/gpu/queue_set.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>

#include <unistd.h>

#include <atomic>
#include <string>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

using chi::u32;
using chi::u64;
using chimaera::demo::GpuRuntime;
using chimaera::demo::GpuSubmitTask;
using Modules = chi::gpu::GpuModuleList<GpuRuntime>;

const chi::PoolId kPool(410, 0);

/** Knows the pools the emulated GPU serves: every pool the runtime has. */
class AllPools : public chi::gpu::GpuPoolDirectory {
 public:
  chi::Status EnsurePool(u32, chi::PoolId pool) override {
    if (chi::Chimaera::Get().Pools()->Contains(pool)) return chi::Status::Ok();
    return chi::Status::Error(chi::ErrorCode::kUnknownPool, "no such pool");
  }
};

/** One emulated GPU: its regions in host memory, server threads, and the GpuWorker. */
class HostGpu {
 public:
  static constexpr u32 kServerThreads = 2;

  HostGpu() {
    static const bool started = chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true);
    REQUIRE(started);
    chimaera::demo::Client c;
    auto f = c.AsyncCreate(chi::PoolQuery::Dynamic(), "gpu_protocol", kPool);
    REQUIRE(f.Wait(30));
    REQUIRE(f->GetReturnCode() == 0);
    chi::gpu::GpuQueueConfig qc;
    qc.server_threads = kServerThreads;
    qc.depth = 16;
    qc.max_wait_ns = 5000000000ull;
    pinned_ = Zeroed(chi::gpu::GpuQueueSet::PinnedBytes(qc));
    device_ = Zeroed(chi::gpu::GpuQueueSet::DeviceBytes(qc));
    set_ = chi::gpu::GpuQueueSet::Carve(qc, pinned_.get(), device_.get());
    set_.WriteDescriptorsHost();
    state_ = new (set_.arena) GpuRuntime();
    const chi::gpu::GpuPoolBinding binding{kPool, 0, state_};
    set_.pools->Publish(&binding, 1);
    link_.Init(0, set_.host.cpu2gpu, set_.host.gpu2cpu);
    worker_.Start(chi::Chimaera::Get().Pools(), chi::Chimaera::Get().Orchestrator(), &pools_,
                  {&link_}, "");
    chi::GetIpcManager().AttachGpuTransport(&worker_);
    StartServers();
  }
  ~HostGpu() {
    chi::GetIpcManager().AttachGpuTransport(nullptr);
    StopServers();
    worker_.StopIntake();
    worker_.Stop();
  }

  /** Runs the orchestrator loop on CPU threads. */
  void StartServers() {
    set_.control->exit_.Store(0);
    for (u32 t = 0; t < kServerThreads; ++t) {
      servers_.emplace_back(
          [this, t] { chi::gpu::ServeLoop<Modules>(set_.Args(0), t, kServerThreads); });
    }
  }
  /** Makes the loop return (the orchestrator's exit flag) and joins it. */
  void StopServers() {
    set_.control->exit_.Store(1);
    for (auto &t : servers_) t.join();
    servers_.clear();
  }

  /** What a client kernel on this "GPU" would receive. */
  chi::gpu::GpuInfo Info() const { return set_.ClientInfo(0, static_cast<u32>(getpid())); }
  chi::gpu::GpuQueueSet &Set() { return set_; }
  chi::gpu::GpuWorker &Worker() { return worker_; }
  u64 Submits() const { return state_->gpu_submits_.Load(); }

 private:
  static std::unique_ptr<char, void (*)(void *)> Zeroed(u64 bytes) {
    void *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    REQUIRE(p != nullptr);
    std::memset(p, 0, bytes);
    return {static_cast<char *>(p), &std::free};
  }

  std::unique_ptr<char, void (*)(void *)> pinned_{nullptr, &std::free};
  std::unique_ptr<char, void (*)(void *)> device_{nullptr, &std::free};
  chi::gpu::GpuQueueSet set_;
  GpuRuntime *state_ = nullptr;
  chi::gpu::GpuLink link_;
  AllPools pools_;
  chi::gpu::GpuWorker worker_;
  std::vector<std::thread> servers_;
};

HostGpu &Gpu() {
  static HostGpu gpu;
  return gpu;
}

/** Submits like a GPU thread, waits, and returns the finished task (caller releases it). */
GpuSubmitTask *RoundTrip(const chi::PoolQuery &q, u32 value, chi::PoolId pool = kPool) {
  GpuSubmitTask *t = chi::gpu::StartTask<GpuSubmitTask>(
      Gpu().Info(), pool, q, chimaera::demo::Method::kGpuSubmit, 0u, value);
  REQUIRE(t != nullptr);
  REQUIRE(chi::gpu::WaitTask(t, 10));
  return t;
}

}  // namespace

TEST_CASE("a GPU thread's Local() task runs the GPU handler: 42 -> 126") {
  GpuSubmitTask *t = RoundTrip(chi::PoolQuery::Local(), 42);
  CHECK(t->GetReturnCode() == 0);
  CHECK(t->result_value_ == 126);
  chi::gpu::ReleaseTask(t);
}

TEST_CASE("a GPU thread's ToLocalCpu() task runs the CPU handler: 88 -> 176") {
  GpuSubmitTask *t = RoundTrip(chi::PoolQuery::ToLocalCpu(), 88);
  CHECK(t->GetReturnCode() == 0);
  CHECK(t->result_value_ == 176);
  chi::gpu::ReleaseTask(t);
}

/** Tasks completed by the runtime's own workers (not the GPU worker). */
u64 RuntimeWorkersDone() {
  u64 n = 0;
  for (const chi::WorkerStats &w : chi::Chimaera::Get().Orchestrator()->Stats()) n += w.tasks_done_;
  return n;
}

TEST_CASE("ToLocalCpu() tasks run on the GPU worker's own thread, with no hop to a worker") {
  const chi::WorkerStats before = Gpu().Worker().ThreadStats();
  CHECK(before.role_ == chi::WorkerRole::kGpuPoller);
  const u64 runtime_before = RuntimeWorkersDone();
  for (u32 i = 0; i < 50; ++i) {
    GpuSubmitTask *t = RoundTrip(chi::PoolQuery::ToLocalCpu(), i);
    CHECK(t->result_value_ == 2 * i);
    chi::gpu::ReleaseTask(t);
  }
  CHECK(Gpu().Worker().ThreadStats().tasks_done_ - before.tasks_done_ == 50);
  CHECK(RuntimeWorkersDone() == runtime_before);
}

TEST_CASE("the CPU's LocalGpuBcast and ToLocalGpu(0) run the GPU handler: 77 -> 231") {
  Gpu();
  chimaera::demo::Client client(kPool);
  auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 77);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->result_value_ == 231);
  auto g = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, 77);
  REQUIRE(g.Wait(10));
  CHECK(g->result_value_ == 231);
  auto local = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 123);
  REQUIRE(local.Wait(10));
  CHECK(local->result_value_ == 246);  // Local() from the CPU: the CPU handler
}

TEST_CASE("many CPU->GPU futures outstanding at once all complete") {
  Gpu();
  chimaera::demo::Client client(kPool);
  std::vector<chi::Future<GpuSubmitTask>> fs;
  for (u32 i = 0; i < 40; ++i)
    fs.push_back(client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(0), 0, i));
  REQUIRE(chi::WaitAll(fs, 10));
  for (u32 i = 0; i < fs.size(); ++i) CHECK(fs[i]->result_value_ == i * 3);
}

TEST_CASE("1000 sequential round trips in every route are all correct") {
  Gpu();
  chimaera::demo::Client client(kPool);
  u32 ok_gpu = 0, ok_cpu = 0, ok_c2g = 0;
  for (u32 i = 0; i < 1000; ++i) {
    GpuSubmitTask *t = RoundTrip(chi::PoolQuery::Local(), i);
    ok_gpu += t->GetReturnCode() == 0 && t->result_value_ == i * 3;
    chi::gpu::ReleaseTask(t);
    t = RoundTrip(chi::PoolQuery::ToLocalCpu(), i);
    ok_cpu += t->GetReturnCode() == 0 && t->result_value_ == i * 2;
    chi::gpu::ReleaseTask(t);
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, i);
    ok_c2g += f.Wait(10) && f->result_value_ == i * 3;
  }
  CHECK(ok_gpu == 1000);
  CHECK(ok_cpu == 1000);
  CHECK(ok_c2g == 1000);
}

TEST_CASE("concurrent GPU-side clients share the slots and every answer is theirs") {
  HostGpu &gpu = Gpu();
  const u64 before = gpu.Submits();
  constexpr u32 kThreads = 4, kEach = 200;
  std::atomic<u32> correct{0};
  std::vector<std::thread> ts;
  for (u32 c = 0; c < kThreads; ++c) {
    ts.emplace_back([&, c] {
      for (u32 i = 0; i < kEach; ++i) {
        const u32 v = c * 100000 + i;
        GpuSubmitTask *t = chi::gpu::StartTask<GpuSubmitTask>(
            gpu.Info(), kPool, chi::PoolQuery::Local(), chimaera::demo::Method::kGpuSubmit, c, v);
        if (t != nullptr && chi::gpu::WaitTask(t, 10) && t->result_value_ == v * 3 + c) ++correct;
        if (t != nullptr) chi::gpu::ReleaseTask(t);
      }
    });
  }
  for (auto &t : ts) t.join();
  CHECK(correct.load() == kThreads * kEach);
  CHECK(gpu.Submits() - before == kThreads * kEach);
}

TEST_CASE("bad GPU routes are answered with errors") {
  Gpu();
  chimaera::demo::Client client(kPool);
  SUBCASE("ToLocalGpu(99) names a GPU that does not exist") {
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalGpu(99), 0, 1);
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kInvalidArgument));
  }
  SUBCASE("a method without a GPU handler") {
    auto f = client.AsyncCustom(chi::PoolQuery::ToLocalGpu(0), "hi");
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownMethod));
  }
  SUBCASE("a task larger than the copy space") {
    auto f = client.AsyncCustom(chi::PoolQuery::ToLocalGpu(0), std::string(4000, 'x'));
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kTooLarge));
  }
  SUBCASE("a pool that does not exist") {
    chimaera::demo::Client nowhere(chi::PoolId(999, 0));
    auto f = nowhere.AsyncGpuSubmit(chi::PoolQuery::LocalGpuBcast(), 0, 1);
    REQUIRE(f.Wait(10));
    CHECK(f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownPool));
  }
  SUBCASE("a GPU thread's pool that has no GPU container") {
    GpuSubmitTask *t = RoundTrip(chi::PoolQuery::Local(), 5, chi::PoolId(999, 0));
    CHECK(t->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownPool));
    chi::gpu::ReleaseTask(t);
  }
  SUBCASE("a GPU thread's route the GPU cannot take") {
    GpuSubmitTask *t =
        chi::gpu::StartTask<GpuSubmitTask>(Gpu().Info(), kPool, chi::PoolQuery::Broadcast(),
                                           chimaera::demo::Method::kGpuSubmit, 0u, 1u);
    REQUIRE(t != nullptr);
    CHECK(chi::gpu::WaitTask(t, 1));
    CHECK(t->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnsupported));
    chi::gpu::ReleaseTask(t);
  }
}

TEST_CASE("malformed bytes sent to the orchestrator get a kMalformed answer") {
  HostGpu &gpu = Gpu();
  std::vector<char> junk(64, '\x7f');
  std::vector<char> answer;
  REQUIRE(gpu.Worker().RawRoundTrip(0, junk.data(), 64, &answer, 5000000000ull).ok());
  chi::Task header;
  chi::DecodeAnswer(&header, answer.data(), answer.size());
  CHECK(header.GetReturnCode() == static_cast<u32>(chi::ErrorCode::kMalformed));
  REQUIRE(gpu.Worker().RawRoundTrip(0, junk.data(), 4, &answer, 5000000000ull).ok());
  chi::Task tiny;
  chi::DecodeAnswer(&tiny, answer.data(), answer.size());
  CHECK(tiny.GetReturnCode() == static_cast<u32>(chi::ErrorCode::kMalformed));
}

TEST_CASE("an abandoned slot is skipped until answered, then reused") {
  HostGpu &gpu = Gpu();
  const auto &q = gpu.Set().host.gpu2gpu;
  // A client that dies holding a slot: others probe past it.
  u32 last = 0;
  const u32 held = q.TryClaim(0, ~0u, &last);
  REQUIRE(held != chi::gpu::kNoSlot);
  CHECK(last == q.records_[held].seq_);  // the claim word carries the slot's last sequence
  GpuSubmitTask *t = RoundTrip(chi::PoolQuery::Local(), 7);
  CHECK(t->result_value_ == 21);
  chi::gpu::ReleaseTask(t);
  // The host reclaims it (no client running) as ReclaimGpuSlots does, a byte memset of 2s:
  // the slot is free again after verification, and its next sequence follows the record's.
  std::memset(static_cast<void *>(&q.claims_[held]), chi::gpu::claim::kVerify, 4);
  CHECK(q.TryClaim(held, ~0u, &last) == held);
  CHECK(last == q.records_[held].seq_);
  q.Release(held, last, false);
  // A request abandoned while the orchestrator is stopped: its slot waits for the answer.
  gpu.StopServers();
  GpuSubmitTask *late = chi::gpu::StartTask<GpuSubmitTask>(
      gpu.Info(), kPool, chi::PoolQuery::Local(), chimaera::demo::Method::kGpuSubmit, 0u, 9u);
  REQUIRE(late != nullptr);
  CHECK_FALSE(chi::gpu::WaitTask(late, 0.05f));
  const u32 slot = chi::gpu::RecordOf(late)->slot_;
  const u32 late_seq = chi::gpu::RecordOf(late)->seq_;
  chi::gpu::ReleaseTask(late);
  CHECK(q.claims_[slot].Load() == chi::gpu::claim::Word(late_seq, chi::gpu::claim::kVerify));
  const u32 other = q.TryClaim(slot, ~0u, &last);
  CHECK(other != slot);  // unanswered: not reused
  q.Release(other, last, false);
  gpu.StartServers();
  GpuSubmitTask *again = RoundTrip(chi::PoolQuery::Local(), 10);
  CHECK(again->result_value_ == 30);
  chi::gpu::ReleaseTask(again);
  for (int i = 0; i < 5000 && static_cast<u32>(q.answer_[slot].Load()) != q.records_[slot].seq_;
       ++i) {
    usleep(1000);
  }
  CHECK(q.TryClaim(slot, ~0u, &last) == slot);  // answered meanwhile: reusable
  CHECK(last == q.records_[slot].seq_);  // late_seq, or a later one if `again` reused it
  q.Release(slot, last, false);
}

TEST_CASE("a slot's next request follows the sequence its claim word carries, wrapping past 0") {
  HostGpu &gpu = Gpu();
  const auto &q = gpu.Set().host.gpu2gpu;
  GpuSubmitTask *t = RoundTrip(chi::PoolQuery::Local(), 1);
  const u32 slot = chi::gpu::RecordOf(t)->slot_;
  const u32 seq = chi::gpu::RecordOf(t)->seq_;
  chi::gpu::ReleaseTask(t);
  CHECK(q.claims_[slot].Load() == chi::gpu::claim::Word(seq, chi::gpu::claim::kFree));
  // The slot's last request had the highest sequence: the next one wraps to 1, never 0.
  const u32 top = chi::gpu::kSeqMask;
  q.records_[slot].seq_ = top;
  q.answer_[slot].Store(top);
  q.claims_[slot].Store(chi::gpu::claim::Word(top, chi::gpu::claim::kFree));
  CHECK(chi::gpu::NextSeq(top) == 1);
  for (u32 v = 2; v < 6; ++v) {  // the same thread claims the same slot first each time
    GpuSubmitTask *next = RoundTrip(chi::PoolQuery::Local(), v);
    CHECK(next->result_value_ == 3 * v);
    if (chi::gpu::RecordOf(next)->slot_ == slot) CHECK(chi::gpu::RecordOf(next)->seq_ == v - 1);
    chi::gpu::ReleaseTask(next);
  }
}

TEST_CASE("a GPU-side wait gives up on the abort flag and on its timeout") {
  HostGpu &gpu = Gpu();
  gpu.StopServers();
  GpuSubmitTask *t = chi::gpu::StartTask<GpuSubmitTask>(gpu.Info(), kPool, chi::PoolQuery::Local(),
                                                        chimaera::demo::Method::kGpuSubmit, 0u, 1u);
  REQUIRE(t != nullptr);
  CHECK_FALSE(chi::gpu::WaitTask(t, 0.05f));
  gpu.Set().control->abort_.Store(1);
  CHECK(chi::gpu::WaitTask(t, 5));
  CHECK(t->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kShutdown));
  chi::gpu::ReleaseTask(t);
  gpu.Set().control->abort_.Store(0);
  gpu.StartServers();
  GpuSubmitTask *ok = RoundTrip(chi::PoolQuery::Local(), 2);
  CHECK(ok->result_value_ == 6);
  chi::gpu::ReleaseTask(ok);
}

namespace {

/** A gpu2cpu queue in plain memory, as an application makes one in its own pinned memory. */
class PlainQueue {
 public:
  explicit PlainQueue(u32 slots = 8) {
    using Q = chi::gpu::GpuQueue<chi::MemScope::kSystem>;
    const u32 payload = chi::gpu::kGpuPayloadBytes;
    shared_ = Zeroed(Q::SharedBytes(slots, payload));
    client_ = Zeroed(Q::ClientBytes(slots, true));
    server_ = Zeroed(Q::ServerBytes(slots));
    queue_ = Q::Make(slots, payload, 5000000000ull, shared_.get(), client_.get(), true,
                     server_.get(), nullptr);
  }
  chi::gpu::GpuQueue<chi::MemScope::kSystem> &Queue() { return queue_; }
  /** Gpu()'s client info with ToLocalCpu() sent through this queue. */
  chi::gpu::GpuInfo Info() {
    chi::gpu::GpuInfo info = Gpu().Info();
    info.gpu2cpu_ = &queue_;
    return info;
  }

 private:
  static std::unique_ptr<char, void (*)(void *)> Zeroed(u64 bytes) {
    void *p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    REQUIRE(p != nullptr);
    std::memset(p, 0, bytes);
    return {static_cast<char *>(p), &std::free};
  }
  std::unique_ptr<char, void (*)(void *)> shared_{nullptr, &std::free};
  std::unique_ptr<char, void (*)(void *)> client_{nullptr, &std::free};
  std::unique_ptr<char, void (*)(void *)> server_{nullptr, &std::free};
  chi::gpu::GpuQueue<chi::MemScope::kSystem> queue_;
};

}  // namespace

TEST_CASE("a registered user gpu2cpu queue carries ToLocalCpu tasks until it is unregistered") {
  chi::gpu::GpuWorker &worker = Gpu().Worker();
  PlainQueue user;
  REQUIRE(worker.RegisterQueue(user.Queue()).ok());
  CHECK(worker.RegisterQueue(user.Queue()).code() == chi::ErrorCode::kAlreadyExists);
  GpuSubmitTask *t = chi::gpu::StartTask<GpuSubmitTask>(
      user.Info(), kPool, chi::PoolQuery::ToLocalCpu(), chimaera::demo::Method::kGpuSubmit, 0u,
      88u);
  REQUIRE(t != nullptr);
  REQUIRE(chi::gpu::WaitTask(t, 10));
  CHECK(t->GetReturnCode() == 0);
  CHECK(t->result_value_ == 176);
  const u32 slot = chi::gpu::RecordOf(t)->slot_;
  CHECK(user.Queue().served_[slot] == chi::gpu::RecordOf(t)->seq_);  // served from our queue
  chi::gpu::ReleaseTask(t);
  REQUIRE(worker.UnregisterQueue(user.Queue()).ok());
  CHECK(worker.UnregisterQueue(user.Queue()).code() == chi::ErrorCode::kNotFound);
  // No longer polled: a request posted now stays unanswered, its slot untouched.
  GpuSubmitTask *late = chi::gpu::StartTask<GpuSubmitTask>(
      user.Info(), kPool, chi::PoolQuery::ToLocalCpu(), chimaera::demo::Method::kGpuSubmit, 0u,
      5u);
  REQUIRE(late != nullptr);
  CHECK_FALSE(chi::gpu::WaitTask(late, 0.2f));
  const u32 late_slot = chi::gpu::RecordOf(late)->slot_;
  CHECK(user.Queue().served_[late_slot] != chi::gpu::RecordOf(late)->seq_);
  // Registered again, the worker answers the request that waited.
  REQUIRE(worker.RegisterQueue(user.Queue()).ok());
  REQUIRE(chi::gpu::WaitTask(late, 10));
  CHECK(late->result_value_ == 10);
  chi::gpu::ReleaseTask(late);
  CHECK(worker.UnregisterQueue(user.Queue()).ok());
}

TEST_CASE("unregistering while GPU threads submit never leaves the worker touching the queue") {
  chi::gpu::GpuWorker &worker = Gpu().Worker();
  for (u32 round = 0; round < 20; ++round) {
    PlainQueue user;
    REQUIRE(worker.RegisterQueue(user.Queue()).ok());
    std::atomic<u32> stop{0}, answered{0};
    std::thread client([&] {
      for (u32 i = 0; stop.load() == 0; ++i) {
        GpuSubmitTask *t = chi::gpu::StartTask<GpuSubmitTask>(
            user.Info(), kPool, chi::PoolQuery::ToLocalCpu(), chimaera::demo::Method::kGpuSubmit,
            0u, i);
        if (t == nullptr) break;
        if (chi::gpu::WaitTask(t, 0.05f)) answered += t->result_value_ == i * 2;
        chi::gpu::ReleaseTask(t);
      }
    });
    while (answered.load() == 0) std::this_thread::yield();
    REQUIRE(worker.UnregisterQueue(user.Queue()).ok());
    // From here on the client's requests must go unserved: nothing writes the queue.
    const std::vector<u32> served(user.Queue().served_, user.Queue().served_ + 8);
    const u32 seen = answered.load();
    usleep(20000);  // the client posts more requests meanwhile
    stop.store(1);
    client.join();
    CHECK(std::vector<u32>(user.Queue().served_, user.Queue().served_ + 8) == served);
    CHECK(answered.load() <= seen + 1);  // at most the one answered before the removal
  }
}

TEST_CASE("RegisterQueue refuses bad queues and more than kMaxUserGpuQueues, naming why") {
  chi::gpu::GpuWorker &worker = Gpu().Worker();
  PlainQueue good;
  auto q = good.Queue();
  q.num_slots_ = 0;
  chi::Status st = worker.RegisterQueue(q);
  CHECK(st.code() == chi::ErrorCode::kInvalidArgument);
  CHECK(std::string(st.message()).find("slots") != std::string::npos);
  q = good.Queue();
  q.payload_bytes_ = 100;
  st = worker.RegisterQueue(q);
  CHECK(std::string(st.message()).find("payload") != std::string::npos);
  q = good.Queue();
  q.records_ = nullptr;
  st = worker.RegisterQueue(q);
  CHECK(std::string(st.message()).find("records") != std::string::npos);
  q = good.Queue();
  q.served_ = nullptr;
  CHECK(worker.RegisterQueue(q).code() == chi::ErrorCode::kInvalidArgument);
  std::vector<std::unique_ptr<PlainQueue>> many;
  for (u32 i = 0; i < chi::gpu::kMaxUserGpuQueues; ++i) {
    many.push_back(std::make_unique<PlainQueue>(1));
    REQUIRE(worker.RegisterQueue(many.back()->Queue()).ok());
  }
  PlainQueue one_more(1);
  st = worker.RegisterQueue(one_more.Queue());
  CHECK(st.code() == chi::ErrorCode::kOutOfMemory);
  CHECK(std::string(st.message()).find("too many") != std::string::npos);
  CHECK(worker.UnregisterQueue(many[3]->Queue()).ok());
  CHECK(worker.RegisterQueue(one_more.Queue()).ok());  // a freed entry is reused
  CHECK(worker.UnregisterQueue(one_more.Queue()).ok());
  for (u32 i = 0; i < many.size(); ++i) {
    if (i != 3) CHECK(worker.UnregisterQueue(many[i]->Queue()).ok());
  }
}
