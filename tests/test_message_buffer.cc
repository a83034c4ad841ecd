// The buffers that assemble and encode large messages: emptied between messages, a large
// one keeps its memory, resident while the process's warm budget has room for it and with
// its pages lent to the kernel beyond that, and takes the next message intact; a released
// one gives its memory and its share of the budget back. An encoded message goes to
// ZeroMQ copied when small and handed over whole when large.
#include <doctest/doctest.h>

#include <chi/transport/message_buffer.h>
#include <chi/transport/zmq_common.h>  // MessageOf

#include <algorithm>  // std::all_of
#include <memory>     // unique_ptr of the buffers
#include <string>
#include <vector>

#include "lazy_free_bytes.h"

namespace {

using chi::MessageBuffer;
using chi::u64;
using chi_test::LazyFreeBytes;

constexpr u64 kMiB = 1ull << 20;

/** Writes `n` bytes of `c` as the buffer's next message and checks they read back intact. */
bool NextMessageIntact(MessageBuffer *b, u64 n, char c) {
  const std::string next(n, c);
  b->bytes.insert(b->bytes.end(), next.begin(), next.end());
  return std::all_of(b->bytes.begin(), b->bytes.end(), [c](char x) { return x == c; });
}

}  // namespace

TEST_CASE("an emptied large message buffer within the warm budget keeps its pages resident") {
  REQUIRE(chi::WarmMessageBytes() == 0);
  constexpr u64 kBytes = 8 * kMiB;
  MessageBuffer b;
  b.bytes.assign(kBytes, 'a');
  const char *where = b.bytes.data();
  const u64 capacity = b.bytes.capacity();
  const u64 lazy_before = LazyFreeBytes();
  chi::RecycleBuffer(&b);
  CHECK(b.bytes.empty());
  CHECK(b.bytes.capacity() == capacity);  // the next message reuses it: no new pages to fault in
  CHECK(b.bytes.data() == where);
  CHECK(b.warm == capacity);
  CHECK(chi::WarmMessageBytes() == capacity);
  CHECK(LazyFreeBytes() < lazy_before + kBytes / 2);  // not lent: no madvise per message
  CHECK(NextMessageIntact(&b, kBytes, 'b'));
  CHECK(b.bytes.data() == where);
  chi::RecycleBuffer(&b);
  CHECK(chi::WarmMessageBytes() == capacity);  // the same share, not taken twice
  chi::ReleaseBuffer(&b);
  CHECK(b.bytes.capacity() == 0);
  CHECK(b.warm == 0);
  CHECK(chi::WarmMessageBytes() == 0);
}

TEST_CASE("emptied buffers past the warm budget lend their pages and still take messages") {
  REQUIRE(chi::WarmMessageBytes() == 0);
  constexpr u64 kBytes = 48 * kMiB;  // two fit the 128 MiB budget, the third does not
  static_assert(2 * kBytes <= chi::kWarmMessageBytes && 3 * kBytes > chi::kWarmMessageBytes);
  std::vector<std::unique_ptr<MessageBuffer>> buffers;
  for (int i = 0; i < 3; ++i) {
    buffers.push_back(std::make_unique<MessageBuffer>());
    buffers.back()->bytes.assign(kBytes, 'a');
  }
  chi::RecycleBuffer(buffers[0].get());
  chi::RecycleBuffer(buffers[1].get());
  const u64 lazy_before = LazyFreeBytes();
  MessageBuffer &third = *buffers[2];
  const char *where = third.bytes.data();
  chi::RecycleBuffer(&third);
  CHECK(buffers[0]->warm != 0);
  CHECK(buffers[1]->warm != 0);
  CHECK(third.warm == 0);
  CHECK(third.bytes.data() == where);  // kept, with its pages lent
  // The pages were lent (allow for ones the kernel already took, and the unaligned ends).
  CHECK(LazyFreeBytes() >= lazy_before + kBytes / 2);
  CHECK(chi::WarmMessageBytes() <= chi::kWarmMessageBytes);
  CHECK(NextMessageIntact(&third, kBytes, 'c'));

  buffers[0].reset();  // a destroyed buffer gives its share back
  chi::RecycleBuffer(&third);
  CHECK(third.warm == third.bytes.capacity());  // now it fits the budget
  buffers.clear();
  CHECK(chi::WarmMessageBytes() == 0);
}

