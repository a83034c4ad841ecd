// Methods declared RunOn::kWorkerStack: they run on the worker's own stack (no fiber),
// give the same answers as fiber methods, and one that tries to wait (a subtask, a
// sleep, a co-lock) fails its task with kUnsupported naming the method, while the runtime
// keeps serving and the subtask it left behind still runs.
#include "embedded_fixture.h"
#include "poll_until.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <chi/runtime/co_mutex.h>
#include <chi/runtime/co_rw_lock.h>

using chi::PoolQuery;

namespace chi_test_stack {

/** Method ids of the test-only "stack" module. */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kAdd = 10;           ///< on the worker's stack
  static constexpr chi::MethodId kAddOnFiber = 11;    ///< the same handler, on a fiber
  static constexpr chi::MethodId kWaitOnStack = 12;   ///< tries to wait: refused
  static constexpr chi::MethodId kWaitOnFiber = 13;   ///< the same waits, on a fiber
};

/** How a kWait* handler tries to wait. */
enum WaitKind : chi::u32 {
  kSubtask = 0,       ///< Future::Wait() on a subtask
  kTimedSubtask = 1,  ///< Future::Wait(seconds) on a subtask
  kSleep = 2,         ///< SleepFor
  kMutex = 3,         ///< CoMutex::Lock
  kRwLock = 4,        ///< CoRwLock::ReadLock
  kTryLock = 5,       ///< CoMutex::TryLock: never waits, allowed everywhere
  kThrow = 6,         ///< no wait: throws std::runtime_error
};

/** Adds two numbers; says whether it ran on a fiber. */
struct AddTask : public chi::Task {
  CHI_IN chi::u32 a_ = 0;
  CHI_IN chi::u32 b_ = 0;
  CHI_OUT chi::u32 sum_ = 0;
  CHI_OUT chi::u32 on_fiber_ = 2;

  template <typename Ar> void SerializeIn(Ar &ar) { ar(a_, b_); }
  template <typename Ar> void SerializeOut(Ar &ar) { ar(sum_, on_fiber_); }
};

/** Tries one kind of wait; `reached_` counts the steps the handler got through. */
struct WaitTask : public chi::Task {
  CHI_IN chi::u32 kind_ = 0;
  CHI_OUT chi::u32 reached_ = 0;

  template <typename Ar> void SerializeIn(Ar &ar) { ar(kind_); }
  template <typename Ar> void SerializeOut(Ar &ar) { ar(reached_); }
};

/** Subtasks that ran (the waits left them behind; they must still run). */
inline std::atomic<chi::u32> subtasks_run{0};

class Client;

/** Runtime side of the stack module. */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  void Add(AddTask &t, chi::RunContext &rctx) {
    t.sum_ = t.a_ + t.b_;
    t.on_fiber_ = rctx.shell_ != nullptr ? 1 : 0;
    if (t.a_ == 7777) subtasks_run.fetch_add(1);
  }
  inline void Wait(WaitTask &t, chi::RunContext &rctx);

  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, chimaera::admin::CreatePoolTask, &Runtime::Create, "Create">,
      chi::Method<Method::kAdd, AddTask, &Runtime::Add, "Add", chi::RunOn::kWorkerStack>,
      chi::Method<Method::kAddOnFiber, AddTask, &Runtime::Add, "AddOnFiber">,
      chi::Method<Method::kWaitOnStack, WaitTask, &Runtime::Wait, "WaitOnStack",
                  chi::RunOn::kWorkerStack>,
      chi::Method<Method::kWaitOnFiber, WaitTask, &Runtime::Wait, "WaitOnFiber">>;

 private:
  chi::CoMutex mutex_;
  chi::CoRwLock rw_;
};
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>("chi_test_stack");

