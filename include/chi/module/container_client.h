// ContainerClient: the client half of a module. Holds the pool id and builds
// tasks; all logic lives in the runtime (seed 004: "client code should be minimal").
#pragma once

#include "chi/core/ids.h"             // PoolId
#include "chi/runtime/chimaera.h"     // GetIpcManager
#include "chi/task/future.h"          // Future

namespace chi {

/** Base of every module client. */
class ContainerClient {
 public:
  ContainerClient() = default;
  explicit ContainerClient(PoolId pool_id) : pool_id_(pool_id) {}

  PoolId GetPoolId() const { return pool_id_; }
  void SetPoolId(PoolId id) { pool_id_ = id; }

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(pool_id_);
  }

 protected:
  /** Allocates a task of type T addressed to this client's pool. */
  template <typename T, typename... Args>
  static T *MakeTask(PoolId pool, const PoolQuery &query, MethodId method, Args &&...args) {
    T *t = GetIpcManager().NewTask<T>(std::forward<Args>(args)...);
    if (t == nullptr) return nullptr;
    t->pool_id_ = pool;
    t->pool_query_ = query;
    t->method_ = method;
    return t;
  }

  /** Submits a task and wraps it in a Future (a failed allocation gives an empty one). */
  template <typename T>
  static Future<T> Submit(T *t) {
    if (t == nullptr) return Future<T>();
    return GetIpcManager().Send(t);
  }

  PoolId pool_id_;
};

}  // namespace chi
