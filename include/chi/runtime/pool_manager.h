// PoolManager: the pools and containers on this node. Lookups by id are on the
// hot path (every task): readers take an immutable snapshot through one atomic
// load; create/destroy (rare) copy the table under a mutex and publish it.
// Retired snapshots and PoolInfos live until the manager dies, so a reader never
// touches freed memory.
#pragma once

#include <memory>         // unique_ptr for containers and snapshots
#include <mutex>          // writers only
#include <string>         // names
#include <string_view>    // lookups
#include <unordered_map>  // id -> info, name -> id
#include <vector>         // containers, domain tables

#include "chi/core/atomic.h"             // in-flight counters, snapshot pointer
#include "chi/core/ids.h"                // PoolId, ContainerId, NodeId
#include "chi/core/status.h"             // Status
#include "chi/core/striped_counter.h"    // in flight and done, counted by every worker
#include "chi/module/container.h"        // Container
#include "chi/module/module_manager.h"   // module factories

namespace chi {

/** Seed 004 domain tables: which containers are here, and where every container lives. */
struct DomainTables {
  std::vector<ContainerId> local_;  ///< kLocal: containers on this node, ascending
  std::vector<NodeId> global_;      ///< kGlobal: container id -> node id
};

/** One pool as this node sees it. */
struct PoolInfo {
  PoolId id_;
  std::string name_;
  std::string module_name_;
  u32 num_containers_ = 0;
  DomainTables domain_;
  std::vector<std::unique_ptr<Container>> containers_;  ///< index = container id (local ones)
  StripedCounter inflight_;    ///< tasks routed to this pool and not yet completed
  Atomic<u32> destroying_;     ///< set once DestroyPool starts; new tasks are refused
  StripedCounter tasks_done_;  ///< statistics

  /** Tasks in flight now (statistics: a sum racing with the workers may read off). */
  u64 InflightForStats() const {
    const u64 n = inflight_.Sum(MemOrder::kRelaxed);
    return n > (1ull << 63) ? 0 : n;  // a release summed before its acquire reads below 0
  }

  /** The local container with this id, or nullptr. */
  Container *GetContainer(ContainerId id) const {
    return id < containers_.size() ? containers_[id].get() : nullptr;
  }
  /** The first local container (what PoolQuery::Local() reaches). */
  Container *FirstLocal() const {
    return domain_.local_.empty() ? nullptr : GetContainer(domain_.local_.front());
  }
};

/** Summary of one pool for Monitor. */
struct PoolStats {
  PoolId id_;
  std::string name_;
  std::string module_name_;
  u32 num_containers_ = 0;
  u64 inflight_ = 0;
  u64 tasks_done_ = 0;

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(id_, name_, module_name_, num_containers_, inflight_, tasks_done_);
  }
};

/** Registry of pools on this node. */
class PoolManager {
 public:
  explicit PoolManager(NodeId node_id = 0) : node_id_(node_id) {
    snapshot_.Store(reinterpret_cast<u64>(Publish(Table{})), MemOrder::kRelease);
  }

  /**
   * Finds a live pool and counts one task in flight on it (hot path). Returns
   * nullptr when the pool is unknown or being destroyed; pair with Release.
   */
  PoolInfo *Acquire(PoolId id) {
    PoolInfo *info = Snapshot()->Find(id.ToU64());
    if (info == nullptr) return nullptr;
    // seq_cst pairs with DestroyPool's seq_cst store of destroying_: either it sees
    // our increment and waits for us, or we see its flag and back off.
    info->inflight_.Add(1, MemOrder::kSeqCst);
    if (info->destroying_.Load(MemOrder::kSeqCst) != 0) {
      Release(info);
      return nullptr;
    }
    return info;
  }

  /** Ends one in-flight task on the pool. */
  void Release(PoolInfo *info) {
    // release: the task's effects are visible to whoever observes the count drop.
    info->inflight_.Sub(1, MemOrder::kRelease);
  }

