// The GPU part of the ClientConnect handshake (ConnectAnswer::gpu_info, an opaque versioned
// blob): per GPU, the runtime's pinned queue segment (name, size, version) and where the
// cpu2gpu queue's arrays sit inside it. The runtime describes; a pure client built with
// CUDA/HIP attaches the segment and rebases the queue onto its own mapping (gpu_client_queues.h).
// Invariant: only offsets cross processes, never pointers; every size is checked against
// this build's maxima and every offset against the segment's size before the client
// touches the memory.
#pragma once

#include <string>  // segment names
#include <vector>  // the blob, per-GPU entries

#include "chi/core/status.h"         // Status, ErrorCode
#include "chi/core/types.h"          // u32, u64
#include "chi/gpu/mailbox.h"         // GpuQueue
#include "chi/serialize/archive.h"   // the blob's encoding

namespace chi::gpu {

/** Bumped whenever GpuConnectInfo or GpuQueueAttachInfo changes. */
inline constexpr u32 kGpuConnectInfoVersion = 6;  // 6: the compact routing header

/** One GPU's cpu2gpu queue as a client process must see it. */
struct GpuQueueAttachInfo {
  u32 gpu_id = 0;
  std::string segment;     ///< PosixShmBackend name of the pinned segment
  u64 segment_size = 0;    ///< whole mapping, bytes
  u32 segment_version = 0; ///< kBackendVersion of the runtime's build
  u32 cpu2gpu_slots = 0;
  u32 gpu2cpu_slots = 0;   ///< for information: clients never serve gpu2cpu
  u32 gpu2gpu_slots = 0;   ///< for information: gpu2gpu is device memory of the runtime
  u32 payload_bytes = 0;   ///< copy space per cpu2gpu slot
  u64 max_wait_ns = 0;
  // Byte offsets from the segment's Data(); the arrays inside each region follow from the
  // slot count and payload size (GpuQueue::Make's layout).
  u64 shared_off = 0;  ///< request and answer words, payloads, doorbell (SharedBytes)
  u64 claims_off = 0;  ///< the claim words (ClientBytes, host clients: no records)

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(gpu_id, segment, segment_size, segment_version, cpu2gpu_slots, gpu2cpu_slots,
       gpu2gpu_slots, payload_bytes, max_wait_ns, shared_off, claims_off);
  }
};

/**
 * The most slots a described queue may have: what GpuQueueSet::Geometry can make. With
 * payloads of at most kGpuPayloadBytes every region size of such a queue fits in 41 bits,
 * so no size computed from a description can wrap.
 */
inline constexpr u32 kMaxGpuQueueSlots = 1u << 30;

/**
 * Checks one GPU's description against what this build can hold: slot counts within
 * kMaxGpuQueueSlots, a payload of 16..kGpuPayloadBytes bytes in 16-byte steps (the client
 * copies answers into kGpuPayloadBytes buffers). kMalformed names the field.
 */
inline Status CheckGpuQueueAttachInfo(const GpuQueueAttachInfo &i) {
  const u32 counts[3] = {i.cpu2gpu_slots, i.gpu2cpu_slots, i.gpu2gpu_slots};
  for (u32 n : counts) {
    if (n > kMaxGpuQueueSlots) {
      return Status::Errorf(ErrorCode::kMalformed,
                            "GPU %u queue description has %u slots (at most %u)", i.gpu_id, n,
                            kMaxGpuQueueSlots);
    }
  }
  if (i.cpu2gpu_slots == 0) {
    return Status::Errorf(ErrorCode::kMalformed, "GPU %u queue description has no slots",
                          i.gpu_id);
  }
  if (i.payload_bytes == 0 || i.payload_bytes % 16 != 0 || i.payload_bytes > kGpuPayloadBytes) {
    return Status::Errorf(ErrorCode::kMalformed,
                          "GPU %u queue description has %u-byte payloads (16..%u, in steps of 16)",
                          i.gpu_id, i.payload_bytes, kGpuPayloadBytes);
  }
  return Status::Ok();
}

