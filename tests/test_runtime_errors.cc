// Bad input to the embedded runtime: every failure is an answer (a return code
// and a message naming the problem) and the runtime keeps serving.
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

/** Runs this binary's test case `name` in a fresh exec'd process with `env` set; returns its exit code. */
int RunChild(const char *name, const char *env_key, const char *env_value) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CHI_TEST_ERRORS_CHILD", "1", 1);
    if (env_key != nullptr) setenv(env_key, env_value, 1);
    std::string filter = std::string("--test-case=") + name;
    execl("/proc/self/exe", "test_runtime_errors", filter.c_str(), "--minimal", nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

bool InChild() { return getenv("CHI_TEST_ERRORS_CHILD") != nullptr; }

}  // namespace

TEST_CASE("a task to an unknown pool completes with kUnknownPool naming the pool") {
  if (InChild()) return;
  chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  chimaera::demo::Client ghost(chi::PoolId(999, 7));
  auto f = ghost.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kUnknownPool));
  CHECK(Contains(f->GetMessage(), "999.7"));
}

TEST_CASE("an unknown method completes with kUnknownMethod naming method and module") {
  if (InChild()) return;
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
  if (InChild()) return;
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
  if (InChild()) return;
  auto client = chi_test::MakeDemoPool("errors", chi::PoolId(250, 0));
  auto f = client.AsyncLargeOutput(PoolQuery::Local(), 4ull << 30);
  REQUIRE(f.Wait(10));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kTooLarge));
}

TEST_CASE("Monitor reports workers and pools") {
  if (InChild()) return;
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

TEST_CASE("a malformed config makes CHIMAERA_INIT fail naming the key") {
  if (InChild()) return;
  const std::string path = "/tmp/chi_bad_conf_" + std::to_string(getpid()) + ".yaml";
  FILE *f = std::fopen(path.c_str(), "w");
  std::fputs("workers:\n  low_latency: abc\n", f);
  std::fclose(f);
  CHECK(RunChild("child: init with a bad config", "CHI_SERVER_CONF", path.c_str()) == 0);
  std::remove(path.c_str());
  CHECK(RunChild("child: init with a missing config", "CHI_SERVER_CONF", "/nonexistent/chi.yaml") == 0);
}

TEST_CASE("child: init with a bad config") {
  if (!InChild()) return;
  CHECK_FALSE(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true));
  CHECK(chi::Chimaera::Get().LastError().code() == ErrorCode::kBadConfig);
  CHECK(Contains(chi::Chimaera::Get().LastError().message(), "workers.low_latency"));
}

TEST_CASE("child: init with a missing config") {
  if (!InChild()) return;
  CHECK_FALSE(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true));
  CHECK(Contains(chi::Chimaera::Get().LastError().message(), "/nonexistent/chi.yaml"));
}

TEST_CASE("tasks sent before CHIMAERA_INIT fail with kShutdown instead of hanging") {
  if (InChild()) return;
  CHECK(RunChild("child: send without a runtime", nullptr, nullptr) == 0);
}

TEST_CASE("child: send without a runtime") {
  if (!InChild()) return;
  chimaera::demo::Client c(chi::PoolId(250, 0));
  auto f = c.AsyncCustom(PoolQuery::Local(), "x");
  REQUIRE(f.Wait(5));
  CHECK(f->GetReturnCode() == Code(ErrorCode::kShutdown));
  CHECK(Contains(f->GetMessage(), "CHIMAERA_INIT"));
}
