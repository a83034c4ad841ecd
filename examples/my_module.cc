// A module of your own, start to finish: "tally", a counter per key, sharded over the
// containers of a pool. It shows the pieces a module is made of (task types, a runtime with
// its method table, a client), a CoMutex guarding a container's state, a handler that sends
// subtasks and waits for them, DirectHash routing (a key always reaches the same
// container) and a Broadcast whose answers fold back with the task's Aggregate.
//
//   ./my_module [keys=1000] [containers=4]
#include <chi/chi.h>

#include <cstdio>
#include <cstdlib>
#include <functional>  // std::hash: which container holds a key
#include <string>
#include <string_view>
#include <unordered_map>

namespace chimaera::tally {

/** Method ids: 0 is kCreate for every module, custom methods start at 10. */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kAdd = 10;
  static constexpr chi::MethodId kAddBoth = 11;
  static constexpr chi::MethodId kTotal = 12;
};

/** The hash a key is routed by (PoolQuery::DirectHash: container = hash % containers). */
inline chi::u64 KeyHash(std::string_view key) { return std::hash<std::string_view>()(key); }

/** Adds amount_ to key_'s count; answers the new count and the container that holds it. */
struct AddTask : public chi::Task {
  CHI_IN chi::FixedString<64> key_;
  CHI_IN chi::u64 amount_ = 0;
  CHI_OUT chi::u64 count_ = 0;
  CHI_OUT chi::u32 container_ = 0;

  AddTask() = default;
  AddTask(std::string_view key, chi::u64 amount) : amount_(amount) {
    key_.Assign(key.data(), static_cast<chi::u32>(key.size()));
  }
  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(key_, amount_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(count_, container_);
  }
};

/** Adds amount_ to two keys, wherever they live: the handler sends two subtasks. */
struct AddBothTask : public chi::Task {
  CHI_IN chi::FixedString<64> first_, second_;
  CHI_IN chi::u64 amount_ = 0;

  AddBothTask() = default;
  AddBothTask(std::string_view first, std::string_view second, chi::u64 amount)
      : amount_(amount) {
    first_.Assign(first.data(), static_cast<chi::u32>(first.size()));
    second_.Assign(second.data(), static_cast<chi::u32>(second.size()));
  }
  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(first_, second_, amount_);
  }
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/** The sum of every count. Sent to all containers (Broadcast); their answers add up. */
struct TotalTask : public chi::Task {
  CHI_OUT chi::u64 total_ = 0;
  CHI_OUT chi::u32 containers_ = 0;  ///< how many containers answered

  /** Folds one container's answer into this task (the runtime calls it per replica). */
  void Aggregate(const TotalTask &replica, chi::u32) {
    total_ += replica.total_;
    containers_ += replica.containers_;
  }
  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(total_, containers_);
  }
};

/** Submits tally tasks to one pool. */
class Client : public chi::ContainerClient {
 public:
  explicit Client(chi::PoolId id) : ContainerClient(id) {}

  /** Creates (or finds) the pool with `containers` containers. */
  chi::Future<chimaera::admin::CreatePoolTask> AsyncCreate(std::string_view name,
                                                           chi::u32 containers) {
    return chimaera::admin::Client().AsyncCreatePool(chi::PoolQuery::Local(), "chimaera_tally",
                                                     name, pool_id_, containers);
  }
  /** Adds to `key` on the container that holds it. */
  chi::Future<AddTask> AsyncAdd(std::string_view key, chi::u64 amount) {
    return Submit(MakeTask<AddTask>(pool_id_, chi::PoolQuery::DirectHash(KeyHash(key)),
                                    Method::kAdd, key, amount));
  }
  /** Adds to two keys; runs on `first`'s container, which sends the two adds. */
  chi::Future<AddBothTask> AsyncAddBoth(std::string_view first, std::string_view second,
                                        chi::u64 amount) {
    return Submit(MakeTask<AddBothTask>(pool_id_, chi::PoolQuery::DirectHash(KeyHash(first)),
                                        Method::kAddBoth, first, second, amount));
  }
  /** The sum over every container. */
  chi::Future<TotalTask> AsyncTotal() {
    return Submit(MakeTask<TotalTask>(pool_id_, chi::PoolQuery::Broadcast(), Method::kTotal));
  }
};

