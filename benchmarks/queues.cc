// bench_queues: round-trip latency and throughput of SpscRing and MpscRing, each printed
// next to the raw floor it is built on (spinning atomic ping-pong between threads, shm
// flag ping-pong between processes, a bare Lamport ring), all measured in this one run.
// Every figure is the median over kReps repetitions; min and max show the noise.
#include <chi/queue/mpsc_ring.h>
#include <chi/queue/spsc_ring.h>

#include <sched.h>     // sched_setaffinity: one CPU per side
#include <sys/mman.h>  // MAP_SHARED memory for the two-process runs
#include <sys/wait.h>  // waitpid for the echo child
#include <unistd.h>    // fork, _exit

#include <algorithm>  // std::sort for medians
#include <atomic>     // start barriers and the bare Lamport ring
#include <cstdio>     // printf: the report
#include <cstdlib>    // std::abort on a broken run
#include <thread>     // the peer threads
#include <vector>     // repetition samples

using chi::u32;
using chi::u64;

namespace {

constexpr int kReps = 11;
constexpr u64 kRoundTrips = 100000;
constexpr u64 kWarmup = 2000;
constexpr u64 kItems = 4000000;
constexpr u32 kRingCapacity = 1024;

/** The two CPUs the sides run on, or -1 when the machine offers fewer than two. */
struct Cpus {
  int a = -1;
  int b = -1;
};
Cpus g_cpus;

/** True when CPUs a and b are SMT siblings (share a core), per sysfs. */
bool SameCore(int a, int b) {
  char path[128];
  std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/core_id", a);
  auto read_id = [](const char *file) {
    long id = -1;
    if (FILE *f = std::fopen(file, "r")) {
      if (std::fscanf(f, "%ld", &id) != 1) id = -1;
      std::fclose(f);
    }
    return id;
  };
  long core_a = read_id(path);
  std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                a);
  long pkg_a = read_id(path);
  std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/core_id", b);
  long core_b = read_id(path);
  std::snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                b);
  long pkg_b = read_id(path);
  return core_a >= 0 && core_a == core_b && pkg_a == pkg_b;
}

/** Picks two CPUs this process may run on, on different cores when possible. */
Cpus ChooseCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  Cpus cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  if (allowed.size() < 2) return cpus;
  cpus.a = allowed[0];
  cpus.b = allowed[1];
  for (size_t i = 1; i < allowed.size(); ++i) {
    if (!SameCore(cpus.a, allowed[i])) {
      cpus.b = allowed[i];
      break;
    }
  }
  return cpus;
}

/** Pins the calling thread to `cpu` (no-op for -1). */
void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

/** Nanoseconds on the monotonic clock. */
u64 Now() { return chi::MonotonicNs(); }

/** An anonymous MAP_SHARED mapping, shared with forked children. */
void *MapShared(size_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return p;
}

/** Median, min and max of one measurement repeated kReps times. */
struct Sample {
  double median, min, max;
};

template <typename Fn>
Sample Repeat(Fn fn) {
  std::vector<double> v;
  for (int r = 0; r < kReps; ++r) v.push_back(fn());
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

/** Runs `child` in a forked process pinned to CPU b; the parent is pinned to CPU a. */
template <typename Fn>
pid_t ForkPeer(Fn child) {
  pid_t pid = fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    PinTo(g_cpus.b);
    child();
    _exit(0);
  }
  return pid;
}

void WaitPeer(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::abort();
}

// ---- Floors ----

/** Two threads, one atomic word, both spinning: ns per round trip. */
double AtomicPingPongThreads() {
  alignas(chi::kCacheLine) chi::Atomic<u64> flag(0);
  std::thread peer([&] {
    PinTo(g_cpus.b);
    for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
      while (flag.Load(chi::MemOrder::kAcquire) != 2 * i + 1) chi::CpuRelax();
      flag.Store(2 * i + 2, chi::MemOrder::kRelease);
    }
  });
  u64 start = 0;
  for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
    if (i == kWarmup) start = Now();
    flag.Store(2 * i + 1, chi::MemOrder::kRelease);
    while (flag.Load(chi::MemOrder::kAcquire) != 2 * i + 2) chi::CpuRelax();
  }
  double ns = static_cast<double>(Now() - start) / kRoundTrips;
  peer.join();
  return ns;
}

