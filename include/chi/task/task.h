// The base of every task: an RPC-like call (pool, method, routing, flags) plus
// its answer (return code and message) and the completion word waiters watch.
// No virtual functions: a task is plain data that archives can copy anywhere.
#pragma once

#include <cstdarg>  // va_list for SetErrorf
#include <cstdio>   // vsnprintf
#include <cstring>  // memcpy of the routing header block

#include "chi/core/atomic.h"        // Atomic state word
#include "chi/core/bitfield.h"      // task flags
#include "chi/core/caller.h"        // Caller: who a transport's task came from
#include "chi/core/fixed_string.h"  // inline error message
#include "chi/core/ids.h"           // PoolId, TaskNode, TaskId, MethodId
#include "chi/core/macros.h"        // CHI_IN/CHI_OUT/CHI_TEMP, CHI_CROSS_FUN
#include "chi/core/pool_query.h"    // PoolQuery
#include "chi/core/status.h"        // ErrorCode
#include "chi/task/task_flags.h"    // TASK_* flags, task_state bits

namespace chi {

struct Task;
class RunContext;

class OutputArchive;
class InputArchive;

/** Per-type operations the runtime needs on a type-erased task (in-process only). */
struct TaskOps {
  void (*destroy)(Task *task);            ///< runs ~T and returns the memory
  Task *(*clone)(const Task &task);       ///< deep copy, for Broadcast/Range replicas
  void (*aggregate)(Task &into, const Task &replica, u32 index);  ///< folds replica `index` in
  void (*save_in)(Task &task, OutputArchive &ar);   ///< routing header + inputs (client side)
  void (*save_out)(Task &task, OutputArchive &ar);  ///< answer header + outputs (server side)
  void (*load_out)(Task &task, InputArchive &ar);   ///< reads an answer into the task (client side)
};

/**
 * Takes over a task's completion instead of a local waiter: a transport that
 * must send the answer back to a remote caller. Called once, on the completing thread.
 */
class TaskCompleter {
 public:
  virtual void OnComplete(Task *task) = 0;
  /**
   * Who sent `task`, as this transport knows its client (never from the request's bytes).
   * The default vouches for nobody: handlers then refuse what needs an identity.
   */
  virtual Caller CallerOf(const Task &task) const {
    (void)task;
    return Caller{};
  }

 protected:
  ~TaskCompleter() = default;
};

/** Maximum length of the error message a task carries back. */
inline constexpr u32 kTaskMessageSize = 96;

/** A container method to execute, its parameters (in subclasses) and its answer. */
struct Task {
  // The shape word of the compact routing header (SerializeBaseIn): the routing mode in
  // the low byte, then which optional fields follow.
  static constexpr u32 kWireModeMask = 0xffu;
  static constexpr u32 kWireQueryArgs = 1u << 8;  ///< the query's count and value follow
  static constexpr u32 kWirePeriod = 1u << 9;     ///< period_ns_ follows (else 0)
  static constexpr u32 kWireNode = 1u << 10;      ///< task_node_ follows (else (unique, 0))
  static constexpr u32 kWireKnown = kWireModeMask | kWireQueryArgs | kWirePeriod | kWireNode;
  /**
   * The routing header's fixed block: seven u32 words (pool id major and minor, shape,
   * method, flags, task id node and pid), then the task id's u64 unique number.
   */
  static constexpr u32 kWireHeadWords = 7;
  static constexpr u64 kWireHeadBytes = kWireHeadWords * sizeof(u32) + sizeof(u64);

  CHI_IN PoolId pool_id_;          ///< the pool that runs the task
  CHI_IN TaskNode task_node_;      ///< place in the task graph (subtasks share major)
  CHI_IN PoolQuery pool_query_;    ///< which container(s)
  CHI_IN MethodId method_ = 0;     ///< container method
  CHI_IN IntFlag task_flags_;      ///< TASK_* flags
  CHI_IN double period_ns_ = 0;    ///< period of a TASK_PERIODIC task
  CHI_IN TaskId task_id_;          ///< unique id of this submission
  CHI_OUT u32 rc_ = 0;             ///< ErrorCode; 0 = success
  CHI_TEMP Atomic<u32> state_;     ///< task_state bits: complete, parked, waiter, orphaned
  CHI_TEMP RunContext *waiter_ = nullptr;  ///< fiber waiting on this task (same process)
  CHI_TEMP const TaskOps *ops_ = nullptr;  ///< set by the allocator that made the task
  CHI_TEMP Task *parent_ = nullptr;        ///< the original task of a replica
  CHI_TEMP TaskCompleter *completer_ = nullptr;  ///< set by transports for remote callers
  CHI_TEMP u64 transport_cookie_ = 0;            ///< the transport's note of where to answer
  CHI_TEMP u64 request_id_ = 0;                  ///< the remote caller's id for this task
  /// Why it failed (empty on success). Last: the fields above fill the task's first two
  /// cache lines, and a task handed between threads moves only those and the line of its
  /// own fields, not the message's, which a success never touches after construction.
  CHI_OUT FixedString<kTaskMessageSize> msg_;

  /** Why the task failed (0 = success). */
  CHI_CROSS_FUN u32 GetReturnCode() const { return rc_; }
  /** The failure message, empty on success. */
  CHI_CROSS_FUN const char *GetMessage() const { return msg_.c_str(); }
  /** True once the runtime has published the outputs. */
  CHI_CROSS_FUN bool IsComplete() const {
    return (state_.Load(MemOrder::kAcquire) & task_state::kComplete) != 0;
  }

