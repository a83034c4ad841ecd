// libFuzzer harness for the GPU part of the ClientConnect answer: DecodeGpuConnectInfo on
// the blob, then RebaseCpu2Gpu of every GPU it names onto a segment of a size the fuzzer
// picks. Segments up to 1 MiB are heap buffers of exactly that size (ASan sees a touch
// outside them); larger ones end at an inaccessible guard page of a reserved mapping.
// Input: the segment's size (u64, taken modulo kMaxSegmentBytes + 1), then the blob.
#include <sys/mman.h>  // the reserved mapping for large segments

#include <cstdint>  // uint8_t, uintptr_t
#include <cstdio>   // fprintf of a region that leaves its segment
#include <memory>   // the heap segment
#include <vector>   // the blob

#include "chi/gpu/gpu_connect_info.h"  // DecodeGpuConnectInfo, RebaseCpu2Gpu, GpuQueue
#include "fuzz_check.h"                // FuzzCheck, FuzzBytes

using chi::u32;
using chi::u64;
using chi::fuzz::FuzzBytes;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;
using chi::gpu::GpuConnectInfo;
using chi::gpu::GpuQueueAttachInfo;
using Queue = chi::gpu::GpuQueue<chi::MemScope::kSystem>;

namespace {

/** Segments up to this size are heap buffers of their exact size. */
constexpr u64 kMaxHeapSegmentBytes = 1ull << 20;
/**
 * The largest segment tried: room for slot counts near 2^32 (their claim words alone take
 * 16 GiB) and for the sizes such counts add up to.
 */
constexpr u64 kMaxSegmentBytes = 256ull << 30;
constexpr u64 kPageBytes = 4096;

/**
 * Address space for the large segments: kMaxSegmentBytes of untouched, unreserved memory
 * and an inaccessible page after it. A segment of n bytes is its last n bytes, so a touch
 * past the segment's end faults. Made once; nullptr when the mapping is refused.
 */
char *LargeSegmentEnd() {
  static char *end = [] {
    void *p = mmap(nullptr, kMaxSegmentBytes + kPageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return static_cast<char *>(nullptr);
    char *guard = static_cast<char *>(p) + kMaxSegmentBytes;
    if (mprotect(guard, kPageBytes, PROT_NONE) != 0) return static_cast<char *>(nullptr);
    return guard;
  }();
  return end;
}

/**
 * True when [p, p + bytes) lies inside [base, base + size). Computed without wrapping:
 * a pointer below base, or a length that overflowed, is outside.
 */
bool Inside(const void *p, unsigned __int128 bytes, const char *base, u64 size) {
  const u64 off = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base);
  return off <= size && static_cast<unsigned __int128>(off) + bytes <= size;
}

/** Gives back the page holding `p` of the reserved mapping, so long runs stay small. */
void ReleasePage(volatile char *p) {
  const uintptr_t page = reinterpret_cast<uintptr_t>(p) & ~(kPageBytes - 1);
  madvise(reinterpret_cast<void *>(page), kPageBytes, MADV_DONTNEED);
}

/**
 * Reads and writes back the first and last byte of a region, so ASan (heap segments) or the
 * guard page (large ones) checks both ends; `large` gives the touched pages back.
 */
void Touch(void *p, u64 bytes, bool large) {
  if (bytes == 0) return;
  volatile char *c = static_cast<volatile char *>(p);
  c[0] = c[0];
  c[bytes - 1] = c[bytes - 1];
  if (large) {
    ReleasePage(c);
    ReleasePage(c + bytes - 1);
  }
}

/**
 * Checks the queue RebaseCpu2Gpu built from `g` over [base, base + size): the descriptor
 * says what `g` said, every array a host client touches lies inside the segment, and its
 * payload size keeps GpuQueue's limits; then both ends of each array are touched.
 */
void CheckQueue(const GpuQueueAttachInfo &g, const Queue &q, char *base, u64 size) {
  const u32 n = q.num_slots_;
  FuzzCheck(n == g.cpu2gpu_slots && q.payload_bytes_ == g.payload_bytes &&
                q.max_wait_ns_ == g.max_wait_ns,
            "a rebased queue has the described slots, payload size and wait");
  FuzzCheck(n != 0, "a rebased queue has slots");
  FuzzCheck(q.records_ == nullptr && q.served_ == nullptr && q.abort_ == nullptr,
            "a host client's queue has no records, served words or abort flag");
  struct Region {
    const char *name;
    void *p;
    unsigned __int128 bytes;
  };
  const Region regions[] = {
      {"request words", q.request_, static_cast<unsigned __int128>(n) * 8},
      {"answer words", q.answer_, static_cast<unsigned __int128>(n) * 8},
      {"payloads", q.payload_, static_cast<unsigned __int128>(n) * q.payload_bytes_},
      {"doorbell", q.doorbell_, 8},
      {"inline answer words", q.answer_words_,
       static_cast<unsigned __int128>(n) * chi::gpu::kInlineAnswerWords * 8},
      {"claim words", q.claims_, static_cast<unsigned __int128>(n) * 4},
  };
  for (const Region &r : regions) {
    if (!Inside(r.p, r.bytes, base, size)) {
      std::fprintf(stderr,
                   "%s of a %u-slot queue (payload %u, shared_off %llu, claims_off %llu) at "
                   "offset %llu leave the %llu-byte segment\n",
                   r.name, n, q.payload_bytes_, static_cast<unsigned long long>(g.shared_off),
                   static_cast<unsigned long long>(g.claims_off),
                   static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(r.p) -
                                                   reinterpret_cast<uintptr_t>(base)),
                   static_cast<unsigned long long>(size));
    }
    FuzzCheck(Inside(r.p, r.bytes, base, size), "every array of a rebased queue is inside");
    FuzzCheck(reinterpret_cast<uintptr_t>(r.p) % 8 == 0, "a rebased queue's words are aligned");
  }
  // After the bounds, so an input that breaks both reads as what would corrupt memory.
  FuzzCheck(q.payload_bytes_ != 0 && q.payload_bytes_ % 16 == 0 &&
                q.payload_bytes_ <= chi::gpu::kGpuPayloadBytes,
            "a rebased queue's payload is a non-zero multiple of 16, at most kGpuPayloadBytes");
  const bool large = size > kMaxHeapSegmentBytes;
  for (const Region &r : regions) Touch(r.p, static_cast<u64>(r.bytes), large);
}

