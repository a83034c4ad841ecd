// Router: turns a task's PoolQuery into the container ids it runs on (one node).
// Pure function of the pool's domain tables and the query, so it is tested alone.
//
// Resolution (single node; every container of a pool is local):
//   Local / Physical(this node) / ToLocalCpu (from the CPU) -> the first local container
//   DirectId(c)                  -> c (error if c >= containers)
//   DirectHash(h)                -> h % containers
//   Range(o, n)                  -> o .. o+n-1 (error if past the end)
//   Broadcast                    -> every container, ascending
//   Dynamic                      -> resolved earlier by Monitor(kGlobalSchedule)
// Several targets mean fan-out: the task is replicated, one replica per target,
// and replicas are folded back into the original in ascending container order.
#pragma once

#include <vector>  // targets

#include "chi/core/pool_query.h"        // PoolQuery, RoutingMode
#include "chi/core/status.h"            // Status
#include "chi/runtime/pool_manager.h"   // PoolInfo

namespace chi {

/** Container ids a query selects; small-vector-like to avoid allocating for one target. */
struct RouteTargets {
  ContainerId single_ = 0;
  std::vector<ContainerId> many_;
  bool fan_out_ = false;

  u32 Count() const { return fan_out_ ? static_cast<u32>(many_.size()) : 1u; }
};

/** Resolves `q` against `pool`; the error names the pool and the bad selector. */
inline Status ResolveQuery(const PoolInfo &pool, const PoolQuery &q, NodeId this_node,
                           RouteTargets *out) {
  const u32 n = pool.num_containers_;
  out->fan_out_ = false;
  switch (q.GetMode()) {
    case RoutingMode::kLocal:
    case RoutingMode::kDynamic:
    case RoutingMode::kToLocalCpu:  // on the CPU side, the local CPU is this node
      if (pool.domain_.local_.empty()) break;
      out->single_ = pool.domain_.local_.front();
      return Status::Ok();
    case RoutingMode::kPhysical:
      if (q.GetId() != this_node) {
        return Status::Errorf(ErrorCode::kUnsupported,
                              "pool %s: node %u is not reachable from node %u (single node)",
                              pool.id_.ToString().c_str(), q.GetId(), this_node);
      }
      if (pool.domain_.local_.empty()) break;
      out->single_ = pool.domain_.local_.front();
      return Status::Ok();
    case RoutingMode::kDirectId:
      if (q.GetId() >= n) {
        return Status::Errorf(ErrorCode::kInvalidArgument,
                              "pool %s has %u containers; direct_id:%u does not exist",
                              pool.id_.ToString().c_str(), n, q.GetId());
      }
      out->single_ = q.GetId();
      return Status::Ok();
    case RoutingMode::kDirectHash:
      out->single_ = static_cast<ContainerId>(q.GetHash() % n);
      return Status::Ok();
    case RoutingMode::kRange: {
      const u64 end = static_cast<u64>(q.GetRangeOffset()) + q.GetRangeCount();
      if (q.GetRangeCount() == 0 || end > n) {
        return Status::Errorf(ErrorCode::kInvalidArgument,
                              "pool %s has %u containers; range %u+%u is out of bounds",
                              pool.id_.ToString().c_str(), n, q.GetRangeOffset(),
                              q.GetRangeCount());
      }
      if (q.GetRangeCount() == 1) {
        out->single_ = q.GetRangeOffset();
        return Status::Ok();
      }
      out->many_.clear();
      for (u32 c = q.GetRangeOffset(); c < end; ++c) out->many_.push_back(c);
      out->fan_out_ = true;
      return Status::Ok();
    }
    case RoutingMode::kBroadcast:
      if (n == 1) {
        out->single_ = 0;
        return Status::Ok();
      }
      out->many_.clear();
      for (u32 c = 0; c < n; ++c) out->many_.push_back(c);
      out->fan_out_ = true;
      return Status::Ok();
    case RoutingMode::kNull:
      return Status::Errorf(ErrorCode::kInvalidArgument, "pool %s: a null query routes nowhere",
                            pool.id_.ToString().c_str());
    case RoutingMode::kLocalGpuBcast:
    case RoutingMode::kToLocalGpu:
      return Status::Errorf(ErrorCode::kUnsupported,
                            "pool %s: GPU routing (%s) needs a runtime built with "
                            "CHIMAERA_ENABLE_CUDA or CHIMAERA_ENABLE_ROCM",
                            pool.id_.ToString().c_str(), q.ToString().c_str());
  }
  return Status::Errorf(ErrorCode::kUnknownPool, "pool %s has no container on this node",
                        pool.id_.ToString().c_str());
}

}  // namespace chi
