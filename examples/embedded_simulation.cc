// A 2-D heat-diffusion simulation that embeds the chi runtime. Every few steps
// it hands a snapshot of the grid to an analysis pool and a checkpoint pool
// (asynchronously) and keeps computing; at the end it prints what the tasks
// found. The "heat" module below is a complete module in ~80 lines: tasks,
// runtime handlers with their method table, and a client.
//
//   ./embedded_simulation [steps=400] [grid=128] [every=50]
#include <chi/chi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace chimaera::heat {

/** Method ids of the heat module. */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kAnalyze = 10;
  static constexpr chi::MethodId kCheckpoint = 11;
};

/** Statistics of one snapshot of the grid. */
struct AnalyzeTask : public chi::Task {
  CHI_IN chi::u32 step_ = 0;
  CHI_IN chi::TaskBuffer grid_;  ///< n*n doubles
  CHI_OUT double min_ = 0, max_ = 0, total_ = 0;

  template <typename Ar> void SerializeIn(Ar &ar) { ar(step_, grid_); }
  template <typename Ar> void SerializeOut(Ar &ar) { ar(min_, max_, total_); }
};

/** Writes one snapshot to a file. */
struct CheckpointTask : public chi::Task {
  CHI_IN chi::u32 step_ = 0;
  CHI_IN chi::FixedString<128> path_;
  CHI_IN chi::TaskBuffer grid_;
  CHI_OUT chi::u64 bytes_written_ = 0;

  template <typename Ar> void SerializeIn(Ar &ar) { ar(step_, path_, grid_); }
  template <typename Ar> void SerializeOut(Ar &ar) { ar(bytes_written_); }
};

/** The runtime side: runs on the embedded runtime's workers. */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}

  void Analyze(AnalyzeTask &t, chi::RunContext &) {
    const double *g = reinterpret_cast<const double *>(t.grid_.data());
    const size_t n = t.grid_.size() / sizeof(double);
    t.min_ = n ? g[0] : 0;
    t.max_ = t.min_;
    for (size_t i = 0; i < n; ++i) {
      t.min_ = std::fmin(t.min_, g[i]);
      t.max_ = std::fmax(t.max_, g[i]);
      t.total_ += g[i];
    }
  }

  void Checkpoint(CheckpointTask &t, chi::RunContext &) {
    FILE *f = std::fopen(t.path_.c_str(), "wb");
    if (f == nullptr) {
      t.SetErrorf(chi::ErrorCode::kIo, "cannot open %s", t.path_.c_str());
      return;
    }
    t.bytes_written_ = std::fwrite(t.grid_.data(), 1, t.grid_.size(), f);
    std::fclose(f);
  }

  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, chimaera::admin::CreatePoolTask, &Runtime::Create, "Create">,
      // Analyze never waits: it runs on the worker's stack, without a fiber switch.
      chi::Method<Method::kAnalyze, AnalyzeTask, &Runtime::Analyze, "Analyze",
                  chi::RunOn::kWorkerStack>,
      chi::Method<Method::kCheckpoint, CheckpointTask, &Runtime::Checkpoint, "Checkpoint">>;
};

/** Registers the module with the embedded runtime. */
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>("chimaera_heat");

/** The client side: what the simulation calls. */
class Client : public chi::ContainerClient {
 public:
  explicit Client(chi::PoolId id) : ContainerClient(id) {}

  chi::Future<chimaera::admin::CreatePoolTask> AsyncCreate(const char *name) {
    return chimaera::admin::Client().AsyncCreatePool(chi::PoolQuery::Local(), "chimaera_heat",
                                                     name, pool_id_);
  }
  chi::Future<AnalyzeTask> AsyncAnalyze(chi::u32 step, const std::vector<double> &grid) {
    AnalyzeTask *t = MakeTask<AnalyzeTask>(pool_id_, chi::PoolQuery::Local(), Method::kAnalyze);
    t->step_ = step;
    t->grid_.Assign(grid.data(), grid.size() * sizeof(double));
    return Submit(t);
  }
  chi::Future<CheckpointTask> AsyncCheckpoint(chi::u32 step, const std::string &path,
                                              const std::vector<double> &grid) {
    CheckpointTask *t =
        MakeTask<CheckpointTask>(pool_id_, chi::PoolQuery::Local(), Method::kCheckpoint);
    t->step_ = step;
    t->path_.Assign(path.data(), static_cast<chi::u32>(path.size()));
    t->grid_.Assign(grid.data(), grid.size() * sizeof(double));
    return Submit(t);
  }
};

}  // namespace chimaera::heat

/** One explicit finite-difference step of the heat equation with fixed hot edges. */
static void Step(std::vector<double> &u, std::vector<double> &next, int n) {
  const double alpha = 0.2;
  for (int y = 1; y < n - 1; ++y) {
    for (int x = 1; x < n - 1; ++x) {
      const int i = y * n + x;
      next[i] = u[i] + alpha * (u[i - 1] + u[i + 1] + u[i - n] + u[i + n] - 4 * u[i]);
    }
  }
  u.swap(next);
}

int main(int argc, char **argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  const int n = argc > 2 ? std::atoi(argv[2]) : 128;
  const int every = argc > 3 ? std::atoi(argv[3]) : 50;

  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 1;
  chimaera::heat::Client heat(chi::PoolId(500, 0));
  auto created = heat.AsyncCreate("heat_analysis");
  created.Wait();
  if (created->GetReturnCode() != 0) {
    std::fprintf(stderr, "pool creation failed: %s\n", created->GetMessage());
    return 1;
  }

  std::vector<double> u(n * n, 0.0), next(n * n, 0.0);
  for (int x = 0; x < n; ++x) u[x] = next[x] = 100.0;  // the top edge is hot
  std::vector<chi::Future<chimaera::heat::AnalyzeTask>> analyses;
  std::vector<chi::Future<chimaera::heat::CheckpointTask>> checkpoints;
  const std::string ckpt = "/tmp/chi_heat_" + std::to_string(::getpid()) + ".bin";

  for (int s = 1; s <= steps; ++s) {
    Step(u, next, n);
    if (s % every == 0) {
      analyses.push_back(heat.AsyncAnalyze(s, u));  // the simulation keeps going
      checkpoints.push_back(heat.AsyncCheckpoint(s, ckpt, u));
      std::printf("step %5d: submitted analysis and checkpoint (%zu tasks so far)\n", s,
                  analyses.size() + checkpoints.size());
    }
  }

  int failures = 0;
  for (auto &a : analyses) {
    a.Wait();
    failures += a->GetReturnCode() != 0;
    std::printf("analysis of step %5u: min %.3f  max %.3f  total heat %.1f\n", a->step_, a->min_,
                a->max_, a->total_);
  }
  chi::u64 written = 0;
  for (auto &c : checkpoints) {
    c.Wait();
    failures += c->GetReturnCode() != 0;
    written += c->bytes_written_;
  }
  std::printf("checkpoints: %zu written, %llu bytes in total (%s)\n", checkpoints.size(),
              static_cast<unsigned long long>(written), ckpt.c_str());
  std::remove(ckpt.c_str());
  chi::CHIMAERA_FINALIZE();
  return failures == 0 ? 0 : 1;
}
