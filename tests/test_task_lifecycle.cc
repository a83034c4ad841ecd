// Task and runtime lifecycle: periodic tasks, fire-and-forget memory, pool
// destruction with tasks in flight, repeated init/finalize, idle CPU use, and
// the fiber shells tasks run on (reused task after task, ended at exit, and
// surviving a handler that throws), and task memory in a process forked meanwhile.
#include "child_process.h"
#include "embedded_fixture.h"
#include "fork_while_busy.h"
#include "temp_file.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using chi::PoolQuery;

namespace {

constexpr chi::u64 kMs = 1000000ull;

/** CPU seconds (user + system) this process has used, from /proc/self/stat. */
double ProcessCpuSeconds() {
  std::ifstream in("/proc/self/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    rest >> field;
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

chimaera::admin::Client admin;

void Destroy(chi::PoolId id) {
  auto d = admin.AsyncDestroyPool(PoolQuery::Local(), id);
  REQUIRE(d.Wait(60));
  REQUIRE_MESSAGE(d->GetReturnCode() == 0, d->GetMessage());
}

}  // namespace

TEST_CASE("a periodic task runs about duration/period times and stops when its pool is destroyed") {
  auto client = chi_test::MakeDemoPool("periodic", chi::PoolId(230, 0));
  auto f = client.AsyncPeriodicCount(PoolQuery::Local(), 10.0 * kMs);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK_FALSE(f.IsComplete());
  Destroy(chi::PoolId(230, 0));
  REQUIRE(f.Wait(10));
  CAPTURE(f->runs_);
  CHECK(f->runs_ >= 35);
  CHECK(f->runs_ <= 65);
}

TEST_CASE("a cancelled periodic task completes after its current run") {
  auto client = chi_test::MakeDemoPool("periodic2", chi::PoolId(231, 0));
  auto f = client.AsyncPeriodicCount(PoolQuery::Local(), 1.0 * kMs);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  chi::IpcManager::Cancel(f.get());
  REQUIRE(f.Wait(10));
  CHECK(f->runs_ >= 1);
  CHECK(f->GetReturnCode() == 0);
}

TEST_CASE("fire-and-forget tasks are freed by the runtime") {
  auto client = chi_test::MakeDemoPool("fnf", chi::PoolId(232, 0));
  client.AsyncCustom(PoolQuery::Local(), "warm-up").Wait();
  const chi::i64 baseline = chi::TaskMemory::LiveBlocks();
  for (int i = 0; i < 10000; ++i) client.CustomFireAndForget(PoolQuery::Local(), "payload");
  chi::i64 live = 0;
  for (int i = 0; i < 1000; ++i) {
    live = chi::TaskMemory::LiveBlocks();
    if (live == baseline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(live == baseline);
  auto f = client.AsyncCustom(PoolQuery::Local(), "still serving");
  REQUIRE(f.Wait(10));
  CHECK(f->data_.view() == "still serving");
}

TEST_CASE("dropping an unfinished Future leaks nothing") {
  auto client = chi_test::MakeDemoPool("orphans", chi::PoolId(233, 0));
  client.AsyncCustom(PoolQuery::Local(), "warm-up").Wait();
  const chi::i64 baseline = chi::TaskMemory::LiveBlocks();
  for (int i = 0; i < 2000; ++i) {
    auto f = client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kRead, 0);
  }
  chi::i64 live = 0;
  for (int i = 0; i < 1000 && (live = chi::TaskMemory::LiveBlocks()) != baseline; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(live == baseline);
}

TEST_CASE("DestroyPool with 1000 tasks in flight answers every task") {
  auto client = chi_test::MakeDemoPool("doomed", chi::PoolId(234, 0));
  std::vector<chi::Future<chimaera::demo::LockHoldTask>> fs;
  for (int i = 0; i < 1000; ++i) {
    fs.push_back(client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kRead, 1 * kMs));
  }
  Destroy(chi::PoolId(234, 0));
  int ok = 0, refused = 0;
  for (auto &f : fs) {
    REQUIRE(f.Wait(30));
    if (f->GetReturnCode() == 0) {
      ++ok;
    } else {
      CHECK(f->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kUnknownPool));
      ++refused;
    }
  }
  CHECK(ok + refused == 1000);
  auto after = client.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(after.Wait(10));
  CHECK(after->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kUnknownPool));
}

TEST_CASE("an idle embedded runtime uses under 2% of a core") {
  auto client = chi_test::MakeDemoPool("idle", chi::PoolId(235, 0));
  for (int i = 0; i < 100; ++i) client.AsyncCustom(PoolQuery::Local(), "busy").Wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // workers settle and park
  const double cpu0 = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = ProcessCpuSeconds() - cpu0;
  CAPTURE(used);
  CHECK(used < 0.04);
  auto f = client.AsyncCustom(PoolQuery::Local(), "awake");
  REQUIRE(f.Wait(10));
  CHECK(f->data_.view() == "awake");
}

TEST_CASE("init and finalize 20 times in fresh processes") {
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    CHECK(chi_test::RunChild("lifecycle") == 0);
  }
}

