// PoolQuery: which container(s) of a pool a task goes to (seed 000; replaces
// seed 004's DomainQuery). 16 bytes, no strings, usable from GPU kernels.
#pragma once

#include <string>       // ToString
#include <string_view>  // FromString

#include "chi/core/ids.h"     // ContainerId, NodeId, GpuId
#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/parse.h"   // ParseUnsigned
#include "chi/core/status.h"  // Status, Error
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** How a PoolQuery picks its containers. Values travel on the wire: keep them stable. */
enum class RoutingMode : u32 {
  kNull = 0,           ///< no routing (the task is not sent)
  kLocal = 1,          ///< a container of the pool on this node
  kDynamic = 2,        ///< ask the container's Monitor(kGlobalSchedule) to decide
  kDirectId = 3,       ///< one container, by id
  kDirectHash = 4,     ///< container hash % num_containers
  kRange = 5,          ///< containers [offset, offset + count)
  kBroadcast = 6,      ///< every container of the pool
  kPhysical = 7,       ///< the container(s) on one node
  kLocalGpuBcast = 8,  ///< every GPU orchestrator on this node
  kToLocalGpu = 9,     ///< one GPU orchestrator on this node
  kToLocalCpu = 10,    ///< from a GPU kernel to the CPU workers of this node
};

/** Selects the containers of a pool that a task runs on. */
class PoolQuery {
 public:
  constexpr PoolQuery() = default;

  CHI_CROSS_FUN static constexpr PoolQuery Null() { return PoolQuery(RoutingMode::kNull, 0, 0); }
  CHI_CROSS_FUN static constexpr PoolQuery Local() { return PoolQuery(RoutingMode::kLocal, 0, 0); }
  CHI_CROSS_FUN static constexpr PoolQuery Dynamic() {
    return PoolQuery(RoutingMode::kDynamic, 0, 0);
  }
  CHI_CROSS_FUN static constexpr PoolQuery DirectId(ContainerId id) {
    return PoolQuery(RoutingMode::kDirectId, id, 1);
  }
  CHI_CROSS_FUN static constexpr PoolQuery DirectHash(u64 hash) {
    return PoolQuery(RoutingMode::kDirectHash, hash, 1);
  }
  CHI_CROSS_FUN static constexpr PoolQuery Range(u32 offset, u32 count) {
    return PoolQuery(RoutingMode::kRange, offset, count);
  }
  CHI_CROSS_FUN static constexpr PoolQuery Broadcast() {
    return PoolQuery(RoutingMode::kBroadcast, 0, 0);
  }
  CHI_CROSS_FUN static constexpr PoolQuery Physical(NodeId node) {
    return PoolQuery(RoutingMode::kPhysical, node, 1);
  }
  CHI_CROSS_FUN static constexpr PoolQuery LocalGpuBcast() {
    return PoolQuery(RoutingMode::kLocalGpuBcast, 0, 0);
  }
  CHI_CROSS_FUN static constexpr PoolQuery ToLocalGpu(GpuId gpu) {
    return PoolQuery(RoutingMode::kToLocalGpu, gpu, 1);
  }
  CHI_CROSS_FUN static constexpr PoolQuery ToLocalCpu() {
    return PoolQuery(RoutingMode::kToLocalCpu, 0, 0);
  }

  CHI_CROSS_FUN constexpr RoutingMode GetMode() const { return mode_; }
  CHI_CROSS_FUN constexpr bool IsNull() const { return mode_ == RoutingMode::kNull; }
  /** True for the CPU -> GPU routes (LocalGpuBcast, ToLocalGpu), which GPU queues carry. */
  CHI_CROSS_FUN constexpr bool IsGpuRoute() const {
    return mode_ == RoutingMode::kLocalGpuBcast || mode_ == RoutingMode::kToLocalGpu;
  }
  /** Container id (DirectId), node id (Physical) or GPU id (ToLocalGpu). */
  CHI_CROSS_FUN constexpr u32 GetId() const { return static_cast<u32>(value_); }
  CHI_CROSS_FUN constexpr u64 GetHash() const { return value_; }
  CHI_CROSS_FUN constexpr u32 GetRangeOffset() const { return static_cast<u32>(value_); }
  CHI_CROSS_FUN constexpr u32 GetRangeCount() const { return count_; }

  CHI_CROSS_FUN constexpr bool operator==(const PoolQuery &o) const {
    return mode_ == o.mode_ && count_ == o.count_ && value_ == o.value_;
  }
  CHI_CROSS_FUN constexpr bool operator!=(const PoolQuery &o) const { return !(*this == o); }

