// Device-side compile check: every CHI_CROSS_FUN API that GPU kernels use, called from
// __global__ functions so nvcc (sm_90) and hipcc (gfx90a) must generate device code for
// it. Never launched; tests/packaging.cmake only compiles it, and any error fails the test.
#include <chi/chi.h>  // the whole public API, as a GPU application includes it

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // threadIdx, blockIdx under hipcc
#endif

namespace chi_device_check {

using chi::u32;
using chi::u64;

/** Routing values built and inspected on the device, as a kernel submitting a task does. */
__global__ void PoolQueryKernel(u32 *out) {
  const u32 lane = threadIdx.x;
  chi::PoolQuery q = chi::PoolQuery::DirectId(lane);
  if (q.GetMode() == chi::RoutingMode::kDirectId && q.IsValid()) out[lane] = q.GetId();
  chi::PoolQuery r = chi::PoolQuery::Range(lane, 4);
  out[lane] += r.GetRangeOffset() + r.GetRangeCount();
  if (chi::PoolQuery::ToLocalCpu() != chi::PoolQuery::ToLocalGpu(lane)) out[lane] += 1;
  if (chi::PoolQuery::DirectHash(u64{lane} << 33).GetHash() == 0) out[lane] = 0;
  chi::PoolId id(200, lane);
  if (!id.IsNull() && id != chi::PoolId::GetNull()) out[lane] += id.minor_;
  chi::BitField<u32> flags;
  flags.SetBits(1u << (lane % 32));
  if (flags.Any(1u)) out[lane] |= flags.Bits();
}

/** Device- and system-scoped atomics with every operation, plus the spin hint. */
__global__ void AtomicKernel(chi::Atomic<u32, chi::MemScope::kDevice> *device_counter,
                             chi::Atomic<u64, chi::MemScope::kSystem> *system_flag) {
  device_counter->FetchAdd(1, chi::MemOrder::kRelaxed);
  device_counter->FetchSub(1, chi::MemOrder::kAcqRel);
  device_counter->FetchOr(2u, chi::MemOrder::kRelease);
  device_counter->FetchAnd(~1u, chi::MemOrder::kAcquire);
  u32 expected = device_counter->Load(chi::MemOrder::kAcquire);
  device_counter->CompareExchange(expected, expected + 1);
  device_counter->Exchange(7u);
  for (int spins = 0; spins < 8 && system_flag->Load(chi::MemOrder::kAcquire) == 0; ++spins) {
    chi::CpuRelax();
  }
  system_flag->Store(1, chi::MemOrder::kRelease);
}

}  // namespace chi_device_check
