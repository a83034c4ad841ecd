// Shared helpers for the benchmark programs: timing, medians, CPU pinning and
// a uniform "ours vs floor" report line.
#pragma once

#include <sched.h>  // sched_setaffinity

#include <algorithm>  // sort
#include <chrono>     // steady_clock
#include <cstdio>     // printf
#include <thread>     // hardware_concurrency
#include <vector>     // samples

namespace chi_bench {

/** Nanoseconds since an arbitrary start (steady clock). */
inline double NowNs() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/** Median of a sample set (copies: callers keep their order). */
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

/** The q-quantile (0..1) of a sample set, nearest rank (copies, as Median). */
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[rank < v.size() ? rank : v.size() - 1];
}

/** Pins the calling thread to `cpu` when the machine has it; returns whether it did. */
inline bool PinTo(unsigned cpu) {
  if (std::thread::hardware_concurrency() <= cpu) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

/** Lets the calling thread run on every CPU again (threads it creates inherit this). */
inline void Unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c = 0; c < std::thread::hardware_concurrency() && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

/** Runs `reps` repetitions of fn() (each returning a figure) and returns the median. */
template <typename Fn>
double MedianOf(int reps, Fn fn) {
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) v.push_back(fn());
  return Median(v);
}

/** Prints "label  ours  floor  ratio" for latency-like figures (lower is better). */
inline void ReportLatency(const char *label, double ours_ns, const char *floor_label,
                          double floor_ns) {
  std::printf("%-44s %10.1f ns   floor %-34s %10.1f ns   ratio %6.2fx\n", label, ours_ns,
              floor_label, floor_ns, floor_ns > 0 ? ours_ns / floor_ns : 0.0);
}

/** Prints a throughput figure (higher is better) with an optional floor. */
inline void ReportRate(const char *label, double per_sec, const char *floor_label = nullptr,
                       double floor_per_sec = 0) {
  if (floor_label == nullptr) {
    std::printf("%-44s %10.3f M/s\n", label, per_sec / 1e6);
  } else {
    std::printf("%-44s %10.3f M/s   floor %-34s %10.3f M/s   ratio %6.2fx\n", label,
                per_sec / 1e6, floor_label, floor_per_sec / 1e6,
                floor_per_sec > 0 ? per_sec / floor_per_sec : 0.0);
  }
}

}  // namespace chi_bench