static_assert(Runtime::Methods::Where(Method::kAdd) == chi::RunOn::kWorkerStack);
static_assert(Runtime::Methods::Where(Method::kAddOnFiber) == chi::RunOn::kFiber);
static_assert(Runtime::Methods::Where(99) == chi::RunOn::kUnknown);

/** Client side of the stack module. */
class Client : public chi::ContainerClient {
 public:
  explicit Client(chi::PoolId id) : ContainerClient(id) {}
  chi::Future<AddTask> AsyncAdd(chi::MethodId m, chi::u32 a, chi::u32 b) {
    AddTask *t = MakeTask<AddTask>(pool_id_, PoolQuery::Local(), m);
    t->a_ = a;
    t->b_ = b;
    return Submit(t);
  }
  chi::Future<WaitTask> AsyncWait(chi::MethodId m, WaitKind kind) {
    WaitTask *t = MakeTask<WaitTask>(pool_id_, PoolQuery::Local(), m);
    t->kind_ = kind;
    return Submit(t);
  }
};

void Runtime::Wait(WaitTask &t, chi::RunContext &) {
  t.reached_ = 1;
  switch (t.kind_) {
    case kSubtask:
    case kTimedSubtask: {
      auto sub = Client(pool_id_).AsyncAdd(Method::kAdd, 7777, 1);
      const bool done = t.kind_ == kSubtask ? sub.Wait() : sub.Wait(30);
      if (!done || sub->sum_ != 7778) return t.SetError(chi::ErrorCode::kInternal, "bad subtask");
      break;
    }
    case kSleep:
      if (!chi::SleepFor(1000)) return t.SetError(chi::ErrorCode::kShutdown, "cut short");
      break;
    case kMutex:
      mutex_.Lock();
      mutex_.Unlock();
      break;
    case kRwLock:
      rw_.ReadLock();
      rw_.ReadUnlock();
      break;
    case kTryLock:
      if (!mutex_.TryLock()) return t.SetError(chi::ErrorCode::kInternal, "lock was taken");
      mutex_.Unlock();
      break;
    case kThrow:
      throw std::runtime_error("boom");
    default:
      return t.SetError(chi::ErrorCode::kInvalidArgument, "unknown wait kind");
  }
  t.reached_ = 2;
}

}  // namespace chi_test_stack

namespace {

using chi_test_stack::Method;

/** Starts the runtime and a pool of the stack module (once per binary). */
chi_test_stack::Client StackPool() {
  static const bool made = [] {
    chi_test::MakeDemoPool("stack-host", chi::PoolId(250, 0));  // starts the runtime
    auto created = chimaera::admin::Client().AsyncCreatePool(PoolQuery::Local(),
                                                             "chi_test_stack", "stack",
                                                             chi::PoolId(251, 0));
    return created.Wait(30) && created->GetReturnCode() == 0;
  }();
  REQUIRE(made);
  return chi_test_stack::Client(chi::PoolId(251, 0));
}

chi::u64 FibersCreated() {
  chi::u64 n = 0;
  for (const chi::WorkerStats &w : chi::Chimaera::Get().Orchestrator()->Stats()) n += w.fibers_;
  return n;
}

}  // namespace

TEST_CASE("a worker-stack method answers like a fiber method, with no fiber under it") {
  chi_test_stack::Client c = StackPool();
  for (chi::u32 i = 0; i < 2000; ++i) {
    CAPTURE(i);
    const bool on_stack = i % 2 == 0;
    auto f = c.AsyncAdd(on_stack ? Method::kAdd : Method::kAddOnFiber, i, 3 * i);
    REQUIRE(f.Wait(30));
    REQUIRE(f->GetReturnCode() == 0);
    CHECK(f->sum_ == 4 * i);
    CHECK(f->on_fiber_ == (on_stack ? 0u : 1u));
  }
  // Many in flight at once: they all run on the workers' stacks, and no shell is made.
  const chi::u64 fibers_before = FibersCreated();
  std::vector<chi::Future<chi_test_stack::AddTask>> many;
  for (chi::u32 i = 0; i < 5000; ++i) many.push_back(c.AsyncAdd(Method::kAdd, i, 1));
  for (chi::u32 i = 0; i < 5000; ++i) {
    REQUIRE(many[i].Wait(30));
    CHECK(many[i]->sum_ == i + 1);
    CHECK(many[i]->on_fiber_ == 0);
  }
  CHECK(FibersCreated() == fibers_before);
}

