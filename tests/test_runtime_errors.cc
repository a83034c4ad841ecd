// Bad input to the embedded runtime: every failure is an answer (a return code
// and a message naming the problem) and the runtime keeps serving.
#include "child_process.h"
#include "embedded_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

using chi::ErrorCode;
using chi::PoolQuery;

namespace {

chi::u32 Code(ErrorCode c) { return static_cast<chi::u32>(c); }

bool Contains(const char *haystack, const std::string &needle) {
  return std::string(haystack).find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("a task to an unknown pool completes with kUnknownPool naming the pool") {
  chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  chimaera::demo::Client ghost(chi::PoolId(999, 7));
  auto f = ghost.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kUnknownPool));
  CHECK(Contains(f->GetMessage(), "999.7"));
}

TEST_CASE("an unknown method completes with kUnknownMethod naming method and module") {
  auto client = chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  auto *t = chi::NewTask<chimaera::demo::CustomTask>();
  t->pool_id_ = chi::PoolId(250, 0);
  t->pool_query_ = PoolQuery::Local();
  t->method_ = 77;
  auto f = chi::GetIpcManager().Send(t);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kUnknownMethod));
  CHECK(Contains(f->GetMessage(), "77"));
  CHECK(Contains(f->GetMessage(), "chimaera_demo"));
  auto ok = client.AsyncGpuSubmit(PoolQuery::Local(), 0, 42);
  REQUIRE(ok.Wait(10));
  CHECK(ok->result_value_ == 84);
}

TEST_CASE("pool creation errors: unknown module, name clash, reserved id, bad names") {
  chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  chimaera::admin::Client admin;
  auto unknown = admin.AsyncCreatePool(PoolQuery::Local(), "no_such_module", "p1", chi::PoolId(251, 0));
  REQUIRE(unknown.Wait(10));
  CHECK(unknown->GetReturnCode() == Code(ErrorCode::kUnknownModule));
  CHECK(Contains(unknown->GetMessage(), "no_such_module"));

  auto clash = admin.AsyncCreatePool(PoolQuery::Local(), "chimaera_demo", "errors", chi::PoolId(252, 0), 1, false);
  REQUIRE(clash.Wait(10));
  CHECK(clash->GetReturnCode() == Code(ErrorCode::kAlreadyExists));
  CHECK(Contains(clash->GetMessage(), "errors"));

  auto reserved = admin.AsyncCreatePool(PoolQuery::Local(), "chimaera_demo", "p2", chi::kAdminPoolId);
  REQUIRE(reserved.Wait(10));
  CHECK(reserved->GetReturnCode() == Code(ErrorCode::kInvalidArgument));

  const std::string long_name(100, 'n');
  auto too_long = admin.AsyncCreatePool(PoolQuery::Local(), "chimaera_demo", long_name, chi::PoolId(253, 0));
  REQUIRE(too_long.Wait(10));
  CHECK(too_long->GetReturnCode() == Code(ErrorCode::kInvalidArgument));

  auto zero = admin.AsyncCreatePool(PoolQuery::Local(), "chimaera_demo", "p3", chi::PoolId(254, 0), 0);
  REQUIRE(zero.Wait(10));
  CHECK(zero->GetReturnCode() == Code(ErrorCode::kInvalidArgument));

  auto destroy_ghost = admin.AsyncDestroyPool(PoolQuery::Local(), chi::PoolId(888, 0));
  REQUIRE(destroy_ghost.Wait(10));
  CHECK(destroy_ghost->GetReturnCode() == Code(ErrorCode::kUnknownPool));
}

TEST_CASE("an oversized output request is refused with kTooLarge") {
  auto client = chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  auto f = client.AsyncLargeOutput(PoolQuery::Local(), 4ull << 30);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kTooLarge));
}