  /**
   * Records a failure with a fixed message (first failure wins). Out of line: error paths
   * stay out of the code around them (on a GPU, inlined message copies swelled every
   * caller and could be hoisted onto its hot path).
   */
  CHI_CROSS_FUN CHI_NOINLINE void SetError(ErrorCode code, const char *msg) {
    if (rc_ != 0) return;
    rc_ = static_cast<u32>(code);
    u32 n = 0;
    while (msg[n] != '\0') ++n;
    msg_.Assign(msg, n);
  }
  /** Records a failure with a printf-style message (host only; first failure wins). */
  __attribute__((format(printf, 3, 4))) void SetErrorf(ErrorCode code, const char *fmt, ...) {
    if (rc_ != 0) return;
    char buf[kTaskMessageSize];
    va_list ap;
    va_start(ap, fmt);
    int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    rc_ = static_cast<u32>(code);
    msg_.Assign(buf, n < 0 ? 0u : (n >= static_cast<int>(sizeof(buf)) ? sizeof(buf) - 1 : n));
  }

  /**
   * The routing header every transport sends before the task's own inputs, compact: a
   * shape word (the routing mode and which optional fields follow) stands for the query's
   * arguments, the period and the task node when they hold their usual values (none;
   * 0; a root task's (unique id, 0)). A small request then fits in one cache line.
   */
  template <typename Ar>
  CHI_CROSS_FUN void SerializeBaseIn(Ar &ar) {
    // The fixed fields travel as one block (one bounds check, not nine), in the order
    // and sizes they would have field by field: pool id, shape, method, flags, task id.
    char head[kWireHeadBytes];
    u32 shape = 0;
    if constexpr (Ar::kIsOutput) {
      shape = static_cast<u32>(pool_query_.GetMode()) |
              (pool_query_.HasArgs() ? kWireQueryArgs : 0u) |
              (period_ns_ != 0 ? kWirePeriod : 0u) |
              (task_node_ == TaskNode(task_id_.unique_, 0) ? 0u : kWireNode);
      const u32 words[kWireHeadWords] = {pool_id_.major_, pool_id_.minor_, shape, method_,
                                         task_flags_.Bits(), task_id_.node_id_, task_id_.pid_};
      std::memcpy(head, words, sizeof(words));
      std::memcpy(head + sizeof(words), &task_id_.unique_, sizeof(task_id_.unique_));
      ar.Bytes(head, sizeof(head));
    } else {
      ar.Bytes(head, sizeof(head));
      if (!ar.ok()) return;  // truncated: the task's fields stay as they were
      u32 words[kWireHeadWords];
      std::memcpy(words, head, sizeof(words));
      std::memcpy(&task_id_.unique_, head + sizeof(words), sizeof(task_id_.unique_));
      pool_id_ = PoolId(words[0], words[1]);
      shape = words[2];
      method_ = words[3];
      task_flags_ = IntFlag(words[4]);
      task_id_.node_id_ = words[5];
      task_id_.pid_ = words[6];
      // Unknown shape bits leave an invalid mode, refused below.
      pool_query_.SetWireMode((shape & ~kWireKnown) == 0 ? (shape & kWireModeMask) : ~0u);
      period_ns_ = 0;
      task_node_ = TaskNode(task_id_.unique_, 0);
    }
    if (shape & kWireQueryArgs) pool_query_.SerializeArgs(ar);
    if (shape & kWirePeriod) ar(period_ns_);
    if (shape & kWireNode) ar(task_node_);
    if constexpr (!Ar::kIsOutput) {
      // As the archive checks any decoded type with IsValid: every decoder refuses it.
      if (ar.ok() && !pool_query_.IsValid()) {
        ar.Fail(ErrorCode::kMalformed, "request has an invalid pool query");
      }
    }
  }
  /** The answer every transport sends back before the task's own outputs. */
  template <typename Ar>
  CHI_CROSS_FUN void SerializeBaseOut(Ar &ar) {
    // The code and the message's length travel as one 8-byte block (one bounds check),
    // the bytes ar(rc_, msg_) would write; the message's text follows.
    u32 head[2] = {rc_, msg_.size()};
    ar.Bytes(head, sizeof(head));
    if constexpr (!Ar::kIsOutput) {
      if (!ar.ok()) return;  // truncated: the task's fields stay as they were
      rc_ = head[0];
    }
    msg_.SerializeText(ar, head[1]);
  }

  /**
   * Copies the routing header from another task: what SerializeBaseIn decodes, so a task
   * built from a decoded header (whose rc_ and msg_ are never set) copies no message.
   */
  CHI_CROSS_FUN void CopyRouting(const Task &o) {
    pool_id_ = o.pool_id_;
    task_node_ = o.task_node_;
    pool_query_ = o.pool_query_;
    method_ = o.method_;
    task_flags_ = o.task_flags_;
    period_ns_ = o.period_ns_;
    task_id_ = o.task_id_;
  }

  /** Copies the routing header and the result (not the CHI_TEMP state) from another task. */
  CHI_CROSS_FUN void CopyBase(const Task &o) {
    CopyRouting(o);
    rc_ = o.rc_;
    msg_ = o.msg_;
  }

  /** Tasks are made and freed by the runtime's allocator, never copied implicitly. */
  Task() = default;
  Task(const Task &) = delete;
  Task &operator=(const Task &) = delete;
};

}  // namespace chi
