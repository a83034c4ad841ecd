// The buffers that assemble and encode large messages: emptied between messages, a large
// one keeps its memory (its pages lent to the kernel) and takes the next message intact;
// a released one gives its memory back.
#include <doctest/doctest.h>

#include <chi/transport/message_buffer.h>

#include <algorithm>  // std::all_of
#include <string>
#include <vector>

#include "lazy_free_bytes.h"

namespace {

using chi::u64;
using chi_test::LazyFreeBytes;

}  // namespace

TEST_CASE("an emptied large message buffer keeps its memory and lends its pages to the kernel") {
  constexpr u64 kBytes = 8ull << 20;
  std::vector<char> v(kBytes, 'a');
  const char *where = v.data();
  const u64 capacity = v.capacity();
  const u64 lazy_before = LazyFreeBytes();
  chi::RecycleBuffer(&v);
  CHECK(v.empty());
  CHECK(v.capacity() == capacity);  // the next message reuses it: no new pages to fault in
  CHECK(v.data() == where);
  // The pages were lent (allow for ones the kernel already took, and the unaligned ends).
  CHECK(LazyFreeBytes() >= lazy_before + kBytes / 2);
  // The next message is written over the lent pages and reads back intact.
  const std::string next(kBytes, 'b');
  v.insert(v.end(), next.begin(), next.end());
  CHECK(v.data() == where);
  CHECK(std::all_of(v.begin(), v.end(), [](char c) { return c == 'b'; }));
  chi::ReleaseBuffer(&v);
  CHECK(v.capacity() == 0);
}

TEST_CASE("an emptied small message buffer stays as it is") {
  std::vector<char> v(4096, 'a');
  const u64 capacity = v.capacity();
  chi::RecycleBuffer(&v);
  CHECK(v.empty());
  CHECK(v.capacity() == capacity);
  CHECK(chi::LendPagesToKernel(v.data(), 100));  // no whole page inside: nothing to lend
}
