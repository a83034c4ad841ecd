// CopySpace: messages far larger than the ring stream byte-exact between processes, the
// receiver learns a length before the payload, oversized messages are rejected without
// derailing the stream, and timeouts on either end leave the next message intact.
#include <doctest/doctest.h>

#include "fork_helpers.h"

#include <chi/transport/copy_space.h>

#include <poll.h>         // poll on a pidfd: bounded wait for a child
#include <signal.h>       // SIGKILL for a child that overstays
#include <sys/mman.h>     // MAP_SHARED region shared with the forked child
#include <sys/syscall.h>  // SYS_pidfd_open
#include <sys/wait.h>     // waitpid, WIFEXITED
#include <unistd.h>       // fork, _exit

#include <cstring>  // memcmp
#include <string>   // small text messages
#include <vector>   // message buffers

using chi::CopySpace;
using chi::ErrorCode;
using chi::u32;
using chi::u64;

namespace {

constexpr u64 kSecond = 1000000000ull;
constexpr u64 kMillisecond = 1000000ull;

using chi_test::ForkChild;
using chi_test::SharedRegion;
using chi_test::WaitChild;


/** Deterministic bytes for message `index` of `len` bytes (splitmix64 stream). */
std::vector<char> Pattern(u64 index, u64 len) {
  std::vector<char> out(len);
  u64 x = index * 0x9E3779B97F4A7C15ull + len;
  for (u64 i = 0; i < len; ++i) {
    if (i % 8 == 0) {
      x += 0x9E3779B97F4A7C15ull;
      u64 z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      x = z ^ (z >> 31);
    }
    out[i] = static_cast<char>(x >> (8 * (i % 8)));
  }
  return out;
}

/** FNV-1a over the bytes: an independent check on top of the full comparison. */
u64 Checksum(const std::vector<char> &v) {
  u64 h = 1469598103934665603ull;
  for (char c : v) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

/** Size of message i in the random-size stream: 0, ring-edge sizes, and up to 3 rings. */
u64 RandomSize(u64 i, u64 ring) {
  if (i % 17 == 0) return 0;
  if (i % 13 == 0) return ring - 16;
  if (i % 11 == 0) return ring;
  u64 x = (i + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  return x % (3 * ring);
}

CopySpace *MakeSpace(char *mem, u32 ring_bytes) {
  CopySpace *cs = CopySpace::Create(mem, ring_bytes);
  REQUIRE(cs != nullptr);
  return cs;
}

}  // namespace

TEST_CASE("a 1 MiB message crosses a 4 KiB ring to another process and back byte-exact") {
  constexpr u64 kLen = 1 << 20;
  size_t one = CopySpace::BytesFor(4096);
  SharedRegion region(2 * one);
  CopySpace *to_child = MakeSpace(region.get(), 4096);
  CopySpace *to_parent = MakeSpace(region.get() + one, 4096);
  const std::vector<char> sent = Pattern(1, kLen);
  const u64 sum = Checksum(sent);

  pid_t child = ForkChild([&] {
    // The length is known while at most 4 KiB of the payload can have arrived.
    u64 announced = 0;
    if (!to_child->PeekLength(&announced, 10 * kSecond).ok() || announced != kLen) return false;
    std::vector<char> got;
    if (!to_child->Recv(&got, 2 * kLen, 10 * kSecond).ok()) return false;
    if (got.size() != kLen || Checksum(got) != sum) return false;
    return to_parent->Send(got.data(), got.size(), 10 * kSecond).ok();
  });
  chi::Status s = to_child->Send(sent.data(), sent.size(), 10 * kSecond);
  CHECK_MESSAGE(s.ok(), s.ToString());
  std::vector<char> back;
  s = to_parent->Recv(&back, 2 * kLen, 10 * kSecond);
  CHECK_MESSAGE(s.ok(), s.ToString());
  CHECK(WaitChild(child));
  REQUIRE(back.size() == kLen);
  CHECK(Checksum(back) == sum);
  CHECK(std::memcmp(back.data(), sent.data(), kLen) == 0);
  CHECK(to_child->SenderStalls() > 0);
}

TEST_CASE("hundreds of messages of random sizes arrive intact and in order from a process") {
  constexpr u32 kRing = 4096;
  constexpr u64 kMessages = 400;
  SharedRegion region(CopySpace::BytesFor(kRing));
  CopySpace *cs = MakeSpace(region.get(), kRing);
  pid_t child = ForkChild([&] {
    for (u64 i = 0; i < kMessages; ++i) {
      std::vector<char> msg = Pattern(i, RandomSize(i, kRing));
      if (!cs->Send(msg.data(), msg.size(), 10 * kSecond).ok()) return false;
    }
    return true;
  });
  u64 intact = 0;
  std::vector<char> buf(3 * kRing);
  for (u64 i = 0; i < kMessages; ++i) {
    std::vector<char> expect = Pattern(i, RandomSize(i, kRing));
    chi::Status s;
    std::vector<char> got;
    if (i % 2 == 0) {
      s = cs->Recv(&got, 3 * kRing, 10 * kSecond);
    } else {
      u64 len = 0;
      s = cs->Recv(buf.data(), buf.size(), &len, 10 * kSecond);
      got.assign(buf.begin(), buf.begin() + static_cast<long>(s.ok() ? len : 0));
    }
    if (!s.ok()) {
      FAIL_CHECK("message " << i << ": " << s.ToString());
      break;
    }
    if (got == expect) ++intact;
  }
  CHECK(intact == kMessages);
  CHECK(WaitChild(child));
}

TEST_CASE("a message over the receiver's limit is rejected with kTooLarge and the next arrives") {
  constexpr u32 kRing = 4096;
  SharedRegion region(CopySpace::BytesFor(kRing));
  CopySpace *cs = MakeSpace(region.get(), kRing);
  const std::vector<char> big = Pattern(7, 100000);
  const std::vector<char> small = Pattern(8, 1000);
  const std::vector<char> tiny = Pattern(9, 5);
  pid_t child = ForkChild([&] {
    for (const auto *m : {&big, &small, &big, &tiny, &big, &small}) {
      if (!cs->Send(m->data(), m->size(), 10 * kSecond).ok()) return false;
    }
    return true;
  });
  std::vector<char> got;
  chi::Status s = cs->Recv(&got, 4096, 10 * kSecond);
  CHECK(s.code() == ErrorCode::kTooLarge);
  CHECK(std::string(s.message()).find("100000") != std::string::npos);
  CHECK(got.empty());
  s = cs->Recv(&got, 4096, 10 * kSecond);
  CHECK_MESSAGE(s.ok(), s.ToString());
  CHECK(got == small);

  char buf[64];
  u64 len = 0;
  s = cs->Recv(buf, sizeof(buf), &len, 10 * kSecond);
  CHECK(s.code() == ErrorCode::kTooLarge);
  CHECK(len == big.size());
  s = cs->Recv(buf, sizeof(buf), &len, 10 * kSecond);
  CHECK_MESSAGE(s.ok(), s.ToString());
  CHECK(len == tiny.size());
  CHECK(std::memcmp(buf, tiny.data(), tiny.size()) == 0);

  CHECK(cs->Skip(10 * kSecond).ok());
  s = cs->Recv(&got, 4096, 10 * kSecond);
  CHECK_MESSAGE(s.ok(), s.ToString());
  CHECK(got == small);
  CHECK(WaitChild(child));
}

TEST_CASE("timeouts on either end return kTimeout and the next message still arrives intact") {
  constexpr u32 kRing = 4096;
  SharedRegion region(CopySpace::BytesFor(kRing));
  CopySpace *cs = MakeSpace(region.get(), kRing);
  std::vector<char> got;
  u64 len = 0;

  // Nothing sent yet: the receiver times out, having waited.
  u64 start = chi::MonotonicNs();
  CHECK(cs->Recv(&got, 1 << 20, kMillisecond).code() == ErrorCode::kTimeout);
  CHECK(chi::MonotonicNs() - start >= kMillisecond);
  CHECK(cs->PeekLength(&len, kMillisecond).code() == ErrorCode::kTimeout);

  const std::vector<char> a = Pattern(1, 48);
  const std::vector<char> b = Pattern(2, 16384);
  const std::vector<char> c = Pattern(3, 16);
  CHECK(cs->Send(a.data(), a.size(), kSecond).ok());
  // b fills the ring and times out mid-message, with no room left to cancel it yet.
  CHECK(cs->Send(b.data(), b.size(), 2 * kMillisecond).code() == ErrorCode::kTimeout);
  // The ring is full: a new message cannot even start, and leaves no trace.
  CHECK(cs->Send(c.data(), c.size(), kMillisecond).code() == ErrorCode::kTimeout);

  CHECK(cs->Recv(&got, 1 << 20, kSecond).ok());
  CHECK(got == a);
  // Room again: this Send first closes b with a cancel record, then carries c.
  CHECK(cs->Send(c.data(), c.size(), kSecond).ok());
  CHECK(cs->PeekLength(&len, kSecond).ok());
  CHECK(len == b.size());
  CHECK(cs->Recv(&got, 1 << 20, kSecond).code() == ErrorCode::kCancelled);
  CHECK(got.empty());
  CHECK(cs->Recv(&got, 1 << 20, kSecond).ok());
  CHECK(got == c);

  // Now the receiver gives up mid-message: the rest of that message is discarded later.
  const std::vector<char> e = Pattern(5, 10000);
  const std::vector<char> f = Pattern(6, 300);
  CHECK(cs->Send(e.data(), e.size(), 2 * kMillisecond).code() == ErrorCode::kTimeout);
  CHECK(cs->Recv(&got, 1 << 20, 2 * kMillisecond).code() == ErrorCode::kTimeout);
  CHECK(cs->Send(f.data(), f.size(), kSecond).ok());
  CHECK(cs->Recv(&got, 1 << 20, kSecond).ok());
  CHECK(got == f);
  CHECK(cs->Recv(&got, 1 << 20, kMillisecond).code() == ErrorCode::kTimeout);
}

TEST_CASE("an empty message and a message of exactly the ring's size both round-trip") {
  SharedRegion region(CopySpace::BytesFor(256));
  CopySpace *cs = MakeSpace(region.get(), 256);
  const std::vector<char> full = Pattern(4, 256);
  pid_t child = ForkChild([&] {
    return cs->Send(nullptr, 0, 10 * kSecond).ok() &&
           cs->Send(full.data(), full.size(), 10 * kSecond).ok() &&
           cs->Send(nullptr, 0, 10 * kSecond).ok();
  });
  std::vector<char> got{'x'};
  CHECK(cs->Recv(&got, 1024, 10 * kSecond).ok());
  CHECK(got.empty());
  CHECK(cs->Recv(&got, 1024, 10 * kSecond).ok());
  CHECK(got == full);
  u64 len = 99;
  CHECK(cs->Recv(nullptr, 0, &len, 10 * kSecond).ok());
  CHECK(len == 0);
  CHECK(WaitChild(child));
}

TEST_CASE("CopySpace sizes its ring to a power of two and refuses misaligned memory") {
  CHECK(CopySpace::BytesFor(3000) == CopySpace::BytesFor(4096));
  CHECK(CopySpace::BytesFor(1) == CopySpace::BytesFor(CopySpace::kMinRingBytes));
  SharedRegion region(CopySpace::BytesFor(3000) + 64);
  CHECK(CopySpace::Create(region.get() + 8, 3000) == nullptr);
  CHECK(CopySpace::Create(nullptr, 3000) == nullptr);
  CopySpace *cs = MakeSpace(region.get(), 3000);
  CHECK(cs->RingBytes() == 4096);
  CHECK(CopySpace::Attach(region.get())->RingBytes() == 4096);
}
