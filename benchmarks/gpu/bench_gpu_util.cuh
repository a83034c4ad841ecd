// Shared pieces of bench_gpu: the pinned words and bounded waits of the floor kernels, the
// host's error exits and stream waits, and the Bench state every measurement reads.
// Every device-side spin is bounded by a time limit and a pinned abort flag.
#pragma once

#include <cstdio>   // the report
#include <cstdlib>  // _Exit
#include <string>   // messages
#include <vector>   // batch results

#include "../bench_util.h"
#include "chi/core/atomic.h"       // Atomic, MemScope
#include "chi/core/ids.h"          // PoolId
#include "chi/gpu/device_util.h"   // ClockNs
#include "chi/gpu/gpu_api.h"       // WaitStream

namespace bench_gpu {

using chi::u32;
using chi::u8;
using chi::u64;
using Sys = chi::Atomic<u32, chi::MemScope::kSystem>;
using Dev = chi::Atomic<u32, chi::MemScope::kDevice>;

const chi::PoolId kPool(430, 0);
constexpr u64 kSpinLimitNs = 20000000000ull;  ///< no device spin outlives this
constexpr u64 kHostTimeoutNs = 30000000000ull;

/** Pinned words shared by the floor kernels and the host. */
struct alignas(64) Flags {
  Sys ping;
  u32 pad0[15];
  Sys pong;
  u32 pad1[15];
  Sys abort;
};

/** Pinned progress report of a task kernel: tasks done and the device clock at the last. */
struct alignas(64) Progress {
  Sys done;
  chi::Atomic<u64, chi::MemScope::kSystem> clock_ns;
};

/** Spins until *w == v (acquire); false when the limit or the abort flag stops it. */
template <typename W>
__device__ bool DeviceWaitFor(W *w, u32 v, const Sys *abort) {
  const u64 t0 = chi::gpu::ClockNs();
  for (u32 n = 0;; ++n) {
    if (w->Load(chi::MemOrder::kAcquire) == v) return true;
    if ((n & 1023) == 1023 &&
        (abort->Load(chi::MemOrder::kRelaxed) != 0 || chi::gpu::ClockNs() - t0 > kSpinLimitNs)) {
      return false;
    }
  }
}

/** Host side of a wait on a pinned word, bounded. */
bool HostWaitFor(Sys *w, u32 v) {
  const double t0 = chi_bench::NowNs();
  while (w->Load(chi::MemOrder::kAcquire) != v) {
    if (chi_bench::NowNs() - t0 > 1e10) return false;
  }
  return true;
}

// ---- Host helpers ----------------------------------------------------------------------

/** Reports and leaves at once: no clean-up that could wait on a kernel that never ends. */
void Die(const char *what) {
  std::printf("bench_gpu: %s\n", what);
  std::fflush(stdout);
  std::_Exit(1);
}
void Ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) Die((std::string(what) + ": " + cudaGetErrorString(e)).c_str());
}
void Wait(cudaStream_t s, const char *what) {
  chi::Status st = chi::gpu::WaitStream(s, kHostTimeoutNs);
  if (!st.ok()) Die((std::string(what) + ": " + st.ToString()).c_str());
  Ok(cudaGetLastError(), what);
}
/** Wait, printing a task kernel's progress every second (diagnoses a slow or stuck route). */
void WaitReporting(cudaStream_t s, const char *what, const Progress *p) {
  for (u64 waited = 0; waited < kHostTimeoutNs; waited += 1000000000ull) {
    chi::Status st = chi::gpu::WaitStream(s, 1000000000ull);
    if (st.ok()) return Ok(cudaGetLastError(), what);
    if (st.code() != chi::ErrorCode::kTimeout) Die(st.ToString().c_str());
    std::printf("  %s: %u tasks done, device clock %llu ns\n", what,
                p->done.Load(chi::MemOrder::kRelaxed),
                static_cast<unsigned long long>(p->clock_ns.Load(chi::MemOrder::kRelaxed)));
  }
  Die((std::string(what) + ": no end after the time limit").c_str());
}
std::vector<double> CopyBack(const double *dev, u32 n, cudaStream_t s) {
  std::vector<double> v(n);
  Ok(cudaMemcpyAsync(v.data(), dev, n * sizeof(double), cudaMemcpyDeviceToHost, s), "copy back");
  Ok(cudaStreamSynchronize(s), "copy back");
  return v;
}

struct Bench {
  cudaStream_t a = nullptr, b = nullptr;
  Flags *flags = nullptr;              // pinned
  Dev *words = nullptr;                // device: two ping-pong words
  Dev *req = nullptr, *ans = nullptr;  // device: raw mailboxes
  double *out = nullptr;               // device: batch averages
  Progress *progress = nullptr;        // pinned
  u32 *wrong = nullptr;                // device
  u32 sms = 0, threads = 256;
  u32 blocks = 0;  ///< orchestrator blocks; the rate test uses as many client blocks
  bool quick = false;
  bool probe = false;  ///< every owner-probe combination (else two)
};

}  // namespace bench_gpu
