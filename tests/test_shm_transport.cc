// The shared-memory transport end to end: a runtime child process serves pure clients
// through ShmServer; this process and client child processes connect with
// ShmClientTransport. Covers payloads larger than the ring, every demo call, many clients
// and many waiting threads at once, workers taking requests in themselves, and the round
// trip next to a two-process ping-pong. Killed clients, a dead runtime, bad bytes and
// refused connects are in test_shm_transport_faults.cc; the shared runtime child and
// fixtures in shm_transport_fixture.h.
#include "shm_transport_fixture.h"
#include "temp_file.h"

#include <sys/mman.h>  // the ping-pong floor's shared page
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork

#include <algorithm>  // sort
#include <chrono>     // deadlines and timing
#include <string>     // payloads, env values
#include <thread>     // threads waiting at once, sleep_for while polling
#include <vector>     // futures, samples

using namespace shm_test;

namespace {

/** One of several concurrent clients: 10^4 GpuSubmit tasks, 256 in flight at a time. */
int LoadClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  const u32 id = EnvU32("CHI_TEST_CLIENT_ID", 0);
  chimaera::demo::Client client(kPool);
  constexpr u32 kTasks = 10000;
  constexpr u32 kWindow = 256;
  u32 wrong = 0;
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> window;
  for (u32 base = 0; base < kTasks; base += kWindow) {
    window.clear();
    for (u32 j = base; j < base + kWindow && j < kTasks; ++j) {
      window.push_back(client.AsyncGpuSubmit(PoolQuery::Local(), j % 4, id * 100000 + j));
    }
    for (u32 k = 0; k < window.size(); ++k) {
      const u32 j = base + k;
      if (!window[k].Wait(30) || window[k]->GetReturnCode() != 0 ||
          window[k]->result_value_ != (id * 100000 + j) * 2 + j % 4) {
        ++wrong;
      }
    }
  }
  checks.Expect(wrong == 0, "client " + std::to_string(id) + ": " + std::to_string(wrong) +
                                " wrong or missing answers");
  chi::GetIpcManager().AttachTransport(nullptr, 0);
  tr->Close();
  return checks.Result();
}
chi_test::ChildRoutine kLoadClientRoutine("shm_load_client", LoadClientMain);

/**
 * Reports how many requests the runtime had taken in from the rings (all, and by its
 * workers) when the task started.
 */
struct ObserveTask : public chi::Task {
  CHI_OUT u64 served_at_start_ = 0;
  CHI_OUT u64 worker_taken_at_start_ = 0;

  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(served_at_start_, worker_taken_at_start_);
  }
};

/** Keeps its worker busy for spin_ns without yielding (a task that should have been
 * TASK_HIGH_LATENCY); end_ns_ is when it let go (CLOCK_MONOTONIC). */
struct HogTask : public chi::Task {
  CHI_IN u64 spin_ns_ = 0;
  CHI_OUT u64 end_ns_ = 0;

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(spin_ns_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(end_ns_);
  }
};

/** The runtime side of the order probe (runs in the runtime child). */
class OrderProbe : public chi::ModuleRuntime<OrderProbe> {
 public:
  static constexpr chi::MethodId kObserve = 10;
  static constexpr chi::MethodId kHog = 11;
  /** A pool of the probe needs nothing set up. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  /** Reads the runtime's published counters (ShmServer::ProbeStats) into the task. */
  void Observe(ObserveTask &t, chi::RunContext &) {
    chi::ShmServer::Stats s;
    if (!chi::ShmServer::ProbeStats(EnvU32("CHI_TEST_SHM_PORT", 0), &s).ok()) {
      t.SetError(ErrorCode::kNotFound, "order probe: no shm segment");
      return;
    }
    t.served_at_start_ = s.tasks_served;
    t.worker_taken_at_start_ = s.worker_taken;
  }
  /** Spins on its worker, never yielding it, for the time asked. */
  void Hog(HogTask &t, chi::RunContext &) {
    const u64 end = chi::MonotonicNs() + t.spin_ns_;
    while (chi::MonotonicNs() < end) chi::CpuRelax();
    t.end_ns_ = chi::MonotonicNs();
  }
  using Methods = chi::MethodList<
      chi::Method<0, chimaera::admin::CreatePoolTask, &OrderProbe::Create, "Create">,
      chi::Method<kObserve, ObserveTask, &OrderProbe::Observe, "Observe">,
      chi::Method<kHog, HogTask, &OrderProbe::Hog, "Hog">>;
};
const bool kOrderProbeRegistered = chi::ModuleManager::Register<OrderProbe>("order_probe");
constexpr chi::PoolId kProbePool(301, 0);