/** One container: its share of the keys. */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  /** A new container starts empty. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}

  /** Counts under the container's lock: tasks of one container may run on several workers. */
  void Add(AddTask &task, chi::RunContext &) {
    mutex_.Lock();  // suspends this task's fiber, never the worker, while another holds it
    chi::u64 &count = counts_[std::string(task.key_.view())];
    count += task.amount_;
    task.count_ = count;
    mutex_.Unlock();
    task.container_ = container_id_;
  }

  /** Sends one Add per key and waits for both: each goes to the container of its key. */
  void AddBoth(AddBothTask &task, chi::RunContext &) {
    Client self(pool_id_);
    auto first = self.AsyncAdd(task.first_.view(), task.amount_);
    auto second = self.AsyncAdd(task.second_.view(), task.amount_);
    first.Wait();  // suspends this task's fiber until the subtask is done
    second.Wait();
    for (auto *sub : {&first, &second}) {
      if ((*sub)->GetReturnCode() != 0) {
        return task.SetError(static_cast<chi::ErrorCode>((*sub)->GetReturnCode()),
                             (*sub)->GetMessage());
      }
    }
  }

  /** This container's sum; Broadcast sends a replica to each, TotalTask::Aggregate adds them. */
  void Total(TotalTask &task, chi::RunContext &) {
    mutex_.Lock();
    for (const auto &kv : counts_) task.total_ += kv.second;
    mutex_.Unlock();
    task.containers_ = 1;
  }

  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, chimaera::admin::CreatePoolTask, &Runtime::Create, "Create">,
      chi::Method<Method::kAdd, AddTask, &Runtime::Add, "Add">,
      chi::Method<Method::kAddBoth, AddBothTask, &Runtime::AddBoth, "AddBoth">,
      chi::Method<Method::kTotal, TotalTask, &Runtime::Total, "Total">>;

 private:
  chi::CoMutex mutex_;
  std::unordered_map<std::string, chi::u64> counts_;
};

/** Makes the module known to the runtime of every program that includes this file. */
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>("chimaera_tally");

}  // namespace chimaera::tally

int main(int argc, char **argv) {
  const int keys = argc > 1 ? std::atoi(argv[1]) : 1000;
  const chi::u32 containers = argc > 2 ? static_cast<chi::u32>(std::atoi(argv[2])) : 4;
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 1;
  chimaera::tally::Client tally(chi::PoolId(210, 0));
  auto created = tally.AsyncCreate("tally", containers);
  created.Wait();
  if (created->GetReturnCode() != 0) {
    std::fprintf(stderr, "create failed: %s\n", created->GetMessage());
    return 1;
  }
  int wrong = 0;
  // Every key once, then key 0 and key 1 once more each through one AddBoth.
  for (int i = 0; i < keys; ++i) {
    const std::string key = "key" + std::to_string(i);
    auto f = tally.AsyncAdd(key, 1);
    f.Wait();
    const bool right = f->GetReturnCode() == 0 && f->count_ == 1 &&
                       f->container_ == chimaera::tally::KeyHash(key) % containers;
    wrong += right ? 0 : 1;
  }
  auto both = tally.AsyncAddBoth("key0", "key1", 1);
  both.Wait();
  wrong += both->GetReturnCode() == 0 ? 0 : 1;
  auto again = tally.AsyncAdd("key1", 0);
  again.Wait();
  wrong += again->count_ == 2 ? 0 : 1;
  auto total = tally.AsyncTotal();
  total.Wait();
  wrong += total->total_ == static_cast<chi::u64>(keys) + 2 ? 0 : 1;
  wrong += total->containers_ == containers ? 0 : 1;
  std::printf("tally: %d keys on %u containers, total %llu from %u containers; %d wrong\n",
              keys, containers, static_cast<unsigned long long>(total->total_),
              total->containers_, wrong);
  chi::CHIMAERA_FINALIZE();
  return wrong == 0 ? 0 : 1;
}
