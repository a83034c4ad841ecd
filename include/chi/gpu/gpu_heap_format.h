// FormatGpuHeap: makes a region of device memory a CHI_GPU_HEAP (gpu_heap.h) from the host,
// for the runtime's client heap on each GPU (GpuManager) or a heap of the application's own.
#pragma once

#include <vector>  // the header image built on the host

#include "chi/core/status.h"   // Status
#include "chi/core/types.h"    // u32, u64
#include "chi/gpu/gpu_api.h"   // the CUDA/HIP layer: streams, copies
#include "chi/gpu/gpu_heap.h"  // GpuHeapRegion: the header layout

namespace chi::gpu {

/**
 * Formats `bytes` of device memory at `region` (64-byte aligned, e.g. from cudaMalloc) as a
 * CHI_GPU_HEAP region of `partitions` partitions (0: one per kGpuHeapPartitionBytes), for
 * the runtime's heap or a GpuInfo::heap_ of the application's own. Copies a header image
 * built on the host through `stream` (nullptr: a stream of its own) and waits for that stream
 * only. Call it once, before any kernel gets the region: it forgets every live block.
 */
inline Status FormatGpuHeap(void *region, u64 bytes, u32 partitions = 0,
                            Stream stream = nullptr) {
  const u32 n = GpuHeapRegion::PartitionsFor(bytes, partitions);
  if (region == nullptr || reinterpret_cast<u64>(region) % 64 != 0 || n == 0) {
    return Status::Error(ErrorCode::kInvalidArgument,
                         "a GPU heap needs a 64-byte aligned region of at least a few KiB");
  }
  struct alignas(64) Line {
    char bytes[64];
  };
  std::vector<Line> image(GpuHeapRegion::HeaderBytes(n) / sizeof(Line));  // zeroed
  GpuHeapRegion::Format(image.data(), bytes, partitions);  // writes only the header bytes
  Stream own = nullptr;
  if (stream == nullptr) {
    if (Status st = Check(StreamCreate(&own), "create a stream"); !st.ok()) return st;
    stream = own;
  }
  Status st = Check(MemcpyAsync(region, image.data(), GpuHeapRegion::HeaderBytes(n), stream),
                    "format the GPU heap");
  if (st.ok()) st = Check(StreamSynchronize(stream), "format the GPU heap");
  if (own != nullptr) static_cast<void>(StreamDestroy(own));
  return st;
}

}  // namespace chi::gpu