/** Encodes a decoded blob again (EncodeGpuConnectInfo: empty when it names no GPU). */
std::vector<char> Encode(const GpuConnectInfo &info) {
  return chi::gpu::EncodeGpuConnectInfo(info);
}

}  // namespace

/** See the file comment for the input's layout. */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzBytes in(data, size);
  u64 segment_bytes = in.TakeU64() % (kMaxSegmentBytes + 1);
  // A large segment is a whole number of lines, as a real one is pages: its start, this far
  // before the guard page, is then as aligned as a real segment's data.
  if (segment_bytes > kMaxHeapSegmentBytes) segment_bytes &= ~63ull;
  const std::vector<char> blob(in.RestData(), in.RestData() + in.RestSize());

  GpuConnectInfo info;
  chi::Status st = chi::gpu::DecodeGpuConnectInfo(blob, &info);
  if (!st.ok()) {
    FuzzCheckRefusal(st, "a refused GPU blob has a code and a message");
    return 0;
  }
  FuzzCheck(blob.empty() || info.version == chi::gpu::kGpuConnectInfoVersion,
            "a decoded GPU blob has this build's version");
  // Canonical form: the second encoding of what decoded is the first.
  const std::vector<char> once = Encode(info);
  GpuConnectInfo again;
  FuzzCheck(chi::gpu::DecodeGpuConnectInfo(once, &again).ok(), "a re-encoded GPU blob decodes");
  FuzzCheck(again.gpus.size() == info.gpus.size(), "a re-encoded GPU blob keeps its GPUs");
  FuzzCheck(Encode(again) == once, "a GPU blob's second encoding is the first");

  std::unique_ptr<char[]> heap;
  char *base = nullptr;
  if (segment_bytes <= kMaxHeapSegmentBytes) {
    heap.reset(new char[segment_bytes]);  // not zeroed: the harness only touches it
    base = heap.get();
  } else if (char *end = LargeSegmentEnd(); end != nullptr) {
    base = end - segment_bytes;
  }
  if (base == nullptr) return 0;
  for (const GpuQueueAttachInfo &g : info.gpus) {
    Queue q;
    chi::Status rebased = chi::gpu::RebaseCpu2Gpu(g, base, segment_bytes, &q);
    if (!rebased.ok()) {
      FuzzCheckRefusal(rebased, "a refused GPU queue has a code and a message");
      FuzzCheck(rebased.code() == chi::ErrorCode::kMalformed, "a refused GPU queue is kMalformed");
      continue;
    }
    CheckQueue(g, q, base, segment_bytes);
  }
  return 0;
}