/** The echo side of a two-flag ping-pong: waits for ping == i, answers pong = i. */
void EchoFlags(chi::Atomic<u64> *ping, chi::Atomic<u64> *pong) {
  for (u64 i = 1; i <= kWarmup + kRoundTrips; ++i) {
    while (ping->Load(chi::MemOrder::kAcquire) != i) chi::CpuRelax();
    pong->Store(i, chi::MemOrder::kRelease);
  }
}

/** The timing side of a two-flag ping-pong: ns per round trip. */
double PingFlags(chi::Atomic<u64> *ping, chi::Atomic<u64> *pong) {
  u64 start = 0;
  for (u64 i = 1; i <= kWarmup + kRoundTrips; ++i) {
    if (i == kWarmup + 1) start = Now();
    ping->Store(i, chi::MemOrder::kRelease);
    while (pong->Load(chi::MemOrder::kAcquire) != i) chi::CpuRelax();
  }
  return static_cast<double>(Now() - start) / kRoundTrips;
}

/** Two processes, ping and pong flags on two cache lines of shm, spinning. */
double ShmPingPongProcesses() {
  auto *flags = static_cast<chi::Atomic<u64> *>(MapShared(2 * chi::kCacheLine));
  chi::Atomic<u64> *ping = &flags[0];
  chi::Atomic<u64> *pong = &flags[chi::kCacheLine / sizeof(chi::Atomic<u64>)];
  pid_t pid = ForkPeer([ping, pong] { EchoFlags(ping, pong); });
  double ns = PingFlags(ping, pong);
  WaitPeer(pid);
  munmap(flags, 2 * chi::kCacheLine);
  return ns;
}

/** The same two-line protocol between two threads (separates "two lines" from "processes"). */
double TwoFlagPingPongThreads() {
  auto *flags = static_cast<chi::Atomic<u64> *>(MapShared(2 * chi::kCacheLine));
  chi::Atomic<u64> *ping = &flags[0];
  chi::Atomic<u64> *pong = &flags[chi::kCacheLine / sizeof(chi::Atomic<u64>)];
  std::thread peer([ping, pong] {
    PinTo(g_cpus.b);
    EchoFlags(ping, pong);
  });
  double ns = PingFlags(ping, pong);
  peer.join();
  munmap(flags, 2 * chi::kCacheLine);
  return ns;
}

/** A bare Lamport SPSC ring (no blocking, no wake-ups): the throughput floor. */
struct BareRing {
  alignas(chi::kCacheLine) std::atomic<u64> tail{0};
  u64 head_cache = 0;
  alignas(chi::kCacheLine) std::atomic<u64> head{0};
  u64 tail_cache = 0;
  alignas(chi::kCacheLine) u64 slots[kRingCapacity];
};

/** Items per second through BareRing between two pinned threads. */
double BareRingThroughput() {
  auto *ring = new BareRing();
  std::atomic<int> ready{0};
  std::thread producer([ring, &ready] {
    PinTo(g_cpus.b);
    ready.fetch_add(1);
    while (ready.load() < 2) chi::CpuRelax();
    for (u64 t = 0; t < kItems; ++t) {
      while (t - ring->head_cache >= kRingCapacity) {
        ring->head_cache = ring->head.load(std::memory_order_acquire);
        chi::CpuRelax();
      }
      ring->slots[t % kRingCapacity] = t;
      ring->tail.store(t + 1, std::memory_order_release);
    }
  });
  ready.fetch_add(1);
  while (ready.load() < 2) chi::CpuRelax();
  u64 start = Now();
  u64 sum = 0;
  for (u64 h = 0; h < kItems; ++h) {
    while (h == ring->tail_cache) {
      ring->tail_cache = ring->tail.load(std::memory_order_acquire);
      if (h == ring->tail_cache) chi::CpuRelax();
    }
    sum += ring->slots[h % kRingCapacity];
    ring->head.store(h + 1, std::memory_order_release);
  }
  double secs = static_cast<double>(Now() - start) / 1e9;
  producer.join();
  delete ring;
  if (sum != kItems * (kItems - 1) / 2) std::abort();
  return static_cast<double>(kItems) / secs;
}

