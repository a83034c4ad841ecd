// Compile-time method tables for module runtimes. A module lists its methods
// once (id, task type, handler, name) and ModuleRuntime generates Run,
// RunsOn and MethodName by folding over that list: no switch per module,
// no generated code. A handler that never waits may say so (RunOn::kWorkerStack) and
// runs without a fiber.
//
//   class Runtime : public chi::ModuleRuntime<Runtime> {
//    public:
//     void Custom(CustomTask &task, chi::RunContext &rctx);
//     void Add(AddTask &task, chi::RunContext &rctx);
//     using Methods = chi::MethodList<
//         chi::Method<Method::kCustom, CustomTask, &Runtime::Custom, "Custom">,
//         chi::Method<Method::kAdd, AddTask, &Runtime::Add, "Add", chi::RunOn::kWorkerStack>>;
//   };
#pragma once

#include <algorithm>  // std::copy_n for the name literal
#include <cstddef>    // size_t

#include "chi/core/status.h"         // ErrorCode::kUnknownMethod
#include "chi/module/container.h"    // Container base
#include "chi/serialize/archive.h"   // task wire format
#include "chi/task/task.h"           // Task
#include "chi/task/task_ops.h"       // NewTask, DeleteTask

namespace chi {

/** A string literal usable as a template argument (method names). */
template <size_t N>
struct MethodLabel {
  char text[N];
  constexpr MethodLabel(const char (&s)[N]) { std::copy_n(s, N, text); }
};

/**
 * One entry of a module's method table. `kWhere`: RunOn::kWorkerStack for a handler that
 * never waits (no subtask Wait, SleepFor, co-lock or yield; one that tries fails its task
 * with kUnsupported), which then runs without a fiber switch.
 */
template <MethodId kId, typename TaskT, auto kHandler, MethodLabel kName,
          RunOn kWhere = RunOn::kFiber>
struct Method {
  static_assert(kWhere != RunOn::kUnknown, "a method runs on a fiber or on the worker's stack");
  static constexpr MethodId kMethodId = kId;
  static constexpr RunOn kRunOn = kWhere;
  using TaskType = TaskT;
  static constexpr auto kRun = kHandler;
  static constexpr const char *Name() { return kName.text; }
};

/** A module's whole method table; the fold expressions live here. */
template <typename... Methods>
struct MethodList {
  /** Calls the handler registered for `method`; false when none is. */
  template <typename Runtime>
  static bool Dispatch(Runtime &self, MethodId method, Task *task, RunContext &rctx) {
    return ((method == Methods::kMethodId
                 ? ((self.*Methods::kRun)(static_cast<typename Methods::TaskType &>(*task), rctx),
                    true)
                 : false) ||
            ...);
  }
  /** Where `method` runs; kUnknown when it is not in the table. */
  static constexpr RunOn Where(MethodId method) {
    RunOn where = RunOn::kUnknown;
    (void)((method == Methods::kMethodId ? (where = Methods::kRunOn, true) : false) || ...);
    return where;
  }

  /**
   * Builds the task for `method` from its inputs (routing header already read
   * into `base`); nullptr for an unknown method or malformed bytes.
   */
  static Task *LoadIn(MethodId method, const Task &base, InputArchive &ar) {
    Task *out = nullptr;
    (void)((method == Methods::kMethodId ? (out = LoadAs<typename Methods::TaskType>(base, ar), true)
                                         : false) ||
           ...);
    return out;
  }
  static constexpr const char *Name(MethodId method) {
    const char *name = "?";
    (void)((method == Methods::kMethodId ? (name = Methods::Name(), true) : false) || ...);
    return name;
  }
};

/** Builds a task of type T from its routing header and serialized inputs. */
template <typename T>
Task *LoadAs(const Task &base, InputArchive &ar) {
  T *t = NewTask<T>();
  if (t == nullptr) return nullptr;
  t->CopyRouting(base);
  t->SerializeIn(ar);
  if (!ar.ok()) {
    DeleteTask(t);
    return nullptr;
  }
  return t;
}
/** Implements Container's dispatch for Derived from Derived::Methods (a MethodList). */
template <typename Derived>
class ModuleRuntime : public Container {
 public:
  void Run(MethodId method, Task *task, RunContext &rctx) override {
    if (!Derived::Methods::Dispatch(static_cast<Derived &>(*this), method, task, rctx)) {
      task->SetError(ErrorCode::kUnknownMethod, "the module has no handler for this method");
    }
  }
  RunOn RunsOn(MethodId method) const override { return Derived::Methods::Where(method); }
  const char *MethodName(MethodId method) const override { return Derived::Methods::Name(method); }
  Task *LoadTaskIn(MethodId method, const Task &base, InputArchive &ar) override {
    return Derived::Methods::LoadIn(method, base, ar);
  }

};

}  // namespace chi
