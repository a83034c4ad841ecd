// Identifiers: pools, containers, nodes, methods, tasks and task-graph nodes.
// All are small PODs usable on host and device and safe to place in shared memory.
#pragma once

#include <string>       // ToString
#include <string_view>  // FromString

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/parse.h"   // ParseUnsigned
#include "chi/core/status.h"  // Status, Error
#include "chi/core/types.h"   // u32, u64

namespace chi {

using ContainerId = u32;  ///< index of a container inside its pool, from 0
using NodeId = u32;       ///< index of a node in the hostfile, from 0
using MethodId = u32;     ///< a module's method number (seed 004: kCreate = 0, custom from 10)
using GpuId = u32;        ///< a GPU on this node

/** A pool's unique id, written "major.minor" (e.g. "200.0"). {0,0} is the null id. */
struct PoolId {
  u32 major_ = 0;
  u32 minor_ = 0;

  constexpr PoolId() = default;
  CHI_CROSS_FUN constexpr PoolId(u32 major, u32 minor) : major_(major), minor_(minor) {}

  /** The null id, used for "no pool". */
  CHI_CROSS_FUN static constexpr PoolId GetNull() { return PoolId(); }
  CHI_CROSS_FUN constexpr bool IsNull() const { return major_ == 0 && minor_ == 0; }
  /** Packs into one integer for hashing and map keys. */
  CHI_CROSS_FUN constexpr u64 ToU64() const { return (static_cast<u64>(major_) << 32) | minor_; }

  CHI_CROSS_FUN constexpr bool operator==(const PoolId &o) const {
    return major_ == o.major_ && minor_ == o.minor_;
  }
  CHI_CROSS_FUN constexpr bool operator!=(const PoolId &o) const { return !(*this == o); }
  CHI_CROSS_FUN constexpr bool operator<(const PoolId &o) const { return ToU64() < o.ToU64(); }

  /** Parses "major.minor"; the error names the bad text. */
  static Status Parse(std::string_view s, PoolId *out) {
    auto dot = s.find('.');
    u64 major = 0, minor = 0;
    if (dot == std::string_view::npos ||
        !detail::ParseUnsigned(s.substr(0, dot), 0xffffffffull, &major) ||
        !detail::ParseUnsigned(s.substr(dot + 1), 0xffffffffull, &minor)) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "pool id '%.*s' is not of the form major.minor (e.g. 200.0)",
                            static_cast<int>(s.size() > 64 ? 64 : s.size()), s.data());
    }
    *out = PoolId(static_cast<u32>(major), static_cast<u32>(minor));
    return Status::Ok();
  }

  /** Parses "major.minor"; throws chi::Error on bad text. */
  static PoolId FromString(std::string_view s) {
    PoolId id;
    if (Status st = Parse(s, &id); !st.ok()) throw Error(st);
    return id;
  }

  /** "major.minor". */
  std::string ToString() const { return std::to_string(major_) + "." + std::to_string(minor_); }

  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(major_, minor_);
  }
};

/** The admin pool, present in every runtime. */
inline constexpr PoolId kAdminPoolId{1, 0};

/** Unique id of one task submission: which process made it and its sequence number. */
struct TaskId {
  u32 node_id_ = 0;
  u32 pid_ = 0;
  u64 unique_ = 0;

  CHI_CROSS_FUN constexpr bool operator==(const TaskId &o) const {
    return node_id_ == o.node_id_ && pid_ == o.pid_ && unique_ == o.unique_;
  }
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(node_id_, pid_, unique_);
  }
};

/**
 * A task's place in a task graph. A subtask keeps its parent's major and takes a
 * new minor, which is how CoMutex recognises re-entry by the same group. depth_ counts
 * how deeply it nests (limits.max_subtask_depth bounds it); it stays in this process:
 * the wire carries major and minor only, so a task decoded from a request starts at 0.
 */
struct TaskNode {
  u64 major_ = 0;
  u32 minor_ = 0;
  u32 depth_ = 0;  ///< 0: a root task; a subtask is one deeper than its parent

  constexpr TaskNode() = default;
  CHI_CROSS_FUN constexpr TaskNode(u64 major, u32 minor, u32 depth = 0)
      : major_(major), minor_(minor), depth_(depth) {}
  /**
   * A node of this one's group at its depth (same major, given minor): a fan-out's
   * replica as is, a subtask once IpcManager::Stamp puts it one level deeper.
   */
  CHI_CROSS_FUN constexpr TaskNode Child(u32 minor) const {
    return TaskNode(major_, minor, depth_);
  }
  CHI_CROSS_FUN constexpr bool SameGroup(const TaskNode &o) const { return major_ == o.major_; }
  /** Same place in the graph: major and minor (the depth is bookkeeping, not compared). */
  CHI_CROSS_FUN constexpr bool operator==(const TaskNode &o) const {
    return major_ == o.major_ && minor_ == o.minor_;
  }
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(major_, minor_);
  }
};
// depth_ fills what was padding after minor_: a Task keeps its size and layout.
static_assert(sizeof(TaskNode) == 16, "TaskNode must stay 16 bytes");

}  // namespace chi