// ---- Our rings ----

/** Ping ring + pong ring between two threads: ns per round trip. */
template <typename Ring>
double RingRoundTripThreads() {
  size_t bytes = Ring::BytesFor(kRingCapacity);
  char *mem = static_cast<char *>(MapShared(2 * bytes));
  Ring *ping = Ring::Create(mem, kRingCapacity);
  Ring *pong = Ring::Create(mem + bytes, kRingCapacity);
  // By value: the peer must not read pointers off this thread's stack, whose line also
  // holds `v`, written every round trip (false sharing would inflate our figure).
  std::thread peer([ping, pong] {
    PinTo(g_cpus.b);
    u64 v = 0;
    for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
      ping->Pop(v, 0);
      pong->Push(v);
    }
  });
  u64 start = 0, v = 0;
  for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
    if (i == kWarmup) start = Now();
    ping->Push(i);
    pong->Pop(v, 0);
    if (v != i) std::abort();
  }
  double ns = static_cast<double>(Now() - start) / kRoundTrips;
  peer.join();
  munmap(mem, 2 * bytes);
  return ns;
}

/** Ping ring + pong ring between two processes: ns per round trip. */
template <typename Ring>
double RingRoundTripProcesses() {
  size_t bytes = Ring::BytesFor(kRingCapacity);
  char *mem = static_cast<char *>(MapShared(2 * bytes));
  Ring *ping = Ring::Create(mem, kRingCapacity);
  Ring *pong = Ring::Create(mem + bytes, kRingCapacity);
  pid_t pid = ForkPeer([&] {
    u64 v = 0;
    for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
      ping->Pop(v, 0);
      pong->Push(v);
    }
  });
  u64 start = 0, v = 0;
  for (u64 i = 0; i < kWarmup + kRoundTrips; ++i) {
    if (i == kWarmup) start = Now();
    ping->Push(i);
    pong->Pop(v, 0);
    if (v != i) std::abort();
  }
  double ns = static_cast<double>(Now() - start) / kRoundTrips;
  WaitPeer(pid);
  munmap(mem, 2 * bytes);
  return ns;
}

/** Items per second from `producers` threads (pinned to CPU b) to a consumer on CPU a. */
template <typename Ring>
double RingThroughput(u32 producers) {
  size_t bytes = Ring::BytesFor(kRingCapacity);
  char *mem = static_cast<char *>(MapShared(bytes));
  Ring *ring = Ring::Create(mem, kRingCapacity);
  std::atomic<u32> ready{0};
  std::vector<std::thread> threads;
  u64 each = kItems / producers;
  for (u32 p = 0; p < producers; ++p) {
    // ring and each by value: no reads off the consumer's stack lines.
    threads.emplace_back([ring, each, producers, &ready, p] {
      PinTo(g_cpus.b);
      ready.fetch_add(1);
      while (ready.load() <= producers) chi::CpuRelax();
      for (u64 i = 0; i < each; ++i) ring->Push((u64{p} << 32) | i);
    });
  }
  ready.fetch_add(1);
  while (ready.load() <= producers) chi::CpuRelax();
  u64 start = Now();
  u64 v = 0;
  for (u64 i = 0; i < each * producers; ++i) ring->Pop(v, 0);
  double secs = static_cast<double>(Now() - start) / 1e9;
  for (auto &t : threads) t.join();
  munmap(mem, bytes);
  return static_cast<double>(each * producers) / secs;
}

// ---- Report ----

/** One of our round trips next to its floor (and, for threads, the two-line floor too). */
void PrintLatency(const char *what, const Sample &ours, const Sample &floor,
                  const Sample *two_line = nullptr) {
  std::printf("  %-34s %8.1f ns (%6.1f-%6.1f)   floor %7.1f ns   ours/floor %.2fx", what,
              ours.median, ours.min, ours.max, floor.median, ours.median / floor.median);
  if (two_line != nullptr) {
    std::printf("   (vs two-flag threads %.2fx)", ours.median / two_line->median);
  }
  std::printf("\n");
}