TEST_CASE("a runtime with 2+1 workers and 3 lanes each serves concurrent clients") {
  chi_test::TempFile conf(
      "workers:\n  low_latency: 2\n  high_latency: 1\nlanes_per_worker: 3\nqueue_depth: 64\n");
  CHECK(chi_test::RunChild("multi_lane", {{"CHI_SERVER_CONF", conf.path()}}) == 0);
}

namespace {

/** Child: init (twice), create a pool, run a task, finalize (twice). */
int LifecycleChild() {
  chi_test::ChildChecks c;
  c.Expect(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "first init");
  c.Expect(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "second init is a no-op");
  chimaera::demo::Client demo;
  auto f = demo.AsyncCreate(PoolQuery::Local(), "life", chi::PoolId(240, 0));
  c.Expect(f.Wait(30) && f->GetReturnCode() == 0, "pool created");
  auto g = demo.AsyncGpuSubmit(PoolQuery::Local(), 1, 20);
  c.Expect(g.Wait(30) && g->result_value_ == 41, "GpuSubmit 20 on gpu 1 gives 41");
  chi::CHIMAERA_FINALIZE();
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kLifecycle("lifecycle", &LifecycleChild);

/** Child: two client threads push 5000 tasks each through small lanes (back-pressure). */
int MultiLaneChild() {
  chi_test::ChildChecks c;
  c.Expect(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "init");
  c.Expect(chi::Chimaera::Get().Orchestrator()->NumWorkers() == 3, "3 workers from the config");
  chimaera::demo::Client demo;
  c.Expect(demo.AsyncCreate(PoolQuery::Local(), "lanes", chi::PoolId(241, 0), 2).Wait(30), "pool");
  std::atomic<int> wrong{0};
  std::atomic<int> bad_node{0};  // a root task's node is (its unique id, 0)
  std::vector<chi::u64> ids[2];   // task ids each thread got (each thread takes id blocks)
  auto client_thread = [&](chi::u32 base, std::vector<chi::u64> *got) {
    std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> fs;
    for (chi::u32 i = 0; i < 5000; ++i) fs.push_back(demo.AsyncGpuSubmit(PoolQuery::DirectHash(i), 1, base + i));
    for (chi::u32 i = 0; i < 5000; ++i) {
      if (!fs[i].Wait(30) || fs[i]->result_value_ != (base + i) * 2 + 1) ++wrong;
      got->push_back(fs[i]->task_id_.unique_);
      if (!(fs[i]->task_node_ == chi::TaskNode(fs[i]->task_id_.unique_, 0))) ++bad_node;
    }
  };
  std::thread a(client_thread, 0, &ids[0]), b(client_thread, 100000, &ids[1]);
  a.join();
  b.join();
  c.Expect(wrong.load() == 0, "every result correct");
  std::vector<chi::u64> all(ids[0]);
  all.insert(all.end(), ids[1].begin(), ids[1].end());
  std::sort(all.begin(), all.end());
  c.Expect(all.size() == 10000 && std::adjacent_find(all.begin(), all.end()) == all.end(),
           "10000 distinct task ids across the two threads");
  c.Expect(bad_node.load() == 0, "each root task's node is its own id");
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kMultiLane("multi_lane", &MultiLaneChild);

}  // namespace

TEST_CASE("pools listed under compose: exist as soon as CHIMAERA_INIT returns") {
  const std::string path = "/tmp/chi_compose_" + std::to_string(getpid()) + ".yaml";
  FILE *f = std::fopen(path.c_str(), "w");
  std::fputs(
      "compose:\n"
      "  - mod_name: chimaera_demo\n    pool_name: composed\n    pool_id: \"260.0\"\n"
      "    pool_query: local\n    num_containers: 3\n"
      "  - mod_name: chimaera_demo\n    pool_name: composed2\n    pool_id: \"261.0\"\n",
      f);
  std::fclose(f);
  CHECK(chi_test::RunChild("compose", {{"CHI_SERVER_CONF", path}}) == 0);
  f = std::fopen(path.c_str(), "w");
  std::fputs("compose:\n  - mod_name: no_such_module\n    pool_name: broken\n    pool_id: \"262.0\"\n", f);
  std::fclose(f);
  CHECK(chi_test::RunChild("compose_unknown_module", {{"CHI_SERVER_CONF", path}}) == 0);
  std::remove(path.c_str());
}

namespace {

/** Child: the composed pools answer at once, with the container count from the config. */
int ComposeChild() {
  chi_test::ChildChecks c;
  c.Expect(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "init");
  chimaera::demo::Client composed(chi::PoolId(260, 0));
  auto f = composed.AsyncCustom(PoolQuery::Broadcast(), "hi");
  c.Expect(f.Wait(30) && f->GetReturnCode() == 0, "broadcast to the composed pool");
  c.Expect(f->visits_ == 3, "three containers from num_containers");
  chimaera::demo::Client second(chi::PoolId(261, 0));
  auto g = second.AsyncGpuSubmit(PoolQuery::Local(), 0, 5);
  c.Expect(g.Wait(30) && g->result_value_ == 10, "second composed pool serves");
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kCompose("compose", &ComposeChild);

/** Child: a compose entry naming an unknown module makes init fail and says which. */
int ComposeUnknownModuleChild() {
  chi_test::ChildChecks c;
  c.Expect(!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "init fails");
  const std::string msg = chi::Chimaera::Get().LastError().message();
  c.Expect(msg.find("broken") != std::string::npos, "message names the pool: " + msg);
  c.Expect(msg.find("no_such_module") != std::string::npos, "message names the module: " + msg);
  return c.Result();
}
const chi_test::ChildRoutine kComposeUnknown("compose_unknown_module", &ComposeUnknownModuleChild);

}  // namespace

// ---- Fiber shells ------------------------------------------------------------

namespace {

/** What ShellJobBody does, set by the test between switches. */
struct ShellJobs {
  int handed = 0;            ///< jobs handed to the shell and not taken yet
  bool wait_inside = false;  ///< a job suspends once in its middle
  int finished = 0;          ///< jobs that ran to their end
  int cleaned = 0;           ///< job locals destroyed (at the end, or by an unwind)
};

/** A FiberShell body: takes a handed job, runs it, suspends; returns when none is handed. */
void ShellJobBody(void *arg, chi::FiberShell &shell) {
  auto *jobs = static_cast<ShellJobs *>(arg);
  while (jobs->handed > 0) {
    --jobs->handed;
    {
      struct Local {
        ShellJobs *jobs;
        ~Local() { ++jobs->cleaned; }
      } local{jobs};
      if (jobs->wait_inside) shell.Suspend();
      ++jobs->finished;
    }
    shell.Suspend();
  }
}

/** Sums over every worker of the embedded runtime: tasks done, fiber shells and stacks. */
struct FiberCounts {
  chi::u64 tasks = 0;
  chi::u64 fibers = 0;
  chi::u64 stacks = 0;
};
FiberCounts CountFibers() {
  FiberCounts c;
  for (const chi::WorkerStats &w : chi::Chimaera::Get().Orchestrator()->Stats()) {
    c.tasks += w.tasks_done_;
    c.fibers += w.fibers_;
    c.stacks += w.stacks_;
  }
  return c;
}

}  // namespace

TEST_CASE("a fiber shell runs job after job, ends when idle and unwinds a job left suspended") {
  chi::FiberSanitizerState owner;
  owner.AdoptCurrentThread();
  ShellJobs jobs;
  chi::ShellPool pool(64 * 1024, &owner, &ShellJobBody, &jobs);
  for (int i = 0; i < 1000; ++i) {
    chi::FiberShell *s = pool.Take();
    jobs.handed = 1;
    REQUIRE(s->Enter());
    pool.Give(s);
  }
  CHECK(jobs.finished == 1000);
  CHECK(pool.Created() == 1);

  // A shell suspended inside its job is not idle: a second job gets a second shell.
  jobs.wait_inside = true;
  chi::FiberShell *a = pool.Take();
  jobs.handed = 1;
  REQUIRE(a->Enter());
  chi::FiberShell *b = pool.Take();
  CHECK(b != a);
  jobs.handed = 1;
  REQUIRE(b->Enter());
  CHECK(pool.Created() == 2);
  REQUIRE(b->Enter());  // b's job ends
  pool.Give(b);
  CHECK(jobs.finished == 1001);

  pool.EndIdle();  // b's body returns; a is still inside its job
  CHECK(pool.Live() == 1);
  CHECK(a->Abandon());  // a's job unwinds: its local is destroyed, the job never finishes
  CHECK(pool.Live() == 0);
  CHECK(jobs.finished == 1001);
  CHECK(jobs.cleaned == 1002);
  CHECK(pool.Stacks().TotalStacks() == 2);
  CHECK(pool.Stacks().FreeStacks() == 2);  // both stacks came back when their shells ended
}

TEST_CASE("ten thousand tasks that wait inside their fibers reuse a bounded set of fiber shells") {
  auto client = chi_test::MakeDemoPool("shells", chi::PoolId(236, 0));
  REQUIRE(client.AsyncWaitTest(PoolQuery::Local(), 2).Wait(30));
  const FiberCounts before = CountFibers();
  constexpr int kRounds = 100;
  constexpr int kConcurrent = 20;
  constexpr chi::u32 kDepth = 5;  // each task waits on a subtask, five deep
  for (int round = 0; round < kRounds; ++round) {
    std::vector<chi::Future<chimaera::demo::WaitTestTask>> fs;
    for (int i = 0; i < kConcurrent; ++i) {
      fs.push_back(client.AsyncWaitTest(PoolQuery::Local(), kDepth));
    }
    for (auto &f : fs) {
      REQUIRE(f.Wait(30));
      REQUIRE(f->current_depth_ == kDepth);
    }
  }
  const FiberCounts after = CountFibers();
  CAPTURE(after.fibers - before.fibers);
  CHECK(after.tasks - before.tasks >= chi::u64{kRounds} * kConcurrent * kDepth);
  // At most kConcurrent * kDepth tasks are in progress at once; a fiber per task would be 10000.
  CHECK(after.fibers - before.fibers <= chi::u64{kConcurrent} * kDepth);
  CHECK(after.stacks == after.fibers);  // a shell keeps its one stack for life
}

namespace chi_test_thrower {

/** Method ids of the test-only "thrower" module. */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kThrow = 10;
};

/** A task whose handler throws: kind 0 a std::runtime_error, 1 an int, 2 nothing. */
struct ThrowTask : public chi::Task {
  CHI_IN chi::u32 kind_ = 0;
  CHI_IN chi::u32 sleep_first_ = 0;  ///< suspend the fiber once before throwing
  CHI_OUT chi::u32 ran_ = 0;

  template <typename Ar> void SerializeIn(Ar &ar) { ar(kind_, sleep_first_); }
  template <typename Ar> void SerializeOut(Ar &ar) { ar(ran_); }
};

/** Runtime side of the thrower module. */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  void Throw(ThrowTask &t, chi::RunContext &) {
    // Only suspends the fiber first; a sleep cut short changes nothing here.
    if (t.sleep_first_ != 0) static_cast<void>(chi::SleepFor(100000));
    t.ran_ = 1;
    if (t.kind_ == 0) throw std::runtime_error("boom");
    if (t.kind_ == 1) throw 42;
  }
  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, chimaera::admin::CreatePoolTask, &Runtime::Create, "Create">,
      chi::Method<Method::kThrow, ThrowTask, &Runtime::Throw, "Throw">>;
};
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>("chi_test_thrower");

/** Client side of the thrower module. */
class Client : public chi::ContainerClient {
 public:
  explicit Client(chi::PoolId id) : ContainerClient(id) {}
  chi::Future<ThrowTask> AsyncThrow(chi::u32 kind, bool sleep_first) {
    ThrowTask *t = MakeTask<ThrowTask>(pool_id_, PoolQuery::Local(), Method::kThrow);
    t->kind_ = kind;
    t->sleep_first_ = sleep_first ? 1 : 0;
    return Submit(t);
  }
};

}  // namespace chi_test_thrower

TEST_CASE("a handler that throws is answered with kInternal; its fiber shell runs the next task") {
  chi_test::MakeDemoPool("thrower-host", chi::PoolId(237, 0));  // starts the runtime
  auto created = admin.AsyncCreatePool(PoolQuery::Local(), "chi_test_thrower", "thrower",
                                       chi::PoolId(238, 0));
  REQUIRE(created.Wait(30));
  REQUIRE_MESSAGE(created->GetReturnCode() == 0, created->GetMessage());
  chi_test_thrower::Client thrower(chi::PoolId(238, 0));
  const FiberCounts before = CountFibers();
  for (chi::u32 i = 0; i < 300; ++i) {
    CAPTURE(i);
    auto f = thrower.AsyncThrow(i % 3, (i / 3) % 2 == 1);
    REQUIRE(f.Wait(30));
    CHECK(f->ran_ == 1);
    if (i % 3 == 2) {
      CHECK(f->GetReturnCode() == 0);
      continue;
    }
    CHECK(f->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kInternal));
    if (i % 3 == 0) CHECK(std::string(f->GetMessage()).find("boom") != std::string::npos);
  }
  // One task at a time: the shell each throw ran on went back to serve the next one.
  CHECK(CountFibers().fibers - before.fibers <= 2);
}

