// Device-side compile check: every CHI_CROSS_FUN API that GPU kernels use, called from
// __global__ functions so nvcc (sm_90) and hipcc (gfx90a) must generate device code for
// it. Never launched; tests/packaging.cmake only compiles it, and any error fails the test.
// <chi/chi.h> comes first and alone: the headers must be self-sufficient under both
// compilers (threadIdx and __syncthreads come through it, as nvcc and hip_runtime.h give).
#include <chi/chi.h>  // the whole public API, as a GPU application includes it

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

/** Offset pointers built, compared and cast on the device (mailboxes carry them). */
__global__ void ShmPtrKernel(u32 *data, u64 *out) {
  const chi::AllocatorId alloc(2, 1);
  chi::ShmPtr<u32> p(alloc, 64u * threadIdx.x);
  chi::ShmPtr<char> bytes = p.Cast<char>();
  if (!p.IsNull() && bytes.off_ == p.off_ && p != chi::ShmPtr<u32>::GetNull()) {
    out[threadIdx.x] = alloc.ToU64() + bytes.off_;
  }
  if (p.alloc_id_ == alloc) data[threadIdx.x] += static_cast<u32>(p.off_);
}

/** A device thread on each end of a single-producer single-consumer ring. */
__global__ void SpscRingKernel(void *region, u64 *out) {
  if (threadIdx.x == 0) chi::SpscRing<u64>::Create(region, 64);
  __syncthreads();
  chi::SpscRing<u64> *ring = chi::SpscRing<u64>::Attach(region);
  if (threadIdx.x == 0) {
    ring->TryPush(u64{41});
  } else if (threadIdx.x == 1) {
    u64 v = 0;
    if (ring->TryPop(v)) out[0] = v + ring->Size() + ring->Capacity();
    out[1] = ring->Empty() ? ring->ProducerStalls() : ring->ConsumerParks();
  }
}

/** Many device producers and one device consumer on a multi-producer ring. */
__global__ void MpscRingKernel(void *region, u64 *out) {
  if (threadIdx.x == 0) chi::MpscRing<u64>::Create(region, 256);
  __syncthreads();
  chi::MpscRing<u64> *ring = chi::MpscRing<u64>::Attach(region);
  ring->TryPush(u64{threadIdx.x});
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 v = 0, sum = 0;
    while (ring->TryPop(v)) sum += v;
    out[0] = sum + ring->Capacity() + (ring->Empty() ? 0 : ring->Size());
  }
}

/** A kernel submitting task entries into the runtime's lanes x priorities queue. */
__global__ void TaskQueueKernel(void *region, u64 *out) {
  if (threadIdx.x == 0) chi::TaskQueue::Create(region, 4, 64);
  __syncthreads();
  chi::TaskQueue *queue = chi::TaskQueue::Attach(region);
  const u32 lane_id = threadIdx.x % queue->NumLanes();
  chi::TaskLane &lane = queue->GetLane(lane_id, chi::QueuePriority::kLowLatency);
  lane.TryPush(u64{threadIdx.x} + 1);
  __syncthreads();
  if (threadIdx.x < queue->NumLanes()) {
    u64 entry = 0;
    if (lane.TryPop(entry)) out[threadIdx.x] = entry + lane.LaneId() + lane.GetTag();
  }
}

/** Serialization on the device: one value of each kind out and back, and a batch. */
__global__ void ArchiveKernel(char *buf, u64 capacity, u64 *out) {
  chi::PoolQuery query = chi::PoolQuery::DirectHash(threadIdx.x);
  chi::PoolId pool(300, 1);
  chi::ShmPtr<char> data(chi::AllocatorId(1, 2), 4096);
  u32 value = 7;
  chi::OutputArchive oar(buf, capacity);
  oar(query, pool, data, value);
  if (!oar.ok()) return;

  chi::PoolQuery query2;
  chi::PoolId pool2;
  chi::ShmPtr<char> data2;
  u32 value2 = 0;
  chi::InputArchive iar(buf, oar.Size());
  iar(query2, pool2, data2, value2);
  if (iar.ok() && query2 == query && pool2 == pool && data2 == data) out[0] = value2;

  chi::BatchWriter writer(buf, capacity);
  writer.BeginRecord()(value, pool);
  writer.EndRecord();
  chi::BatchReader reader;
  if (reader.Open(writer.Data(), writer.Size()).ok()) {
    chi::InputArchive record;
    while (reader.Next(record)) record(value2, pool2);
    out[1] = reader.Count() + value2;
  }
}

/** A task in GPU-visible memory: its routing header and answer, as the orchestrator sees it. */
__global__ void TaskKernel(chi::Task *task, char *buf, u64 capacity) {
  if (task->IsComplete()) return;
  chi::OutputArchive oar(buf, capacity);
  task->SerializeBaseIn(oar);
  chi::InputArchive iar(buf, oar.Size());
  task->SerializeBaseOut(iar);
  if (task->GetReturnCode() == 0) task->SetError(chi::ErrorCode::kTimeout, "device timeout");
  chi::FixedString<16> name;
  name.Assign(task->GetMessage(), 8);
}

}  // namespace chi_device_check