void PrintFloor(const char *what, const Sample &floor) {
  std::printf("  %-34s %8.1f ns (%6.1f-%6.1f)\n", what, floor.median, floor.min, floor.max);
}

void PrintThroughput(const char *what, const Sample &ours, const Sample &floor) {
  std::printf("  %-34s %7.2f M/s (%5.2f-%5.2f)   floor %6.2f M/s   ours/floor %.2fx\n", what,
              ours.median / 1e6, ours.min / 1e6, ours.max / 1e6, floor.median / 1e6,
              ours.median / floor.median);
}

}  // namespace

int main() {
  g_cpus = ChooseCpus();
  PinTo(g_cpus.a);
  std::printf("bench_queues: median of %d runs (min-max in brackets); %llu round trips or "
              "%llu items per run; ring capacity %u\n",
              kReps, static_cast<unsigned long long>(kRoundTrips),
              static_cast<unsigned long long>(kItems), kRingCapacity);
  if (g_cpus.a >= 0) {
    std::printf("sides pinned with sched_setaffinity: CPU %d (main/consumer) and CPU %d "
                "(peer/producers)%s; %ld CPUs online\n",
                g_cpus.a, g_cpus.b,
                SameCore(g_cpus.a, g_cpus.b) ? ", SMT siblings" : ", different cores",
                sysconf(_SC_NPROCESSORS_ONLN));
  } else {
    std::printf("fewer than 2 CPUs available: threads are not pinned\n");
  }
  std::printf("every spin loop (floors included) uses chi::CpuRelax\n\n");

  std::printf("round trip (lower is better). (a) moves one cache line back and forth; a ping\n"
              "ring + pong ring must move two, like (b) and the two-flag thread line below.\n");
  Sample floor_threads = Repeat(AtomicPingPongThreads);
  Sample floor_procs = Repeat(ShmPingPongProcesses);
  Sample two_flag_threads = Repeat(TwoFlagPingPongThreads);
  PrintFloor("(a) floor: atomic ping-pong, threads", floor_threads);
  PrintFloor("(b) floor: shm ping-pong, processes", floor_procs);
  PrintFloor("    two-flag ping-pong, threads", two_flag_threads);
  PrintLatency("(c) SpscRing, threads", Repeat(RingRoundTripThreads<chi::SpscRing<u64>>),
               floor_threads, &two_flag_threads);
  PrintLatency("(c) SpscRing, processes", Repeat(RingRoundTripProcesses<chi::SpscRing<u64>>),
               floor_procs);
  PrintLatency("(d) MpscRing, threads", Repeat(RingRoundTripThreads<chi::MpscRing<u64>>),
               floor_threads, &two_flag_threads);
  PrintLatency("(d) MpscRing, processes", Repeat(RingRoundTripProcesses<chi::MpscRing<u64>>),
               floor_procs);
  std::printf("\nthroughput, threads (higher is better; floor: bare Lamport SPSC ring)\n");
  Sample floor_tput = Repeat(BareRingThroughput);
  std::printf("  %-34s %7.2f M/s (%5.2f-%5.2f)\n", "(e) floor: bare Lamport ring",
              floor_tput.median / 1e6, floor_tput.min / 1e6, floor_tput.max / 1e6);
  PrintThroughput("(e) SpscRing, 1 producer", Repeat([] {
                    return RingThroughput<chi::SpscRing<u64>>(1);
                  }),
                  floor_tput);
  PrintThroughput("(e) MpscRing, 1 producer", Repeat([] {
                    return RingThroughput<chi::MpscRing<u64>>(1);
                  }),
                  floor_tput);
  PrintThroughput("(e) MpscRing, 2 producers", Repeat([] {
                    return RingThroughput<chi::MpscRing<u64>>(2);
                  }),
                  floor_tput);
  return 0;
}
