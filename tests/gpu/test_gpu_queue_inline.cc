// GpuQueue's answer and request words (mailbox.h) over plain memory, with no runtime: small
// answers travel inline in the answer words and large ones through the payload, each taken
// exactly once; a reader polling while an answer is written never takes a partial one; and
// requests posted inline arrive whole, only once every word has come. The routes that use
// these queues are in test_gpu_protocol.cc.
#include <doctest/doctest.h>

#include <chi/core/atomic.h>
#include <chi/gpu/gpu_wire.h>
#include <chi/gpu/mailbox.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using chi::u32;
using chi::u64;

}  // namespace

namespace {

/** One system-scope queue of two slots over plain memory, for the answer-word tests. */
struct BareQueue {
  using Q = chi::gpu::GpuQueue<chi::MemScope::kSystem>;
  static constexpr u32 kSlots = 2;
  static constexpr u32 kPayload = chi::gpu::kGpuPayloadBytes;
  std::vector<char> shared = std::vector<char>(Q::SharedBytes(kSlots, kPayload) + 64, 0);
  std::vector<char> client = std::vector<char>(Q::ClientBytes(kSlots, false) + 64, 0);
  std::vector<char> server = std::vector<char>(Q::ServerBytes(kSlots) + 64, 0);
  Q q;

  /** gpu_clients: a gpu2cpu-style queue, whose answers always go through the payload. */
  explicit BareQueue(bool gpu_clients = false)
      : q(Q::Make(kSlots, kPayload, 1000000000ull, Align(shared), Align(client), gpu_clients,
                  Align(server), nullptr)) {}

  static char *Align(std::vector<char> &v) {
    return reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(v.data()) + 63) &
                                    ~uintptr_t{63});
  }
};

/**
 * An answer envelope for request `seq` with `body` bytes, each derived from seq and its index;
 * `ok`: the first 8 are a success's header (rc 0, no message), which travels left out.
 */
void FillAnswer(char *buf, u32 seq, u32 body, bool ok = false) {
  chi::gpu::PutRequestId(buf, seq);
  for (u32 i = 0; i < body; ++i) {
    buf[8 + i] = ok && i < chi::gpu::kOkHeaderBytes ? 0 : static_cast<char>(seq * 31 + i);
  }
}

}  // namespace

/** Publishes and takes answers of every size class through one queue (see the test below). */
void CheckAnswersEachOnce(bool gpu_clients, bool ok) {
  CAPTURE(gpu_clients);
  CAPTURE(ok);
  BareQueue b(gpu_clients);
  const u32 cap = b.q.InlineAnswerCap();
  CHECK(b.q.PairPoll() == gpu_clients);
  CHECK(cap == (gpu_clients ? 4 : chi::gpu::kInlineAnswerBytes));
  alignas(16) char in[chi::gpu::kGpuPayloadBytes] = {};
  alignas(16) char out[chi::gpu::kGpuPayloadBytes] = {};
  u32 len = 0;
  CHECK_FALSE(b.q.TakeAnswer(0, 1, out, &len));  // fresh words read as sequence 0
  const u32 head = ok ? chi::gpu::kOkHeaderBytes : 0;  // bytes a success leaves out
  const u32 bodies[] = {0, 1, 4, 5, 12, chi::gpu::kInlineAnswerBytes,
                        chi::gpu::kInlineAnswerBytes + 1, 600,
                        chi::gpu::kGpuPayloadBytes - 8 - head};
  u32 seq = 0;
  for (const u32 rest : bodies) {
    const u32 body = head + rest;
    CAPTURE(body);
    ++seq;
    FillAnswer(in, seq, body, ok);
    CHECK_FALSE(b.q.TakeAnswer(0, seq, out, &len));
    std::memset(b.q.Payload(0), 0x5a, BareQueue::kPayload);  // stands for the request's bytes
    b.q.PutAnswer(0, seq, in, 8 + body);
    std::memset(out, 0x77, sizeof(out));
    REQUIRE(b.q.TakeAnswer(0, seq, out, &len));
    CHECK(len == 8 + body);
    CHECK(std::memcmp(out, in, len) == 0);
    CHECK(static_cast<u32>(b.q.answer_[0].Load()) == seq);  // the slot reads as answered
    CHECK_FALSE(b.q.TakeAnswer(0, seq + 1, out, &len));     // the next request's is not here
    CHECK_FALSE(b.q.TakeAnswer(1, seq, out, &len));         // nor in the other slot
    // An inline answer leaves the payload (the request's bytes) alone.
    const bool inline_answer = rest <= cap;
    CHECK((b.q.Payload(0)[8] == 0x5a) == (inline_answer || in[8] == 0x5a));
  }
}

