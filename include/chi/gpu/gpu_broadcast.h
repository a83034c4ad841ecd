// GpuBroadcast: a LocalGpuBcast task on a node with several GPUs, sent by the GpuWorker
// (gpu_worker.h) as one replica per GPU and folded back into the original task when the
// last replica answers. Included by gpu_worker.h after the class; not meant to be included
// on its own.
#pragma once

#include <vector>  // the replicas

#include "chi/core/atomic.h"       // Atomic: replicas still out
#include "chi/gpu/gpu_worker.h"    // GpuWorker: its links, SendTo and Fail
#include "chi/task/task_ops.h"     // CompleteTask, DeleteTask of the replicas

namespace chi::gpu {

/**
 * LocalGpuBcast on a node with several GPUs: one replica per GPU, folded back into the
 * original (TaskOps::aggregate, GPU 0 first) when the last one answers.
 */
class GpuBroadcast final : public TaskCompleter {
 public:
  /** Sends t's replicas; t completes when all have. */
  static void Start(GpuWorker &w, Task *t) {
    auto *b = new GpuBroadcast();
    b->orig_ = t;
    const u32 n = static_cast<u32>(w.links_.size());
    for (u32 i = 0; i < n; ++i) {
      Task *rep = t->ops_->clone(*t);
      if (rep == nullptr) break;
      rep->pool_query_ = PoolQuery::ToLocalGpu(w.links_[i]->gpu_id);
      rep->task_flags_.UnsetBits(TASK_FIRE_AND_FORGET);
      rep->completer_ = b;
      b->replicas_.push_back(rep);
    }
    if (b->replicas_.size() != n) {
      for (Task *rep : b->replicas_) DeleteTask(rep);
      delete b;
      return GpuWorker::Fail(t, ErrorCode::kOutOfMemory, "no memory for a GPU broadcast replica");
    }
    b->left_.Store(n, MemOrder::kRelease);
    const std::vector<Task *> reps = b->replicas_;  // b may be gone once the last one answers
    for (u32 i = 0; i < n; ++i) w.SendTo(*w.links_[i], reps[i]);
  }

  /** A replica's sender is the original task's. */
  Caller CallerOf(const Task &) const override { return chi::CallerOf(*orig_); }

  /** One replica answered; the last one folds them all into the original. */
  void OnComplete(Task *) override {
    // acq_rel: the last replica sees every other replica's outputs.
    if (left_.FetchSub(1, MemOrder::kAcqRel) != 1) return;
    for (u32 i = 0; i < replicas_.size(); ++i) {
      replicas_[i]->completer_ = nullptr;
      orig_->ops_->aggregate(*orig_, *replicas_[i], i);
      DeleteTask(replicas_[i]);
    }
    Task *t = orig_;
    delete this;
    CompleteTask(t);
  }

 private:
  GpuBroadcast() = default;
  Task *orig_ = nullptr;
  std::vector<Task *> replicas_;
  Atomic<u32> left_;
};

void GpuWorker::Broadcast(Task *t) { GpuBroadcast::Start(*this, t); }

}  // namespace chi::gpu