  /** The pool with this name, or the null id. */
  PoolId FindByName(std::string_view name) const {
    const Table *t = Snapshot();
    auto it = t->by_name.find(std::string(name));
    return it == t->by_name.end() ? PoolId::GetNull() : it->second;
  }

  /** True when a pool with this id is registered (and not being destroyed). */
  bool Contains(PoolId id) const {
    const PoolInfo *info = Snapshot()->Find(id.ToU64());
    return info != nullptr && info->destroying_.Load(MemOrder::kAcquire) == 0;
  }

  /**
   * Creates a pool of `module_name` with `num_containers` containers, all local
   * (single node). A null `id` picks a fresh one. The new pool is not visible
   * until `Publish`ed via CommitPool, so its containers can run Create first.
   */
  Status PreparePool(std::string_view module_name, std::string_view pool_name, PoolId id,
                     u32 num_containers, std::unique_ptr<PoolInfo> *out) {
    if (num_containers == 0 || num_containers > kMaxContainers) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "pool '%.*s': container count %u is outside 1..%u",
                            static_cast<int>(pool_name.size()), pool_name.data(), num_containers,
                            kMaxContainers);
    }
    ContainerFactory factory = ModuleManager::Get().Find(module_name);
    if (factory == nullptr) {
      return Status::Errorf(ErrorCode::kUnknownModule,
                            "module '%.*s' is not registered in this process (include its "
                            "_runtime.h in one translation unit)",
                            static_cast<int>(module_name.size()), module_name.data());
    }
    std::lock_guard<std::mutex> g(mu_);
    if (id.IsNull()) id = PoolId(next_major_++, 0);
    auto info = std::make_unique<PoolInfo>();
    info->id_ = id;
    info->name_ = std::string(pool_name);
    info->module_name_ = std::string(module_name);
    info->num_containers_ = num_containers;
    for (ContainerId c = 0; c < num_containers; ++c) {
      info->domain_.local_.push_back(c);
      info->domain_.global_.push_back(node_id_);
      std::unique_ptr<Container> ctr(factory());
      ctr->Init(id, pool_name, c, num_containers);
      info->containers_.push_back(std::move(ctr));
    }
    *out = std::move(info);
    return Status::Ok();
  }

  /**
   * Makes a prepared pool visible. Fails (and drops it) when the id or name is
   * taken; `existing` then receives the id of the pool holding the name.
   */
  Status CommitPool(std::unique_ptr<PoolInfo> info, PoolId *existing = nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    const Table *cur = Snapshot();
    if (auto it = cur->by_name.find(info->name_); it != cur->by_name.end()) {
      if (existing != nullptr) *existing = it->second;
      return Status::Errorf(ErrorCode::kAlreadyExists, "pool name '%s' is already pool %s",
                            info->name_.c_str(), it->second.ToString().c_str());
    }
    if (cur->by_id.count(info->id_.ToU64()) != 0) {
      return Status::Errorf(ErrorCode::kAlreadyExists, "pool id %s is already in use",
                            info->id_.ToString().c_str());
    }
    if (info->id_.major_ >= next_major_) next_major_ = info->id_.major_ + 1;
    Table next = *cur;
    next.by_id[info->id_.ToU64()] = info.get();
    next.by_name[info->name_] = info->id_;
    all_.push_back(std::move(info));
    Swap(std::move(next));
    return Status::Ok();
  }

  /**
   * Starts destroying a pool: new tasks are refused from now on. Returns the
   * PoolInfo so the caller can wait for in-flight tasks, then call FinishDestroy.
   */
  PoolInfo *BeginDestroy(PoolId id, Status *st) {
    std::lock_guard<std::mutex> g(mu_);
    PoolInfo *info = Snapshot()->Find(id.ToU64());
    if (info == nullptr || info->destroying_.Load(MemOrder::kAcquire) != 0) {
      *st = Status::Errorf(ErrorCode::kUnknownPool, "pool %s does not exist",
                           id.ToString().c_str());
      return nullptr;
    }
    info->destroying_.Store(1, MemOrder::kSeqCst);  // pairs with Acquire's check
    *st = Status::Ok();
    return info;
  }

  /** Unpublishes a drained pool and deletes its containers (the PoolInfo is retired). */
  void FinishDestroy(PoolInfo *info) {
    std::lock_guard<std::mutex> g(mu_);
    Table next = *Snapshot();
    next.by_id.erase(info->id_.ToU64());
    next.by_name.erase(info->name_);
    Swap(std::move(next));
    info->containers_.clear();
  }

  /** Statistics of every live pool. */
  std::vector<PoolStats> Stats() const {
    std::vector<PoolStats> out;
    const Table *t = Snapshot();
    for (const auto &kv : t->by_id) {
      const PoolInfo *p = kv.second;
      out.push_back(PoolStats{p->id_, p->name_, p->module_name_, p->num_containers_,
                              p->InflightForStats(), p->tasks_done_.Sum(MemOrder::kRelaxed)});
    }
    return out;
  }

  /** Ids of every live pool (for shutdown). */
  std::vector<PoolId> PoolIds() const {
    std::vector<PoolId> out;
    for (const auto &kv : Snapshot()->by_id) out.push_back(kv.second->id_);
    return out;
  }

  NodeId GetNodeId() const { return node_id_; }
  static constexpr u32 kMaxContainers = 1u << 16;

 private:
  /**
   * One published snapshot. by_id is what writers edit; `index` is its read-only copy for
   * the per-task lookup (Find): open addressing in a power-of-two array at most half full,
   * so a lookup is a multiply, a shift and usually one probe (the node-based map costs a
   * division and a chain of dependent loads).
   */
  struct Table {
    struct Slot {
      u64 id = 0;
      PoolInfo *info = nullptr;  ///< nullptr: empty
    };
    std::unordered_map<u64, PoolInfo *> by_id;
    std::unordered_map<std::string, PoolId> by_name;
    std::vector<Slot> index;
    u32 shift = 63;  ///< 64 - log2(index.size())

    /** Fills `index` from by_id (once, before the table is published). */
    void BuildIndex() {
      u32 bits = 1;
      while ((1ull << bits) < 2 * by_id.size()) ++bits;
      index.assign(1ull << bits, Slot{});
      shift = 64 - bits;
      for (const auto &[id, info] : by_id) {
        u64 k = Home(id);
        while (index[k].info != nullptr) k = (k + 1) & (index.size() - 1);
        index[k] = Slot{id, info};
      }
    }
    /** The pool with this id in the snapshot, or nullptr. */
    PoolInfo *Find(u64 id) const {
      for (u64 k = Home(id);; k = (k + 1) & (index.size() - 1)) {
        const Slot &s = index[k];
        if (s.info == nullptr || s.id == id) return s.info;
      }
    }
    /** Where id's probe starts (Fibonacci hashing: the product's top bits mix every id bit). */
    u64 Home(u64 id) const { return (id * 0x9e3779b97f4a7c15ull) >> shift; }
  };

  const Table *Snapshot() const {
    // acquire: the table's contents were written before it was published.
    return reinterpret_cast<const Table *>(snapshot_.Load(MemOrder::kAcquire));
  }
  Table *Publish(Table t) {
    t.BuildIndex();
    tables_.push_back(std::make_unique<Table>(std::move(t)));
    return tables_.back().get();
  }
  void Swap(Table t) { snapshot_.Store(reinterpret_cast<u64>(Publish(std::move(t))), MemOrder::kRelease); }

  NodeId node_id_;
  std::mutex mu_;
  u32 next_major_ = 100;  ///< ids picked for pools created without one start at 100.0
  Atomic<u64> snapshot_;
  std::vector<std::unique_ptr<Table>> tables_;   ///< every snapshot ever published
  std::vector<std::unique_ptr<PoolInfo>> all_;   ///< every pool ever committed
};

}  // namespace chi