TEST_CASE("small answers travel inline, large ones through the payload, each exactly once") {
  for (const bool ok : {false, true}) {
    CheckAnswersEachOnce(false, ok);  // cpu2gpu and gpu2gpu: up to 28 bytes inline
    CheckAnswersEachOnce(true, ok);   // gpu2cpu: one data word inline (a 16-byte poll)
  }
}

/**
 * A writer publishes kRounds answers while the reader polls; every one must be taken whole.
 * Bodies vary around the queue's inline cap; even rounds are successes (header left out).
 */
void CheckNoPartialAnswers(bool gpu_clients) {
  CAPTURE(gpu_clients);
  BareQueue b(gpu_clients);
  constexpr u32 kRounds = 3000;
  const u32 top = gpu_clients ? chi::gpu::kOkHeaderBytes + 4 : chi::gpu::kInlineAnswerBytes;
  std::atomic<u32> taken{0};
  std::atomic<u32> bad{0};
  std::thread writer([&] {
    alignas(16) char in[chi::gpu::kGpuPayloadBytes];
    for (u32 seq = 1; seq <= kRounds; ++seq) {
      while (taken.load(std::memory_order_acquire) != seq - 1) std::this_thread::yield();
      FillAnswer(in, seq, top - (seq % 5), seq % 2 == 0);
      b.q.PutAnswer(0, seq, in, 8 + top - (seq % 5));
    }
  });
  alignas(16) char out[chi::gpu::kGpuPayloadBytes];
  alignas(16) char want[chi::gpu::kGpuPayloadBytes];
  for (u32 seq = 1; seq <= kRounds; ++seq) {
    u32 len = 0;
    while (!b.q.TakeAnswer(0, seq, out, &len)) std::this_thread::yield();
    const u32 body = top - (seq % 5);
    FillAnswer(want, seq, body, seq % 2 == 0);
    if (len != 8 + body || std::memcmp(out, want, len) != 0) bad.fetch_add(1);
    taken.store(seq, std::memory_order_release);
  }
  writer.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("a reader polling while answers are being written never takes a partial one") {
  CheckNoPartialAnswers(false);
  CheckNoPartialAnswers(true);
}

TEST_CASE("requests posted inline arrive whole, and only when every word has come") {
  BareQueue b(true);  // gpu2cpu-style: GPU clients post inline, the host reads
  const auto &q = b.q;
  REQUIRE(q.InlineRequestCap() == BareQueue::kPayload / 2);
  alignas(16) char in[chi::gpu::kGpuPayloadBytes];
  alignas(16) char out[chi::gpu::kGpuPayloadBytes];
  for (u32 i = 0; i < sizeof(in); ++i) in[i] = static_cast<char>(i * 7 + 3);
  u32 len = 0;
  SUBCASE("a small request is unpacked into the reader's buffer") {
    q.PostInline(0, 5, in, 84);
    const u64 word = q.PeekRequest(0);
    CHECK(static_cast<u32>(word) == 5);
    const char *p = q.TakeRequest(0, word, out, &len);
    REQUIRE(p == out);
    CHECK(len == 84);
    CHECK(std::memcmp(out, in, 84) == 0);
  }
  SUBCASE("a word still carrying the last sequence means not yet") {
    q.PostInline(0, 5, in, 84);
    auto *w = reinterpret_cast<chi::Atomic<u64, chi::MemScope::kSystem> *>(q.Payload(0));
    w[7].Store(static_cast<u64>(4) << 32);  // word 7 of request 5 has not landed
    CHECK(q.TakeRequest(0, q.PeekRequest(0), out, &len) == nullptr);
    w[7].Store(static_cast<u64>(5) << 32 | 0x01020304u);
    REQUIRE(q.TakeRequest(0, q.PeekRequest(0), out, &len) == out);
    CHECK(reinterpret_cast<const u32 *>(out)[7] == 0x01020304u);
  }
  SUBCASE("a request over the inline cap goes through the payload, read in place") {
    std::memcpy(q.Payload(1), in, 600);
    q.Post(1, 9, 600);
    const char *p = q.TakeRequest(1, q.PeekRequest(1), out, &len);
    CHECK(p == q.Payload(1));
    CHECK(len == 600);
    CHECK(std::memcmp(p, in, 600) == 0);
  }
  SUBCASE("an inline length past the cap reads as malformed (length 0)") {
    const u64 forged = 3ull | static_cast<u64>(chi::gpu::kRequestInline | 900u) << 32;
    CHECK(q.TakeRequest(0, forged, out, &len) != nullptr);
    CHECK(len == 0);
  }
}