TEST_CASE("a process forked while another thread holds the task memory's pool lock can take it") {
  // A new thread takes its cache under that lock; the child takes it directly instead, as
  // a child that starts threads is refused under TSan (die_after_fork).
  const chi_test::ForkOutcome out = chi_test::ForkWhileBusy(
      100, [] { static_cast<void>(chi::TaskMemory::LiveBlocks()); },  // holds the pool's lock
      [] {
        void *p = chi::TaskMemory::Alloc(200);
        const bool ok = p != nullptr && chi::TaskMemory::LiveBlocks() >= 1;
        chi::TaskMemory::Free(p);
        return ok ? 0 : 3;
      });
  CHECK(out.hung == 0);
  CHECK(out.failed == 0);
}

TEST_CASE("task memory hands out the smallest size class that holds the request") {
  using chi::TaskMemory;
  for (chi::u64 bytes = 1; bytes <= TaskMemory::kMaxClassBytes + 256; ++bytes) {
    const chi::u32 cls = TaskMemory::ClassOf(bytes);
    if (bytes > TaskMemory::kMaxClassBytes) {
      REQUIRE(cls == TaskMemory::kNumClasses);  // oversized: malloc'd on its own
      continue;
    }
    REQUIRE(cls < TaskMemory::kNumClasses);
    REQUIRE((TaskMemory::kMinClassBytes << cls) >= bytes);  // it fits
    if (cls > 0) REQUIRE((TaskMemory::kMinClassBytes << (cls - 1)) < bytes);  // none smaller
  }
  // Blocks of every class and oversized ones are usable to their full requested size.
  for (chi::u64 bytes : {1ull, 48ull, 49ull, 200ull, 4080ull, 4081ull, 100000ull}) {
    auto *p = static_cast<unsigned char *>(TaskMemory::Alloc(bytes));
    REQUIRE(p != nullptr);
    for (chi::u64 i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i);
    CHECK(p[bytes - 1] == static_cast<unsigned char>(bytes - 1));
    TaskMemory::Free(p);
  }
}
