// benchmarks/embedded: the embedded runtime's hot path against the raw floors
// measured in the same run. Each runtime configuration runs in a forked child
// (CHIMAERA_INIT once per process), with its worker counts set through a
// temporary CHI_SERVER_CONF file.
//
// Prints: the fiber a task runs on, a reused shell vs a new Boost fiber per task;
// synchronous task round trip vs two-thread atomic ping-pong (on CPUs 0 and 1, and again
// on the CPUs the caller and the worker ran on); async throughput
// of empty tasks with 1 and 2 workers; subtask spawn+wait inside a task; wake
// latency of a parked worker vs a raw futex wake; stamping task ids on two threads at once
// vs a shared counter; the round trip of a task queued behind a worker stuck in a long
// task (two workers: the idle one takes it after the 100 us lane help wait, lane_help.h).
#include <dirent.h>  // /proc/self/task: where the worker thread runs
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>

#include "bench_util.h"

using chi_bench::MedianOf;
using chi_bench::NowNs;

namespace {

constexpr int kReps = 7;

/** Spins its worker for spin_ns without yielding: the stuck worker of the lane help figure. */
struct SpinTask : public chi::Task {
  CHI_IN chi::u64 spin_ns_ = 0;

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(spin_ns_);
  }
  template <typename Ar>
  void SerializeOut(Ar &) {}
};

/** Set once a SpinTask runs (the runtime is embedded: same process). */
std::atomic<int> g_spinning{0};

/** A module with one method, Spin. */
class SpinModule : public chi::ModuleRuntime<SpinModule> {
 public:
  /** A pool of it needs nothing set up. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  /** Keeps its worker for the time asked. */
  void Spin(SpinTask &t, chi::RunContext &) {
    g_spinning = 1;
    const double end = NowNs() + static_cast<double>(t.spin_ns_);
    while (NowNs() < end) chi::CpuRelax();
  }
  using Methods = chi::MethodList<
      chi::Method<0, chimaera::admin::CreatePoolTask, &SpinModule::Create, "Create">,
      chi::Method<10, SpinTask, &SpinModule::Spin, "Spin">>;
};
const bool kSpinRegistered = chi::ModuleManager::Register<SpinModule>("bench_spin");

/**
 * Two threads bouncing one atomic flag: the floor for a cross-core round trip. They run
 * pinned to CPUs `here` (the caller) and `there`.
 */
double AtomicPingPongNs(int iters, unsigned here = 0, unsigned there = 1) {
  alignas(64) std::atomic<int> flag{0};
  std::thread other([&] {
    chi_bench::PinTo(there);
    for (int i = 0; i < iters; ++i) {
      while (flag.load(std::memory_order_acquire) != 1) {
      }
      flag.store(0, std::memory_order_release);
    }
  });
  chi_bench::PinTo(here);
  const double t0 = NowNs();
  for (int i = 0; i < iters; ++i) {
    flag.store(1, std::memory_order_release);
    while (flag.load(std::memory_order_acquire) != 0) {
    }
  }
  const double t1 = NowNs();
  other.join();
  chi_bench::Unpin();  // runtime threads made later must not inherit the pin
  return (t1 - t0) / iters;
}

/**
 * The CPU a thread of this process named `name` last ran on (field 39 of its
 * /proc/self/task/<tid>/stat), or -1 when there is none.
 */
int ThreadCpu(const char *name) {
  DIR *dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int cpu = -1;
  while (dirent *e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(base + "/comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    chi::detail::ForEachStatField((base + "/stat").c_str(), 39, [&](int field, const char *text) {
      if (field == 39) cpu = static_cast<int>(chi::detail::StatNumber(text));
    });
    break;
  }
  closedir(dir);
  return cpu;
}

/** Mean ns per call of op() when `threads` threads each make `iters` calls side by side. */
template <typename Op>
double SideBySideNs(int threads, int iters, Op op) {
  std::vector<std::thread> ts;
  const double t0 = NowNs();
  for (int k = 0; k < threads; ++k) {
    ts.emplace_back([&] {
      for (int i = 0; i < iters; ++i) op();
    });
  }
  for (std::thread &t : ts) t.join();
  return (NowNs() - t0) / iters;
}

/** A thread parked on a futex, woken by a store + FUTEX_WAKE, answering by a flag. */
double FutexWakeRoundTripNs(int iters) {
  alignas(64) chi::Atomic<chi::u32> word;
  alignas(64) std::atomic<int> ack{0};
  std::thread sleeper([&] {
    chi_bench::PinTo(1);
    for (int i = 0; i < iters; ++i) {
      while (word.Load() == 0) chi::FutexWait(word.Raw(), 0);
      word.Store(0);
      ack.store(1, std::memory_order_release);
    }
  });
  chi_bench::PinTo(0);
  std::vector<double> samples;
  for (int i = 0; i < iters; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // same idle gap as ours
    const double t0 = NowNs();
    word.Store(1);
    chi::FutexWake(word.Raw(), 1);
    while (ack.load(std::memory_order_acquire) == 0) {
    }
    samples.push_back(NowNs() - t0);
    ack.store(0, std::memory_order_relaxed);
  }
  sleeper.join();
  chi_bench::Unpin();
  return chi_bench::Median(samples);
}

