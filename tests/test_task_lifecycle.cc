// Task and runtime lifecycle: periodic tasks, fire-and-forget memory, pool
// destruction with tasks in flight, repeated init/finalize, idle CPU use.
#include "child_process.h"
#include "embedded_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <atomic>
#include <fstream>
#include <sstream>
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
  const std::string path = "/tmp/chi_lanes_" + std::to_string(getpid()) + ".yaml";
  FILE *f = std::fopen(path.c_str(), "w");
  std::fputs("workers:\n  low_latency: 2\n  high_latency: 1\nlanes_per_worker: 3\nqueue_depth: 64\n", f);
  std::fclose(f);
  CHECK(chi_test::RunChild("multi_lane", {{"CHI_SERVER_CONF", path}}) == 0);
  std::remove(path.c_str());
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
  auto client_thread = [&](chi::u32 base) {
    std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> fs;
    for (chi::u32 i = 0; i < 5000; ++i) fs.push_back(demo.AsyncGpuSubmit(PoolQuery::DirectHash(i), 1, base + i));
    for (chi::u32 i = 0; i < 5000; ++i) {
      if (!fs[i].Wait(30) || fs[i]->result_value_ != (base + i) * 2 + 1) ++wrong;
    }
  };
  std::thread a(client_thread, 0), b(client_thread, 100000);
  a.join();
  b.join();
  c.Expect(wrong.load() == 0, "every result correct");
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