/** Sends an Observe task to the order probe pool through the attached transport. */
chi::Future<ObserveTask> Observe() {
  auto *t = chi::NewTask<ObserveTask>();
  t->pool_id_ = kProbePool;
  t->pool_query_ = PoolQuery::Local();
  t->method_ = OrderProbe::kObserve;
  return chi::GetIpcManager().Send(t);
}

/** Sends a Hog task of `spin_ns` to the order probe pool through the attached transport. */
chi::Future<HogTask> Hog(u64 spin_ns) {
  auto *t = chi::NewTask<HogTask>();
  t->pool_id_ = kProbePool;
  t->pool_query_ = PoolQuery::Local();
  t->method_ = OrderProbe::kHog;
  t->spin_ns_ = spin_ns;
  return chi::GetIpcManager().Send(t);
}

/** Creates the order probe pool through the attached transport. */
void CreateProbePool() {
  auto made = chimaera::admin::Client().AsyncCreatePool(PoolQuery::Local(), "order_probe",
                                                        "order_probe", kProbePool);
  REQUIRE(made.Wait(30));
  REQUIRE_MESSAGE(made->GetReturnCode() == 0, made->GetMessage());
}

/**
 * Starts a runtime on `port` (with `server_conf`, "" for the defaults) and four load
 * clients at once; checks that each exits 0 and that no slot was reclaimed or broken.
 * Returns the runtime's counters once every client is gone.
 */
chi::ShmServer::Stats ServeFourLoadClients(u32 port, const std::string &server_conf) {
  RuntimeProcess runtime(port, 256u << 10, 0, 8, server_conf);
  {
    AttachedClient attached(runtime.Info());
    CreateDemoPool();
  }
  std::vector<pid_t> clients;
  for (u32 k = 0; k < 4; ++k) {
    clients.push_back(chi_test::SpawnChild(
        "shm_load_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_CLIENT_ID", std::to_string(k)}}));
  }
  for (pid_t pid : clients) CHECK(chi_test::WaitChild(pid, 120) == 0);
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 0; }, 10, &stats));
  CHECK(stats.reclaimed_clients == 0);
  CHECK(stats.broken_streams == 0);
  return stats;
}

}  // namespace

TEST_CASE("a pure client echoes 16 B, 64 KiB and 4 MiB through a 256 KiB ring") {
  const u32 port = TestPort(0);
  RuntimeProcess runtime(port, 256u << 10);
  {
    AttachedClient attached(runtime.Info());
    CHECK(std::string(attached.Transport().Name()) == "shm");
    auto client = CreateDemoPool();
    CheckEcho(client, 16, 1);
    CheckEcho(client, 64u << 10, 2);
    CheckEcho(client, 4u << 20, 3);
    CheckEcho(client, 0, 4);

    chi::ShmServer::Stats stats;
    CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
    CHECK(stats.tasks_served >= 5);

    // A clean stop through the admin pool: the runtime answers, then exits 0.
    chimaera::admin::Client admin;
    auto stop = admin.AsyncStopRuntime(PoolQuery::Local());
    REQUIRE(stop.Wait(30));
    CHECK((stop->GetReturnCode() == 0 || stop->GetReturnCode() == Code(ErrorCode::kShutdown)));
  }
  CHECK(runtime.Join(30) == 0);
  chi::ShmServerInfo gone;
  CHECK(chi::ShmServer::Probe(port, &gone).code() == ErrorCode::kNotFound);
}