/** A new Boost fiber on a pooled stack per job, run to its end: what each task once cost. */
double NewFiberPerJobNs(int iters) {
  chi::StackPool stacks;
  int runs = 0;
  const double t0 = NowNs();
  for (int i = 0; i < iters; ++i) {
    chi::ctx::fiber f(std::allocator_arg, chi::PooledStack(&stacks),
                      [&runs](chi::ctx::fiber &&owner) {
                        ++runs;
                        return std::move(owner);
                      });
    f = std::move(f).resume();
  }
  const double t1 = NowNs();
  if (runs != iters) std::exit(4);
  return (t1 - t0) / iters;
}

/** Jobs for ShellJobBody: one handed per Enter. */
struct ShellJobs {
  bool handed = false;
  int runs = 0;
};

/** Body of the benchmark's shells: runs a handed job, suspends; returns when none is handed. */
void ShellJobBody(void *arg, chi::FiberShell &shell) {
  auto *jobs = static_cast<ShellJobs *>(arg);
  while (jobs->handed) {
    jobs->handed = false;
    ++jobs->runs;
    shell.Suspend();
  }
}

/** An idle fiber shell taken, entered for one job and given back: what each task costs now. */
double ReusedShellPerJobNs(int iters) {
  chi::FiberSanitizerState owner;
  owner.AdoptCurrentThread();
  ShellJobs jobs;
  chi::ShellPool pool(64 * 1024, &owner, &ShellJobBody, &jobs);
  const double t0 = NowNs();
  for (int i = 0; i < iters; ++i) {
    chi::FiberShell *shell = pool.Take();
    jobs.handed = true;
    shell->Enter();
    pool.Give(shell);
  }
  const double t1 = NowNs();
  pool.EndIdle();
  if (jobs.runs != iters) std::exit(4);
  return (t1 - t0) / iters;
}

/** Writes a config with the given worker counts and points CHI_SERVER_CONF at it. */
void UseWorkers(unsigned low, unsigned high) {
  std::string path = "/tmp/chi_bench_embedded_" + std::to_string(getpid()) + ".yaml";
  FILE *f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "workers:\n  low_latency: %u\n  high_latency: %u\nqueue_depth: 4096\n", low,
               high);
  std::fclose(f);
  setenv("CHI_SERVER_CONF", path.c_str(), 1);
}

chimaera::demo::Client StartRuntime(unsigned low, unsigned high) {
  chi_bench::Unpin();  // workers inherit the creating thread's CPU mask
  UseWorkers(low, high);
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) std::exit(2);
  chimaera::demo::Client client;
  auto f = client.AsyncCreate(chi::PoolQuery::Local(), "bench", chi::PoolId(300, 0));
  f.Wait();
  if (f->GetReturnCode() != 0) std::exit(3);
  return client;
}

/** Runs fn in a forked child so each configuration gets a fresh runtime. */
template <typename Fn>
void InChild(Fn fn) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    std::fflush(stdout);
    chi::CHIMAERA_FINALIZE();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("  (child failed with status %d)\n", status);
  }
}

}  // namespace