TEST_CASE("an emptied small message buffer stays as it is") {
  MessageBuffer b;
  b.bytes.assign(4096, 'a');
  const u64 capacity = b.bytes.capacity();
  chi::RecycleBuffer(&b);
  CHECK(b.bytes.empty());
  CHECK(b.bytes.capacity() == capacity);
  CHECK(b.warm == 0);  // below kWarmBufferBytes: no share of the budget
  CHECK(chi::LendPagesToKernel(b.bytes.data(), 100));  // no whole page inside: nothing to lend
}

TEST_CASE("a lowered warm budget lends the pages of buffers that no longer fit it") {
  REQUIRE(chi::WarmMessageBytes() == 0);
  REQUIRE(chi::WarmMessageBudget() == chi::kWarmMessageBytes);
  constexpr u64 kBytes = 16 * kMiB;
  MessageBuffer b;
  b.bytes.assign(kBytes, 'a');
  chi::RecycleBuffer(&b);
  REQUIRE(b.warm == b.bytes.capacity());  // kept resident under the default budget

  chi::SetWarmMessageBudget(8 * kMiB);  // as memory.warm_message_bytes: 8m would set it
  CHECK(NextMessageIntact(&b, kBytes, 'b'));
  const u64 lazy_before = LazyFreeBytes();
  chi::RecycleBuffer(&b);
  CHECK(b.warm == 0);  // its share went back: it no longer fits
  CHECK(chi::WarmMessageBytes() == 0);
  CHECK(LazyFreeBytes() >= lazy_before + kBytes / 2);  // its pages were lent
  CHECK(NextMessageIntact(&b, kBytes, 'c'));

  chi::SetWarmMessageBudget(0);  // 0: every large buffer is lent
  MessageBuffer small_budget;
  small_budget.bytes.assign(2 * kMiB, 'd');
  chi::RecycleBuffer(&small_budget);
  CHECK(small_budget.warm == 0);

  chi::SetWarmMessageBudget(chi::kWarmMessageBytes);
  chi::RecycleBuffer(&b);
  CHECK(b.warm == b.bytes.capacity());  // the default budget takes it back in
  chi::ReleaseBuffer(&b);
  CHECK(chi::WarmMessageBytes() == 0);
}

TEST_CASE("an encoded message goes to ZeroMQ copied when small and handed over whole when large") {
  std::vector<char> small(100, 's');
  zmq::message_t a = chi::MessageOf(&small);
  CHECK(a.size() == 100);
  CHECK(a.data<char>() != small.data());  // a copy: the buffer keeps its bytes for reuse
  CHECK(small.size() == 100);
  CHECK(std::string(a.data<char>(), a.size()) == std::string(100, 's'));

  std::vector<char> large(kMiB);
  for (u64 i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7 % 251);
  const std::vector<char> expect = large;
  const char *where = large.data();
  zmq::message_t b = chi::MessageOf(&large);
  CHECK(large.empty());  // handed over
  CHECK(b.data<char>() == where);  // no copy
  REQUIRE(b.size() == kMiB);
  // Through a socket: ZeroMQ frees the buffer once sent (ASan checks it is freed once).
  zmq::context_t ctx;
  zmq::socket_t tx(ctx, zmq::socket_type::pair);
  zmq::socket_t rx(ctx, zmq::socket_type::pair);
  rx.bind("inproc://message_of");
  tx.connect("inproc://message_of");
  REQUIRE(tx.send(std::move(b), zmq::send_flags::none).has_value());
  zmq::message_t got;
  REQUIRE(rx.recv(got, zmq::recv_flags::none).has_value());
  REQUIRE(got.size() == kMiB);
  CHECK(std::equal(expect.begin(), expect.end(), got.data<char>()));
  // One never sent is freed with its message.
  std::vector<char> unsent(2 * kMiB, 'u');
  { zmq::message_t c = chi::MessageOf(&unsent); }
  CHECK(unsent.empty());
}