TEST_CASE("a worker-stack method that tries to wait fails with kUnsupported; the runtime serves on") {
  chi_test_stack::Client c = StackPool();
  struct Case {
    chi_test_stack::WaitKind kind;
    const char *says;
  };
  const Case cases[] = {{chi_test_stack::kSubtask, "cannot wait for another task"},
                        {chi_test_stack::kTimedSubtask, "cannot sleep"},
                        {chi_test_stack::kSleep, "cannot sleep"},
                        {chi_test_stack::kMutex, "cannot lock a CoMutex"},
                        {chi_test_stack::kRwLock, "cannot lock a CoRwLock"}};
  for (int round = 0; round < 3; ++round) {
    for (const Case &k : cases) {
      CAPTURE(k.kind);
      const chi::u32 subtasks_before = chi_test_stack::subtasks_run.load();
      auto f = c.AsyncWait(Method::kWaitOnStack, k.kind);
      REQUIRE(f.Wait(30));
      CHECK(f->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kUnsupported));
      const std::string msg = f->GetMessage();
      CAPTURE(msg);
      CHECK(msg.find("method WaitOnStack of pool 251.0") != std::string::npos);
      CHECK(msg.find("worker's stack") != std::string::npos);
      CHECK(msg.find(k.says) != std::string::npos);
      CHECK(f->reached_ == 1);  // the handler stopped at the wait
      if (k.kind == chi_test_stack::kSubtask || k.kind == chi_test_stack::kTimedSubtask) {
        // The subtask it submitted before the refused wait still runs (its future let go).
        CHECK(chi_test::PollUntil(
            [&] { return chi_test_stack::subtasks_run.load() > subtasks_before; }, 30));
      }
      // The same waits on a fiber succeed, and the worker-stack methods still answer.
      auto ok = c.AsyncWait(Method::kWaitOnFiber, k.kind);
      REQUIRE(ok.Wait(30));
      CHECK_MESSAGE(ok->GetReturnCode() == 0, ok->GetMessage());
      CHECK(ok->reached_ == 2);
      auto add = c.AsyncAdd(Method::kAdd, 40, 2);
      REQUIRE(add.Wait(30));
      CHECK(add->sum_ == 42);
    }
  }
}

TEST_CASE("a worker-stack method may TryLock, and one that throws is answered with kInternal") {
  chi_test_stack::Client c = StackPool();
  auto tried = c.AsyncWait(Method::kWaitOnStack, chi_test_stack::kTryLock);
  REQUIRE(tried.Wait(30));
  CHECK_MESSAGE(tried->GetReturnCode() == 0, tried->GetMessage());
  CHECK(tried->reached_ == 2);
  for (int i = 0; i < 100; ++i) {
    auto f = c.AsyncWait(Method::kWaitOnStack, chi_test_stack::kThrow);
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kInternal));
    CHECK(std::string(f->GetMessage()).find("boom") != std::string::npos);
  }
  auto add = c.AsyncAdd(Method::kAdd, 1, 2);
  REQUIRE(add.Wait(30));
  CHECK(add->sum_ == 3);
}

TEST_CASE("an unknown method of a module with worker-stack methods is refused by name") {
  chi_test_stack::Client c = StackPool();
  auto f = c.AsyncAdd(99, 1, 2);
  REQUIRE(f.Wait(30));
  CHECK(f->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kUnknownMethod));
  CHECK(std::string(f->GetMessage()).find("no method 99") != std::string::npos);
}