int main() {
  std::printf("chi embedded runtime benchmark (medians of %d repetitions; %u cpus)\n", kReps,
              std::thread::hardware_concurrency());
  const double floor_rt = MedianOf(kReps, [] { return AtomicPingPongNs(200000); });
  const double floor_wake = FutexWakeRoundTripNs(200);

  const double new_fiber = MedianOf(kReps, [] { return NewFiberPerJobNs(200000); });
  const double shell = MedianOf(kReps, [] { return ReusedShellPerJobNs(200000); });
  chi_bench::ReportLatency("task fiber: reused shell, enter+suspend", shell,
                           "new Boost fiber per task (pooled)", new_fiber);

  // Stamping a task's id (every submit does) on two threads at once, against the shared
  // counter it would otherwise take each id from.
  alignas(64) std::atomic<chi::u64> shared_counter{0};
  const double counter = MedianOf(kReps, [&] {
    return SideBySideNs(2, 2000000, [&] { shared_counter.fetch_add(1, std::memory_order_relaxed); });
  });
  const double stamp = MedianOf(kReps, [] {
    return SideBySideNs(2, 2000000, [] {
      thread_local chimaera::demo::GpuSubmitTask task;
      chi::GetIpcManager().Stamp(&task);
    });
  });
  chi_bench::ReportLatency("task id stamp, 2 threads at once", stamp,
                           "shared-counter fetch_add, 2 threads", counter);

  InChild([&] {
    auto client = StartRuntime(1, 0);
    const double rt = MedianOf(kReps, [&] {
      const int n = 20000;
      const double t0 = NowNs();
      for (int i = 0; i < n; ++i) {
        auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i);
        f.Wait();
      }
      return (NowNs() - t0) / n;
    });
    chi_bench::ReportLatency("sync task round trip (1 worker)", rt, "atomic ping-pong (2 threads)",
                             floor_rt);
    // The floor above runs on CPUs 0 and 1, the round trip wherever the scheduler put the
    // caller and the worker: on a many-core host their distance can differ by several x.
    const int caller_cpu = sched_getcpu();
    const int worker_cpu = ThreadCpu("chi-worker-0");
    if (caller_cpu >= 0 && worker_cpu >= 0 && caller_cpu != worker_cpu) {
      const double here = MedianOf(kReps, [&] {
        return AtomicPingPongNs(200000, static_cast<unsigned>(caller_cpu),
                                static_cast<unsigned>(worker_cpu));
      });
      char label[96];
      std::snprintf(label, sizeof(label), "atomic ping-pong, CPUs %d and %d", caller_cpu,
                    worker_cpu);
      chi_bench::ReportLatency("sync task round trip, its own CPUs", rt, label, here);
    } else {
      std::printf("sync task round trip: caller on CPU %d, worker on CPU %d (not compared)\n",
                  caller_cpu, worker_cpu);
    }

    const double per_level = MedianOf(kReps, [&] {
      const chi::u32 depth = 200;
      double t_deep = 0, t_one = 0;
      for (int i = 0; i < 20; ++i) {
        double t0 = NowNs();
        client.AsyncWaitTest(chi::PoolQuery::Local(), depth).Wait();
        t_deep += NowNs() - t0;
        t0 = NowNs();
        client.AsyncWaitTest(chi::PoolQuery::Local(), 1).Wait();
        t_one += NowNs() - t0;
      }
      return (t_deep - t_one) / 20 / (depth - 1);
    });
    chi_bench::ReportLatency("subtask spawn+wait inside a task", per_level,
                             "atomic ping-pong (2 threads)", floor_rt);

    std::vector<double> wake;
    for (int i = 0; i < 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the worker parks
      const double t0 = NowNs();
      client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i).Wait();
      wake.push_back(NowNs() - t0);
    }
    chi_bench::ReportLatency("round trip waking a parked worker", chi_bench::Median(wake),
                             "raw futex wake round trip", floor_wake);
  });

  InChild([&] {
    auto client = StartRuntime(2, 0);
    const chi::PoolId spin_pool(301, 0);
    auto made = chimaera::admin::Client().AsyncCreatePool(chi::PoolQuery::Local(), "bench_spin",
                                                          "bench_spin", spin_pool);
    if (!made.Wait(30) || made->GetReturnCode() != 0) std::exit(5);
    auto *hog_task = chi::NewTask<SpinTask>();
    hog_task->pool_id_ = spin_pool;
    hog_task->pool_query_ = chi::PoolQuery::Local();
    hog_task->method_ = 10;
    hog_task->spin_ns_ = 3000000000ull;
    auto hog = chi::GetIpcManager().Send(hog_task);
    while (g_spinning.load() == 0) std::this_thread::yield();
    // Pairs of tasks from one thread rotate over both workers: one of each pair queues
    // behind the hog. The pause lets the idle worker park deep first, as it would in
    // an application that submits now and then.
    std::vector<double> behind;
    for (int i = 0; i < 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const double t0 = NowNs();
      auto a = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i);
      auto b = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i);
      a.Wait();
      b.Wait();
      behind.push_back(NowNs() - t0);
    }
    const bool hog_still_ran = !hog.IsComplete();
    hog.Wait();
    if (!hog_still_ran) std::printf("  (the stuck worker's task ended before the figure did)\n");
    chi_bench::ReportLatency("task queued behind a stuck worker (2 workers)",
                             chi_bench::Median(behind), "raw futex wake round trip", floor_wake);
  });

  for (unsigned workers : {1u, 2u}) {
    InChild([&] {
      auto client = StartRuntime(workers, 0);
      const double rate = MedianOf(kReps, [&] {
        const int batch = 2048, rounds = 50;
        std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> fs;
        fs.reserve(batch);
        const double t0 = NowNs();
        for (int r = 0; r < rounds; ++r) {
          for (int i = 0; i < batch; ++i) fs.push_back(client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, i));
          chi::WaitAll(fs);
          fs.clear();
        }
        return batch * rounds / ((NowNs() - t0) * 1e-9);
      });
      std::string label = "async empty tasks, " + std::to_string(workers) + " worker(s)";
      chi_bench::ReportRate(label.c_str(), rate, "atomic ping-pong rate", 1e9 / floor_rt);
    });
  }
  return 0;
}