TEST_CASE("GpuSubmit, WaitTest, LargeOutput, errors and fire-and-forget over shm") {
  RuntimeProcess runtime(TestPort(1));
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();

  auto g = client.AsyncGpuSubmit(PoolQuery::Local(), 0, 42);
  REQUIRE(g.Wait(30));
  CHECK(g->GetReturnCode() == 0);
  CHECK(g->result_value_ == 84);
  for (u32 v = 100; v <= 104; ++v) {
    auto f = client.AsyncGpuSubmit(PoolQuery::Local(), v - 100, v);
    REQUIRE(f.Wait(30));
    CHECK(f->result_value_ == v * 2 + (v - 100));
  }

  auto w = client.AsyncWaitTest(PoolQuery::Local(), 5);
  REQUIRE(w.Wait(30));
  CHECK(w->GetReturnCode() == 0);
  CHECK(w->current_depth_ == 5);

  auto big = client.AsyncLargeOutput(PoolQuery::Local(), 1u << 20);
  REQUIRE(big.Wait(30));
  REQUIRE(big->GetReturnCode() == 0);
  REQUIRE(big->data_.size() == (1u << 20));
  u64 mismatches = 0;
  for (u64 i = 0; i < big->data_.size(); ++i) {
    if (static_cast<unsigned char>(big->data_.data()[i]) != i % 256) ++mismatches;
  }
  CHECK(mismatches == 0);

  chimaera::demo::Client ghost(chi::PoolId(999, 7));
  auto unknown_pool = ghost.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(unknown_pool.Wait(30));
  CHECK(unknown_pool->GetReturnCode() == Code(ErrorCode::kUnknownPool));
  CHECK(std::string(unknown_pool->GetMessage()).find("999.7") != std::string::npos);

  auto *bad = chi::NewTask<chimaera::demo::CustomTask>();
  bad->pool_id_ = kPool;
  bad->pool_query_ = PoolQuery::Local();
  bad->method_ = 77;
  auto unknown_method = chi::GetIpcManager().Send(bad);
  REQUIRE(unknown_method.Wait(30));
  CHECK(unknown_method->GetReturnCode() == Code(ErrorCode::kUnknownMethod));

  chi::ShmServer::Stats before;
  REQUIRE(chi::ShmServer::ProbeStats(TestPort(1), &before).ok());
  for (int i = 0; i < 100; ++i) client.CustomFireAndForget(PoolQuery::Local(), "fire");
  CheckEcho(client, 100, 6);
  chi::ShmServer::Stats after;
  auto served_all = [&](const auto &s) { return s.tasks_served >= before.tasks_served + 101; };
  CHECK(AwaitStats(TestPort(1), served_all, 10, &after));
  const auto t0 = Clock::now();
  while (attached.Transport().Outstanding() != 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(attached.Transport().Outstanding() == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
}

TEST_CASE("a runtime with more than 64 client slots serves a client in each slot it fills") {
  // Slots from 64 on are in the second word of the runtime's mask of served slots.
  constexpr u32 kSlots = 130;
  constexpr u32 kClients = 70;
  RuntimeProcess runtime(TestPort(3), 16u << 10, 0, kSlots);
  AttachedClient attached(runtime.Info());  // slot 0
  CreateDemoPool();
  std::vector<std::unique_ptr<chi::ShmClientTransport>> more(kClients - 1);
  for (auto &tr : more) {
    const chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &tr);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(TestPort(3), [&](const auto &s) { return s.clients == kClients; }, 10, &stats));
  u32 wrong = 0;
  for (u32 round = 0; round < 3; ++round) {
    for (u32 i = 0; i < more.size(); ++i) {
      const std::string data = Pattern(16 + i, round * kClients + i);
      auto f = EchoVia(*more[i], data);
      wrong += f.Wait(30) && f->GetReturnCode() == 0 && f->data_.view() == data ? 0 : 1;
    }
  }
  CHECK(wrong == 0);
  for (auto &tr : more) tr->Close();
  CHECK(AwaitStats(TestPort(3), [](const auto &s) { return s.clients == 1; }, 10, &stats));
}

TEST_CASE("four client processes send 10^4 tasks each at once and every answer is right") {
  const chi::ShmServer::Stats stats = ServeFourLoadClients(TestPort(2), "");
  CHECK(stats.tasks_served >= 40000);
}

TEST_CASE("three workers reading the rings serve four clients' 10^4 tasks each, all right") {
  // Each slot has a home worker; the others take slots over as the load asks
  // (ShmSlotAffinity), so requests and answers of one slot move between workers.
  chi_test::TempFile conf("workers:\n  low_latency: 3\n  high_latency: 1\n");
  const chi::ShmServer::Stats stats = ServeFourLoadClients(TestPort(2), conf.path());
  CHECK(stats.tasks_served >= 40000);
  CHECK(stats.worker_taken > 0);
}

namespace {

/** What one round of the hog test saw. */
struct HogRound {
  bool by_worker = false;  ///< a worker took the hog in (not the poller, through a lane)
  u64 rings = 0;           ///< times the client rang the poller for the requests behind it
};

/**
 * Sends a 1.5 s hog and then 200 tasks behind it; checks that they are answered right and
 * the first of them before the hog ends. Round 0 sends the hog at once after 200 echoes,
 * so the slot's home worker takes it in; round 1 first lets both workers park.
 */
HogRound RunHogRound(AttachedClient &attached, chimaera::demo::Client &client, u32 round) {
  constexpr u64 kHogNs = 1500000000ull;
  constexpr u32 kTasks = 200;
  for (u32 i = 0; i < 200; ++i) CheckEcho(client, 16, i);  // the slot gets a home
  // The second round lets both workers park first: the poller then takes the hog in.
  if (round == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // The counters are read through our own mapping: probing the runtime afresh maps its
  // segment, which takes long enough (under a sanitizer) for the workers to park.
  const chi::ShmSegment &segment = attached.Transport().Segment();
  const chi::ShmServerStats before = chi::shm_server::ReadShmServerStats(segment);
  auto hog = Hog(kHogNs);
  chi::ShmServerStats now = before;
  for (const auto t0 = Clock::now();
       now.tasks_served == before.tasks_served && SecondsSince(t0) < 1;) {
    now = chi::shm_server::ReadShmServerStats(segment);  // until the hog is taken in
  }
  HogRound seen;
  seen.by_worker = now.worker_taken == before.worker_taken + 1;
  // Round 0: the other worker parks meanwhile, so the first request behind the hog is
  // read by nobody until the client, done spinning for it, rings the runtime's poller.
  if (round == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const u64 rings_before = attached.Transport().PollerRings();
  const u64 taken_in_ns = chi::MonotonicNs();
  u32 right = 0;
  u64 first_ns = 0;  // when the first request behind the hog was answered
  for (u32 i = 0; i < kTasks; ++i) {
    auto g = client.AsyncGpuSubmit(PoolQuery::Local(), i % 4, i);
    if (g.Wait(30) && g->GetReturnCode() == 0 && g->result_value_ == i * 2 + i % 4) ++right;
    if (i == 0) first_ns = chi::MonotonicNs();
  }
  CHECK(right == kTasks);
  REQUIRE(hog.Wait(30));
  REQUIRE_MESSAGE(hog->GetReturnCode() == 0, hog->GetMessage());
  const std::string path = seen.by_worker ? "a worker" : "the poller (through a lane)";
  seen.rings = attached.Transport().PollerRings() - rings_before;
  MESSAGE("round " << round << ": " << path << " took the hog in; the first task behind it "
                   << "was answered " << static_cast<double>(first_ns - taken_in_ns) / 1e6
                   << " ms after it was sent; the client rang the poller " << seen.rings
                   << " times");
  // Once the slot moved, the rest follow at the machine's pace (slow when it is loaded).
  CHECK_MESSAGE(first_ns < hog->end_ns_,
                "the first task behind the hog was answered "
                    << (static_cast<double>(first_ns) - static_cast<double>(hog->end_ns_)) / 1e6
                    << " ms after it (" << path << " took it in)");
  return seen;
}

}  // namespace

TEST_CASE("a worker stuck in a long task loses its client's slot to another worker, however the hog came in") {
  // The slot's home takes the hog in from the ring and spins in it; the client's next
  // requests wait in the slot until the poller wakes the parked second worker, which takes
  // the slot over. When both workers parked before the hog came (round 1 waits for that),
  // the poller hands it to a lane and the worker it wakes polls the rings from then on, so
  // the slot moves the same way (tasks queued in a stuck worker's lane: test_lane_help).
  // Either way the first answer behind the hog comes before the hog ends; a runtime that
  // left the slot with its home would answer it only after the hog.
  const u32 port = TestPort(4);
  chi_test::TempFile conf("workers:\n  low_latency: 2\n  high_latency: 1\n");
  // Round 0 runs on a fresh runtime again (after a hog the slot no longer starts out with
  // a worker) when the client did not ring: it rings only after spinning 50 us for an
  // answer, and the poller's own look at stalled streams (every 10-20 ms) moves the slot
  // too. That look wins when the client does not get to spin first (once in a full
  // parallel ctest on 2 cores: answered after 14.5 ms, no ring), and a loaded machine may
  // let the workers park before the hog comes. A client that never rings fails every try.
  constexpr u32 kTries = 3;
  for (u32 attempt = 1;; ++attempt) {
    RuntimeProcess runtime(port, 256u << 10, 0, 8, conf.path());
    AttachedClient attached(runtime.Info());
    auto client = CreateDemoPool();
    CreateProbePool();
    const HogRound first = RunHogRound(attached, client, 0);
    const bool rang_while_stuck = first.by_worker && first.rings > 0;
    if (!rang_while_stuck && attempt < kTries) {
      MESSAGE("round 0 again on a fresh runtime: the poller took the hog in, or no ring");
      continue;
    }
    CHECK_MESSAGE(rang_while_stuck, "in " << kTries << " tries the client never rang the "
                                          << "poller while a worker was stuck in the hog");
    RunHogRound(attached, client, 1);
    break;
  }
}


TEST_CASE("awake workers take requests in themselves; once they park the poller serves again") {
  const u32 port = TestPort(0);  // the first test's runtime is gone by now
  RuntimeProcess runtime(port);
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  // Back to back: the worker that ran one task still polls when the next request lands.
  // A loaded machine may deschedule the worker now and then, so keep going (bounded)
  // until at least one request was taken in by a worker.
  chi::ShmServer::Stats stats;
  const auto start = Clock::now();
  u32 sent = 0;
  do {
    for (u32 i = 0; i < 200; ++i, ++sent) CheckEcho(client, 16, 100 + sent % 200);
    REQUIRE(chi::ShmServer::ProbeStats(port, &stats).ok());
  } while (stats.worker_taken == 0 && SecondsSince(start) < 20);
  CHECK(stats.worker_taken > 0);
  CHECK(stats.worker_taken <= stats.tasks_served);

  // Idle workers park and clear their bits, so clients wake the poller again.
  const chi::ShmSegmentHeader *header = attached.Transport().Segment().Header();
  auto readers = [&] { return header->worker_readers_.Load(chi::MemOrder::kSeqCst); };
  const auto t0 = Clock::now();
  while (readers() != 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(readers() == 0);
  // Requests sent while nobody polls the rings are still served (by the poller, or by a
  // worker it woke), whatever their size.
  for (u32 i = 0; i < 20; ++i) {
    CheckEcho(client, i % 2 == 0 ? 16 : 300000, 400 + i);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  chi::ShmServer::Stats after;
  REQUIRE(chi::ShmServer::ProbeStats(port, &after).ok());
  CHECK(after.tasks_served == stats.tasks_served + 20);
}

TEST_CASE("a request reaching an idle slot starts before the worker reads the ones behind it") {
  // Reading the next record first would fetch a line that lies in the client's cache
  // before the task could start (a transfer on every round trip). Three requests go
  // back to back into a slot the worker found empty: the first must start with only
  // itself taken in (those behind it are read afterwards). A warm-up round trip right
  // before wakes the worker (it parks after 100 us idle). Rounds in which the
  // poller took any of them (it also wakes every 20 ms) go through the lanes, and are
  // retried. A worker that did not get the CPU for another look before the three arrived
  // (a loaded machine, a sanitizer) reads them as a queue: at least one of the worker's
  // rounds must show the first one starting alone, which a worker that always reads the
  // next record first never does. Rounds go on until one does (up to 40 by workers, 400
  // in all): with other tests running beside it on two CPUs, 40 rounds sometimes all
  // went through the poller, and 5 by workers sometimes all read the three as a queue.
  const u32 port = TestPort(0);
  RuntimeProcess runtime(port);
  AttachedClient attached(runtime.Info());
  CreateProbePool();
  u32 rounds_by_workers = 0;
  u32 started_alone = 0;
  u64 most_taken_first = 0;  // the most requests taken in before a first task started
  for (u32 round = 0; round < 400 && rounds_by_workers < 40 && started_alone == 0; ++round) {
    chi::ShmServer::Stats before;
    REQUIRE(chi::ShmServer::ProbeStats(port, &before).ok());
    auto warm = Observe();
    REQUIRE(warm.Wait(30));
    REQUIRE_MESSAGE(warm->GetReturnCode() == 0, warm->GetMessage());
    // Time for the worker to look at the empty slot again (it then reads the next request
    // alone), well short of the 100 us after which it parks.
    const u64 look = chi::MonotonicNs() + 30000;
    while (chi::MonotonicNs() < look) chi::CpuRelax();
    chi::Future<ObserveTask> f[3] = {Observe(), Observe(), Observe()};
    for (auto &x : f) {
      REQUIRE(x.Wait(30));
      REQUIRE_MESSAGE(x->GetReturnCode() == 0, x->GetMessage());
    }
    chi::ShmServer::Stats after;
    REQUIRE(chi::ShmServer::ProbeStats(port, &after).ok());
    REQUIRE(after.tasks_served == before.tasks_served + 4);
    // The warm-up counted itself at its start when a worker took it in.
    const u64 warm_by_worker = warm->worker_taken_at_start_ - before.worker_taken;
    if (after.worker_taken != before.worker_taken + warm_by_worker + 3) continue;
    ++rounds_by_workers;
    if (f[0]->served_at_start_ == before.tasks_served + 2) {
      ++started_alone;
    } else {
      const u64 taken = f[0]->served_at_start_ - before.tasks_served - 1;
      if (taken > most_taken_first) most_taken_first = taken;
    }
  }
  CHECK(rounds_by_workers > 0);
  CHECK_MESSAGE(started_alone > 0, "in none of " << rounds_by_workers
                                                 << " rounds did the first task start alone "
                                                    "(up to "
                                                 << most_taken_first
                                                 << " of the three were taken in first)");
}

TEST_CASE("round trip of a 16 B task over shm, printed next to a two-process shm ping-pong") {
  // The floor: two processes bouncing a counter through one shared page.
  constexpr u32 kRounds = 200000;
  auto *page = static_cast<char *>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(page != MAP_FAILED);
  auto *ping = new (page) chi::Atomic<u64>(0);
  auto *pong = new (page + 256) chi::Atomic<u64>(0);
  pid_t pid = fork();
  if (pid == 0) {
    for (u64 i = 1; i <= kRounds; ++i) {
      for (u64 spins = 0; ping->Load(chi::MemOrder::kAcquire) != i; ++spins) {
        if (spins > (1ull << 32)) _exit(1);
        chi::CpuRelax();
      }
      pong->Store(i, chi::MemOrder::kRelease);
    }
    _exit(0);
  }
  std::vector<double> floor_ns;
  auto t = Clock::now();
  for (u64 i = 1; i <= kRounds; ++i) {
    ping->Store(i, chi::MemOrder::kRelease);
    while (pong->Load(chi::MemOrder::kAcquire) != i) chi::CpuRelax();
    if (i % 1000 == 0) {
      auto now = Clock::now();
      floor_ns.push_back(std::chrono::duration<double, std::nano>(now - t).count() / 1000);
      t = now;
    }
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  munmap(page, 4096);

  RuntimeProcess runtime(TestPort(7));
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  auto measure = [&](auto submit) {
    std::vector<double> samples;
    for (int batch = 0; batch < 40; ++batch) {
      auto t0 = Clock::now();
      for (int i = 0; i < 250; ++i) submit(i);
      samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 250);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
  };
  u32 wrong = 0;
  const std::string data(16, 'q');
  auto echo = [&](int) {
    auto f = client.AsyncCustom(PoolQuery::Local(), data);
    if (!f.Wait(10) || f->data_.size() != 16) ++wrong;
  };
  auto gpu = [&](int i) {
    auto f = client.AsyncGpuSubmit(PoolQuery::Local(), 1, static_cast<u32>(i));
    if (!f.Wait(10) || f->result_value_ != static_cast<u32>(i) * 2 + 1) ++wrong;
  };
  measure(echo);  // warm-up
  const double echo_ns = measure(echo);
  const double gpu_ns = measure(gpu);
  std::sort(floor_ns.begin(), floor_ns.end());
  const double floor = floor_ns[floor_ns.size() / 2];
  MESSAGE("shm round trip (median of 40 x 250): Custom 16 B " << echo_ns << " ns, GpuSubmit "
          << gpu_ns << " ns | two-process shm ping-pong " << floor << " ns | ratio "
          << echo_ns / floor << " / " << gpu_ns / floor << " | answers delivered by waiting "
          << "callers: " << attached.Transport().HelpedAnswers());
  CHECK(wrong == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
}

TEST_CASE("threads waiting at once deliver each other's answers and every task gets its own") {
  RuntimeProcess runtime(TestPort(1));  // that test's runtime is gone by now
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  constexpr u32 kThreads = 4;
  constexpr u32 kRounds = 1500;
  chi::Atomic<u32> wrong;
  std::vector<std::thread> threads;
  for (u32 id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      for (u32 i = 0; i < kRounds; ++i) {
        const std::string data = Pattern(16 + (i % 3) * 1000, id * 100000 + i);
        auto f = client.AsyncCustom(PoolQuery::Local(), data);
        auto g = client.AsyncGpuSubmit(PoolQuery::Local(), id, i);
        const bool ok = f.Wait(30) && f->GetReturnCode() == 0 && f->data_.view() == data &&
                        g.Wait(30) && g->GetReturnCode() == 0 && g->result_value_ == i * 2 + id;
        if (!ok) wrong.FetchAdd(1, chi::MemOrder::kRelaxed);
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(wrong.Load() == 0);
  CHECK(attached.Transport().Outstanding() == 0);
  CHECK(attached.Transport().StrayAnswers() == 0);
  CHECK(attached.Transport().Failure() == ErrorCode::kOk);
  MESSAGE("answers delivered by waiting callers: " << attached.Transport().HelpedAnswers()
          << " of " << 2 * kThreads * kRounds);
}