TEST_CASE("Monitor reports workers and pools") {
  auto client = chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  for (int i = 0; i < 10; ++i) client.AsyncCustom(PoolQuery::Local(), "m").Wait();
  chimaera::admin::Client admin;
  auto m = admin.AsyncMonitor(PoolQuery::Local());
  REQUIRE(m.Wait(10));
  REQUIRE(m->GetReturnCode() == 0);
  chimaera::admin::MonitorReport r = m->Decode();
  CHECK(r.workers_.size() == chi::Chimaera::Get().Orchestrator()->NumWorkers());
  chi::u64 done = 0;
  for (auto &w : r.workers_) done += w.tasks_done_;
  CHECK(done >= 10);
  bool found = false;
  for (auto &p : r.pools_) {
    if (p.id_ == chi::PoolId(250, 0)) {
      found = true;
      CHECK(p.name_ == "errors");
      CHECK(p.module_name_ == "chimaera_demo");
      CHECK(p.tasks_done_ >= 10);
    }
  }
  CHECK(found);
}

TEST_CASE("Monitor reports the large payload blocks kept between tasks") {
  auto client = chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  chimaera::admin::Client admin;
  auto report = [&] {
    auto m = admin.AsyncMonitor(PoolQuery::Local());
    REQUIRE(m.Wait(10));
    REQUIRE(m->GetReturnCode() == 0);
    return m->Decode().payload_cache_;
  };
  chi::LargeBlockCache::Instance().Trim();
  CHECK(report().blocks_ == 0);
  const std::string data(8u << 20, 'k');  // past LargeBlockCache::kMinBytes
  {
    auto f = client.AsyncCustom(PoolQuery::Local(), data);
    REQUIRE(f.Wait(30));
    REQUIRE(f->GetReturnCode() == 0);
    CHECK(f->data_.view() == data);
  }  // the payload's block is kept for the next one
  const chimaera::admin::PayloadCacheStats kept = report();
  CHECK(kept.blocks_ >= 1);
  CHECK(kept.bytes_ >= data.size());
  CHECK(kept.resident_bytes_ <= kept.bytes_);
  CHECK(kept.resident_bytes_ <= chi::LargeBlockCache::kDefaultWarmBytes);
  chi::LargeBlockCache::Instance().Trim();
  CHECK(report().blocks_ == 0);
}

TEST_CASE("a malformed config makes CHIMAERA_INIT fail naming the key") {
  const std::string path = "/tmp/chi_bad_conf_" + std::to_string(getpid()) + ".yaml";
  FILE *f = std::fopen(path.c_str(), "w");
  std::fputs("workers:\n  low_latency: abc\n", f);
  std::fclose(f);
  CHECK(chi_test::RunChild("bad_config", {{"CHI_SERVER_CONF", path}}) == 0);
  std::remove(path.c_str());
  CHECK(chi_test::RunChild("missing_config", {{"CHI_SERVER_CONF", "/nonexistent/chi.yaml"}}) == 0);
}

TEST_CASE("tasks sent before CHIMAERA_INIT fail with kShutdown instead of hanging") {
  CHECK(chi_test::RunChild("no_runtime") == 0);
}

namespace {

int BadConfigChild() {
  chi_test::ChildChecks c;
  c.Expect(!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "init refuses the config");
  c.Expect(chi::Chimaera::Get().LastError().code() == ErrorCode::kBadConfig, "kBadConfig");
  c.Expect(Contains(chi::Chimaera::Get().LastError().message(), "workers.low_latency"),
           "message names workers.low_latency");
  return c.Result();
}
const chi_test::ChildRoutine kBadConfig("bad_config", &BadConfigChild);

int MissingConfigChild() {
  chi_test::ChildChecks c;
  c.Expect(!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), "init refuses a missing file");
  c.Expect(Contains(chi::Chimaera::Get().LastError().message(), "/nonexistent/chi.yaml"),
           "message names the path");
  return c.Result();
}
const chi_test::ChildRoutine kMissingConfig("missing_config", &MissingConfigChild);

int NoRuntimeChild() {
  chi_test::ChildChecks c;
  chimaera::demo::Client demo(chi::PoolId(250, 0));
  auto f = demo.AsyncCustom(PoolQuery::Local(), "x");
  c.Expect(f.Wait(5), "the future completes");
  c.Expect(f->GetReturnCode() == Code(ErrorCode::kShutdown), "kShutdown");
  c.Expect(Contains(f->GetMessage(), "CHIMAERA_INIT"), "message says to call CHIMAERA_INIT");
  return c.Result();
}
const chi_test::ChildRoutine kNoRuntime("no_runtime", &NoRuntimeChild);

}  // namespace
