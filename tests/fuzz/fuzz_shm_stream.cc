// libFuzzer harness for what the runtime reads from a client's shared memory: the records
// of a request stream (ShmStream::Peek, Consume, HasData, Unframed) and the data-region
// references they carry (RefOf, ShmDataRegion::Resolve, ShmDataRef::InStep), with the
// stream's shared words (positions, the recorded ring size) as a hostile client left them,
// and the runtime's answer writer (WritableBytes, WritePiece) on a stream whose reader
// position the client forged. The ring, the region and the shared words are heap buffers of
// their exact size, so ASan sees any touch outside them.
// Input: ring size selector, shared words (write, read, cached read, recorded ring size),
// region size selector, then the ring's bytes, then the region's.
#include <cstdint>  // uint8_t
#include <cstring>  // memcpy of the ring's bytes
#include <memory>   // the buffers
#include <vector>   // assembled messages

#include "chi/transport/shm_data_region.h"  // ShmDataRegion, ShmDataRef, RefOf
#include "chi/transport/shm_stream.h"       // ShmStream
#include "fuzz_check.h"                     // FuzzCheck, FuzzBytes

using chi::u32;
using chi::u64;
using chi::ShmDataRef;
using chi::ShmDataRegion;
using chi::ShmStream;
using chi::fuzz::FuzzBytes;
using chi::fuzz::FuzzCheck;

namespace {

/** A 64-byte aligned heap buffer of exactly `bytes` bytes (ASan guards both ends). */
struct Buffer {
  explicit Buffer(size_t bytes) : mem(static_cast<char *>(std::aligned_alloc(64, bytes))) {}
  ~Buffer() { std::free(mem); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  char *mem;
};

/** True when [p, p + n) lies inside [base, base + size). */
bool Inside(const char *p, u64 n, const char *base, u64 size) {
  return p >= base && static_cast<u64>(p - base) <= size && n <= size - (p - base);
}

/** Checks what Peek said of a ready record against the ring it lies in. */
void CheckPiece(const ShmStream::Piece &p, const char *ring, u32 ring_bytes) {
  FuzzCheck(p.footprint % 64 == 0 && p.footprint != 0, "a record's footprint is whole lines");
  FuzzCheck(p.footprint <= ring_bytes - 64, "a record leaves the next header's line free");
  FuzzCheck(p.first_bytes + p.second_bytes == p.bytes, "a payload's two runs add up");
  FuzzCheck(Inside(p.first, p.first_bytes, ring, ring_bytes), "a payload lies in the ring");
  FuzzCheck(p.second_bytes == 0 || Inside(p.second, p.second_bytes, ring, ring_bytes),
            "a wrapped payload's rest lies in the ring");
  FuzzCheck(p.kind == ShmStream::kBegin || p.kind == ShmStream::kMore ||
                p.kind == ShmStream::kRef,
            "Peek reports only known kinds");
  FuzzCheck(p.kind != ShmStream::kRef || p.bytes == ShmStream::kRefBytes,
            "a reference record carries one reference");
  FuzzCheck(p.kind != ShmStream::kBegin || p.bytes <= p.message_bytes,
            "a message's first piece is no longer than the message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzBytes in(data, size);
  // The runtime's own idea of the ring: 256 B .. 8 KiB.
  const u32 ring_bytes = ShmStream::kMinRingBytes << (in.TakeByte() % 6);
  const u64 write_pos = in.TakeU64();
  const u64 read_pos = in.TakeU64();
  const u32 recorded = in.TakeU32();  // what the client wrote as the ring's size
  const u64 region_bytes = (in.TakeByte() % 4) * 4096;  // 0: no data region

  Buffer stream(ShmStream::BytesFor(ring_bytes));
  const ShmStream s = ShmStream::Create(stream.mem, ring_bytes);
  FuzzCheck(s.Valid() && s.RingBytes() == ring_bytes, "Create makes the ring asked for");
  char *ring = stream.mem + ShmStream::BytesFor(ring_bytes) - ring_bytes;
  const u64 ring_fill = in.RestSize() < ring_bytes ? in.RestSize() : ring_bytes;
  std::memcpy(ring, in.RestData(), ring_fill);
  s.ForgeShared(write_pos, read_pos, recorded);

  const u64 region_fill = in.RestSize() - ring_fill;
  std::unique_ptr<Buffer> region_mem;
  chi::Atomic<u64> released;
  ShmDataRegion region;
  if (region_bytes != 0) {
    region_mem = std::make_unique<Buffer>(region_bytes);
    std::memset(region_mem->mem, 0, region_bytes);
    std::memcpy(region_mem->mem, in.RestData() + ring_fill,
                region_fill < region_bytes ? region_fill : region_bytes);
    region = ShmDataRegion(region_mem->mem, region_bytes, &released);
  }

  // The reader, as the runtime's poller reads a request stream: records until it is empty
  // or corrupt, a message's pieces assembled, references resolved and checked in step.
  bool assembling = false;
  bool by_ref = false;
  u64 total = 0;
  std::vector<char> assembly;
  for (u32 n = 0; n < 64; ++n) {
    (void)s.HasData();
    ShmStream::Piece p;
    const ShmStream::PeekResult r = s.Peek(&p);
    if (r == ShmStream::PeekResult::kEmpty) {
      (void)s.Unframed();
      break;
    }
    if (r == ShmStream::PeekResult::kCorrupt) break;
    CheckPiece(p, ring, ring_bytes);
    if (p.kind == ShmStream::kRef) {
      const ShmDataRef ref = chi::RefOf(p);
      const char *bytes = region.Resolve(ref);
      if (bytes == nullptr || !ref.InStep(assembling, by_ref, total, assembly.size())) break;
      FuzzCheck(Inside(bytes, ref.bytes, region_mem->mem, region_bytes),
                "a resolved reference lies in the region");
      if (!assembling && !ref.Whole()) {
        assembling = by_ref = true;
        total = ref.total;
        assembly.clear();
      }
      if (assembling) {
        assembly.insert(assembly.end(), bytes, bytes + ref.bytes);
        FuzzCheck(assembly.size() <= total, "an assembly never outgrows its message");
        if (assembly.size() == total) assembling = false;
      }
    } else if (!assembling) {
      if (p.kind != ShmStream::kBegin) break;
      if (p.bytes != p.message_bytes) {
        assembling = true;
        by_ref = false;
        total = p.message_bytes;
        assembly.assign(p.first, p.first + p.first_bytes);
        assembly.insert(assembly.end(), p.second, p.second + p.second_bytes);
      }
    } else {
      if (p.kind != ShmStream::kMore || by_ref || p.bytes > total - assembly.size()) break;
      assembly.insert(assembly.end(), p.first, p.first + p.first_bytes);
      assembly.insert(assembly.end(), p.second, p.second + p.second_bytes);
      if (assembly.size() == total) assembling = false;
    }
    s.Consume(p);
  }

  // The writer, as the runtime answers into a stream whose positions the client forged:
  // whatever room it is told of, its records stay inside the ring.
  s.ForgeShared(write_pos, read_pos, recorded);
  char answer[8192];
  std::memset(answer, 0x5a, sizeof(answer));
  for (u32 n = 0; n < 4; ++n) {
    const u64 room = s.WritableBytes(sizeof(answer));
    FuzzCheck(room <= ring_bytes, "no more room than the ring has");
    if (room == 0) {
      (void)s.PositionsValid();
      break;
    }
    const u64 len = room < sizeof(answer) ? room : sizeof(answer);
    s.WritePiece(true, len, answer, len);
  }
  return 0;
}
