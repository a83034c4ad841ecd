// ShmStream framing: the records one shared-memory stream carries. A message that fits
// one record travels as kWhole (one cache line up to 56 bytes), a larger one as kBegin
// plus kMore pieces; every record starts on a cache line; corrupt or unframed bytes are
// reported, never trusted; CopySmall, which writes a record's first line, copies exactly.
#include <doctest/doctest.h>

#include <chi/transport/shm_stream.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

/** A stream in heap memory (both ends in this thread). */
struct Stream {
  explicit Stream(chi::u32 ring) : mem(chi::ShmStream::BytesFor(ring) / 64 + 1) {
    s = chi::ShmStream::Create(mem.data(), ring);
    REQUIRE(s.Valid());
  }
  /** 64-byte aligned storage. */
  struct alignas(64) Line {
    char bytes[64];
  };
  std::vector<Line> mem;
  chi::ShmStream s;
};

/** Reads the next record; returns its payload and stores what Peek said. */
std::string TakeRecord(const chi::ShmStream &s, chi::ShmStream::Piece *p) {
  REQUIRE(s.Peek(p) == chi::ShmStream::PeekResult::kReady);
  std::string out(p->bytes, '\0');
  p->CopyTo(out.data());
  s.Consume(*p);
  return out;
}

}  // namespace

TEST_CASE("a message that fits one record takes one cache line up to 56 bytes") {
  Stream st(4096);
  for (chi::u64 n : {0ull, 1ull, 55ull, 56ull, 57ull, 120ull, 121ull}) {
    const std::string msg(n, static_cast<char>('a' + n % 26));
    st.s.WritePiece(true, n, msg.data(), n);
    chi::ShmStream::Piece p;
    CHECK(TakeRecord(st.s, &p) == msg);
    CHECK(p.kind == chi::ShmStream::kBegin);  // whole records read as a message's start
    CHECK(p.message_bytes == n);
    CHECK(p.footprint == (n <= 56 ? 64u : (n <= 120 ? 128u : 192u)));
  }
  CHECK_FALSE(st.s.HasData());
}

TEST_CASE("every message length from 0 to 130 bytes arrives byte-exact") {
  Stream st(1024);  // small: the records wrap round the ring many times
  for (chi::u64 n = 0; n <= 130; ++n) {
    std::string msg(n, '\0');
    for (chi::u64 i = 0; i < n; ++i) msg[i] = static_cast<char>(n * 7 + i * 13 + 1);
    st.s.WritePiece(true, n, msg.data(), n);
    chi::ShmStream::Piece p;
    CHECK(TakeRecord(st.s, &p) == msg);
  }
}

TEST_CASE("CopySmall copies each size up to 64 bytes exactly and writes nothing past it") {
  for (chi::u64 n = 0; n <= 64; ++n) {
    char src[64];
    char dst[80];
    for (int i = 0; i < 64; ++i) src[i] = static_cast<char>(i + 1);
    std::memset(dst, 0x7f, sizeof(dst));
    chi::CopySmall(dst + 3, src, n);  // unaligned on purpose
    CAPTURE(n);
    CHECK(std::memcmp(dst + 3, src, n) == 0);
    bool untouched = dst[0] == 0x7f && dst[1] == 0x7f && dst[2] == 0x7f;
    for (chi::u64 i = 3 + n; i < sizeof(dst); ++i) untouched &= dst[i] == 0x7f;
    CHECK(untouched);
  }
}

TEST_CASE("a message in pieces arrives as kBegin then kMore, across the ring's end") {
  Stream st(256);  // small: the pieces wrap
  std::string msg(1000, '\0');
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<char>(i * 7);
  std::string got;
  chi::u64 sent = 0;
  bool first = true;
  while (got.size() < msg.size()) {
    const chi::u64 room = st.s.WritableBytes(msg.size() - sent);
    if (sent < msg.size() && room > 0) {
      const chi::u64 n = room < msg.size() - sent ? room : msg.size() - sent;
      st.s.WritePiece(sent == 0, msg.size(), msg.data() + sent, n);
      sent += n;
    }
    chi::ShmStream::Piece p;
    const std::string piece = TakeRecord(st.s, &p);
    CHECK(p.kind == (first ? chi::ShmStream::kBegin : chi::ShmStream::kMore));
    if (first) CHECK(p.message_bytes == msg.size());
    first = false;
    got += piece;
  }
  CHECK(got == msg);
}

TEST_CASE("corrupt record headers and unframed bytes are reported, not trusted") {
  {
    Stream st(4096);
    const char junk[24] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    st.s.PublishUnframed(junk, sizeof(junk));  // a header word of no known kind
    chi::ShmStream::Piece p;
    CHECK(st.s.Peek(&p) == chi::ShmStream::PeekResult::kCorrupt);
  }
  {
    Stream st(4096);
    const char zeros[16] = {};
    st.s.PublishUnframed(zeros, sizeof(zeros));  // bytes with no header at all
    chi::ShmStream::Piece p;
    CHECK(st.s.Peek(&p) == chi::ShmStream::PeekResult::kEmpty);
    CHECK(st.s.Unframed());
  }
  {
    Stream st(4096);
    // A kWhole header claiming more bytes than the ring holds.
    const chi::u64 word = chi::u64{chi::ShmStream::kWhole} | (chi::u64{0xfffffff0} << 32);
    st.s.PublishUnframed(&word, sizeof(word));
    chi::ShmStream::Piece p;
    CHECK(st.s.Peek(&p) == chi::ShmStream::PeekResult::kCorrupt);
  }
  {
    Stream st(4096);
    // A kBegin whose first piece is longer than the message it announces.
    const chi::u64 header[2] = {chi::u64{chi::ShmStream::kBegin} | (chi::u64{32} << 32), 16};
    st.s.PublishUnframed(header, sizeof(header));
    chi::ShmStream::Piece p;
    CHECK(st.s.Peek(&p) == chi::ShmStream::PeekResult::kCorrupt);
  }
}