  /** Parses the textual form written by ToString (e.g. "direct_hash:7", "range:0:4"). */
  static Status Parse(std::string_view s, PoolQuery *out) {
    auto colon = s.find(':');
    std::string_view name = s.substr(0, colon);
    std::string_view rest = colon == std::string_view::npos ? std::string_view() : s.substr(colon + 1);
    const bool has_arg = colon != std::string_view::npos;
    u64 a = 0, b = 0;
    auto arg = [&](u64 max) { return has_arg && detail::ParseUnsigned(rest, max, &a); };
    constexpr u64 k32 = 0xffffffffull;
    if (!has_arg) {
      if (name == "null") return Set(out, Null());
      if (name == "local") return Set(out, Local());
      if (name == "dynamic") return Set(out, Dynamic());
      if (name == "broadcast") return Set(out, Broadcast());
      if (name == "local_gpu_bcast") return Set(out, LocalGpuBcast());
      if (name == "to_local_cpu") return Set(out, ToLocalCpu());
    } else if (name == "direct_id" && arg(k32)) {
      return Set(out, DirectId(static_cast<u32>(a)));
    } else if (name == "direct_hash" && arg(~0ull)) {
      return Set(out, DirectHash(a));
    } else if (name == "physical" && arg(k32)) {
      return Set(out, Physical(static_cast<u32>(a)));
    } else if (name == "to_local_gpu" && arg(k32)) {
      return Set(out, ToLocalGpu(static_cast<u32>(a)));
    } else if (name == "range") {
      auto c2 = rest.find(':');
      if (c2 != std::string_view::npos && detail::ParseUnsigned(rest.substr(0, c2), k32, &a) &&
          detail::ParseUnsigned(rest.substr(c2 + 1), k32, &b) && b > 0) {
        return Set(out, Range(static_cast<u32>(a), static_cast<u32>(b)));
      }
    }
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "pool query '%.*s' is not one of local|dynamic|broadcast|null|"
                          "local_gpu_bcast|to_local_cpu|direct_id:N|direct_hash:N|range:O:C|"
                          "physical:N|to_local_gpu:N",
                          static_cast<int>(s.size() > 48 ? 48 : s.size()), s.data());
  }

  /** Parses like Parse; throws chi::Error on bad text. */
  static PoolQuery FromString(std::string_view s) {
    PoolQuery q;
    if (Status st = Parse(s, &q); !st.ok()) throw Error(st);
    return q;
  }

  /** The textual form FromString accepts. */
  std::string ToString() const {
    switch (mode_) {
      case RoutingMode::kNull: return "null";
      case RoutingMode::kLocal: return "local";
      case RoutingMode::kDynamic: return "dynamic";
      case RoutingMode::kDirectId: return "direct_id:" + std::to_string(GetId());
      case RoutingMode::kDirectHash: return "direct_hash:" + std::to_string(value_);
      case RoutingMode::kRange:
        return "range:" + std::to_string(GetRangeOffset()) + ":" + std::to_string(count_);
      case RoutingMode::kBroadcast: return "broadcast";
      case RoutingMode::kPhysical: return "physical:" + std::to_string(GetId());
      case RoutingMode::kLocalGpuBcast: return "local_gpu_bcast";
      case RoutingMode::kToLocalGpu: return "to_local_gpu:" + std::to_string(GetId());
      case RoutingMode::kToLocalCpu: return "to_local_cpu";
    }
    return "invalid";
  }

  /** True when the mode is one this build knows (guards decoded bytes). */
  CHI_CROSS_FUN constexpr bool IsValid() const {
    return static_cast<u32>(mode_) <= static_cast<u32>(RoutingMode::kToLocalCpu) &&
           (mode_ != RoutingMode::kRange || count_ > 0);
  }

  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(mode_, count_, value_);
  }

  /**
   * True when the query carries arguments (count or value). A compact routing header
   * (Task::SerializeBaseIn) sends the mode alone otherwise.
   */
  CHI_CROSS_FUN constexpr bool HasArgs() const { return count_ != 0 || value_ != 0; }
  /** Serializes the arguments alone; the mode travels in the compact header. */
  template <typename Ar>
  CHI_CROSS_FUN void SerializeArgs(Ar &ar) {
    ar(count_, value_);
  }
  /** Sets a mode read from a compact header, with no arguments (IsValid judges it). */
  CHI_CROSS_FUN void SetWireMode(u32 mode) {
    mode_ = static_cast<RoutingMode>(mode);
    count_ = 0;
    value_ = 0;
  }

 private:
  CHI_CROSS_FUN constexpr PoolQuery(RoutingMode mode, u64 value, u32 count)
      : mode_(mode), count_(count), value_(value) {}
  static Status Set(PoolQuery *out, PoolQuery q) {
    *out = q;
    return Status::Ok();
  }

  RoutingMode mode_ = RoutingMode::kNull;
  u32 count_ = 0;
  u64 value_ = 0;
};

}  // namespace chi