/** The whole blob: every GPU a client may submit to directly. */
struct GpuConnectInfo {
  u32 version = kGpuConnectInfoVersion;
  u32 runtime_pid = 0;
  std::vector<GpuQueueAttachInfo> gpus;

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(version, runtime_pid, gpus);
  }
};

/** Encodes the blob for ConnectAnswer::gpu_info (empty when there is no GPU to offer). */
inline std::vector<char> EncodeGpuConnectInfo(const GpuConnectInfo &info) {
  std::vector<char> out;
  if (info.gpus.empty()) return out;
  OutputArchive ar(out);
  ar(info);
  return out;
}

/** Decodes the blob; empty means "no GPU queues offered" (ok, no entries). */
inline Status DecodeGpuConnectInfo(const std::vector<char> &blob, GpuConnectInfo *out) {
  *out = GpuConnectInfo();
  if (blob.empty()) return Status::Ok();
  u32 version = 0;
  InputArchive peek(blob.data(), blob.size());
  peek(version);
  if (!peek.ok() || version != kGpuConnectInfoVersion) {
    return Status::Errorf(ErrorCode::kVersionMismatch,
                          "the runtime describes its GPU queues in version %u; this client "
                          "understands %u (rebuild the client against the runtime's chi)",
                          version, kGpuConnectInfoVersion);
  }
  InputArchive ar(blob.data(), blob.size());
  ar(*out);
  if (!ar.ok()) return Status::Error(ErrorCode::kMalformed, "malformed GPU queue description");
  for (const GpuQueueAttachInfo &i : out->gpus) {
    if (Status st = CheckGpuQueueAttachInfo(i); !st.ok()) {
      *out = GpuConnectInfo();
      return st;
    }
  }
  return Status::Ok();
}

/** Describes cpu2gpu queue `q`, carved in the segment whose Data() is `data`. */
inline GpuQueueAttachInfo DescribeCpu2Gpu(u32 gpu_id, const GpuQueue<MemScope::kSystem> &q,
                                          const char *data) {
  GpuQueueAttachInfo i;
  i.gpu_id = gpu_id;
  i.cpu2gpu_slots = q.num_slots_;
  i.payload_bytes = q.payload_bytes_;
  i.max_wait_ns = q.max_wait_ns_;
  auto off = [data](const void *p) { return static_cast<u64>(static_cast<const char *>(p) - data); };
  i.shared_off = off(q.request_);  // Make puts the request words first in the shared region
  i.claims_off = off(q.claims_);
  return i;
}

/**
 * The client's cpu2gpu descriptor over its own mapping (`data` = its Data(), `data_bytes`
 * long). Server-side arrays (served_) and the abort word are not in the segment and stay
 * null: a host client never reads them. kMalformed when a region would leave the segment.
 */
inline Status RebaseCpu2Gpu(const GpuQueueAttachInfo &i, char *data, u64 data_bytes,
                            GpuQueue<MemScope::kSystem> *out) {
  using Queue = GpuQueue<MemScope::kSystem>;
  const u32 n = i.cpu2gpu_slots;
  if (Status st = CheckGpuQueueAttachInfo(i); !st.ok()) return st;
  struct Span {
    u64 off;
    u64 bytes;
  };
  const Span spans[2] = {{i.shared_off, Queue::SharedBytes(n, i.payload_bytes)},
                         {i.claims_off, Queue::ClientBytes(n, false)}};
  for (const Span &s : spans) {
    if (s.off % 8 != 0 || s.off > data_bytes || s.bytes > data_bytes - s.off) {
      return Status::Errorf(ErrorCode::kMalformed,
                            "GPU %u queue region at offset %llu (+%llu) leaves its %llu-byte "
                            "segment",
                            i.gpu_id, static_cast<unsigned long long>(s.off),
                            static_cast<unsigned long long>(s.bytes),
                            static_cast<unsigned long long>(data_bytes));
    }
  }
  *out = Queue::Make(n, i.payload_bytes, i.max_wait_ns, data + i.shared_off, data + i.claims_off,
                     false, nullptr, nullptr);
  return Status::Ok();
}

}  // namespace chi::gpu
