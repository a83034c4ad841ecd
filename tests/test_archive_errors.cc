// Serialization archives and batches under hostile input: malformed values (bool bytes,
// PoolQuery modes, a type's own check), output that overflows its buffer, truncated and
// forged input (lengths up to 1 GiB), bad batch framing, and fuzzing with bit flips and
// random bytes; all must fail cleanly with the right code. Round trips are in
// test_archive.cc. Also built as test_archive_errors_asan: every decode below reads from an
// exact-size heap copy, so any read past the input is caught by AddressSanitizer.
#include <doctest/doctest.h>

#include <chi/core/ids.h>
#include <chi/core/pool_query.h>
#include <chi/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "archive_test_support.h"  // Flag, Mixed, Encode, batch records

using archive_test::BuildBatch;
using archive_test::Encode;
using archive_test::Flag;
using archive_test::kKinds;
using archive_test::Mixed;
using archive_test::SampleMixed;
using chi::BatchReader;
using chi::BatchWriter;
using chi::ErrorCode;
using chi::InputArchive;
using chi::OutputArchive;
using chi::PoolQuery;
using chi::TaskNode;
using chi::u32;
using chi::u64;
using chi::u8;

// ---- Allocation watch: the largest single operator new while a test looks ----

namespace {
std::atomic<std::size_t> g_largest_alloc{0};
}  // namespace

void *operator new(std::size_t n) {
  std::size_t seen = g_largest_alloc.load(std::memory_order_relaxed);
  // Relaxed: a statistic read by the same thread after the decode under test.
  while (n > seen && !g_largest_alloc.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
  if (void *p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

namespace {

/** Resets the allocation high-water mark; Largest() is the biggest block since. */
struct AllocationWatch {
  AllocationWatch() { g_largest_alloc.store(0, std::memory_order_relaxed); }
  std::size_t Largest() const { return g_largest_alloc.load(std::memory_order_relaxed); }
};

// ---- Types under test (the shared ones are in archive_test_support.h) ----

/** Fixed-capacity text that checks its decoded length itself (the validation hook). */
struct SmallText {
  u32 len_ = 0;
  char text_[16] = {};
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(len_);
    if constexpr (!Ar::kIsOutput) {
      if (len_ > sizeof(text_)) {
        ar.Fail(ErrorCode::kMalformed, "SmallText length exceeds its 16-byte capacity");
        return;
      }
    }
    ar.Bytes(text_, len_);
  }
};

/** An exact-size heap copy of the first len bytes, so ASan sees any over-read. */
std::vector<char> Prefix(const std::vector<char> &bytes, u64 len) {
  return std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len));
}

}  // namespace

// ---- Malformed values ----

TEST_CASE("a bool byte other than 0 or 1 is malformed, for bools and bool-based enums") {
  const char raw[] = {0, 1, 2};
  bool a = false, b = false, c = true;
  InputArchive in(raw, sizeof(raw));
  in(a, b, c);
  CHECK_FALSE(in.ok());
  CHECK(in.code() == ErrorCode::kMalformed);
  CHECK((!a && b && c));  // the bad byte leaves c untouched
  CHECK(in.status().ToString().find("offset 2") != std::string::npos);

  Flag fl = Flag::kOff;
  InputArchive in2(raw + 2, 1);
  in2(fl);
  CHECK(in2.code() == ErrorCode::kMalformed);
  CHECK(fl == Flag::kOff);
}

TEST_CASE("a decoded PoolQuery with an unknown mode or an empty range is malformed") {
  std::vector<char> bytes = Encode(PoolQuery::Range(1, 2));
  u32 bad_mode = 99;
  std::memcpy(bytes.data(), &bad_mode, 4);
  PoolQuery q = PoolQuery::Local();
  InputArchive in(bytes.data(), bytes.size());
  in(q);
  CHECK(in.code() == ErrorCode::kMalformed);
  CHECK(in.status().ToString().find("IsValid") != std::string::npos);

  bytes = Encode(PoolQuery::Range(1, 2));
  u32 zero = 0;
  std::memcpy(bytes.data() + 4, &zero, 4);
  InputArchive in2(bytes.data(), bytes.size());
  in2(q);
  CHECK(in2.code() == ErrorCode::kMalformed);
}

TEST_CASE("a type can reject its own decoded value through Fail") {
  SmallText ok_text;
  ok_text.len_ = 5;
  std::memcpy(ok_text.text_, "hello", 5);
  std::vector<char> bytes = Encode(ok_text);
  CHECK(bytes.size() == 4 + 5);
  SmallText back;
  InputArchive in(bytes.data(), bytes.size());
  in(back);
  REQUIRE(in.ok());
  CHECK(std::string(back.text_, back.len_) == "hello");

  u32 forged = 1000;
  std::memcpy(bytes.data(), &forged, 4);
  InputArchive in2(bytes.data(), bytes.size());
  in2(back);
  CHECK(in2.code() == ErrorCode::kMalformed);
  CHECK(in2.status().ToString().find("16-byte capacity") != std::string::npos);
}

// ---- Output overflow ----

TEST_CASE("overflowing a fixed output buffer is an error, not a write past its end") {
  constexpr u64 kCap = 20;
  std::vector<char> mem(kCap + 16, '\x5a');  // canary bytes after the capacity
  OutputArchive ar(mem.data(), kCap);
  ar(u64{1}, u64{2});  // 16 bytes fit
  CHECK(ar.ok());
  ar(u64{3});  // needs 8, only 4 left
  CHECK_FALSE(ar.ok());
  CHECK(ar.code() == ErrorCode::kTooLarge);
  CHECK(ar.Size() == 16);
  CHECK(ar.status().ToString().find("offset 16: needs 8 bytes, 4 left") != std::string::npos);
  ar(u8{9});  // would fit, but writes after an error are no-ops
  ar(std::string("more"));
  ar.Bytes("abc", 3);
  CHECK(ar.Size() == 16);
  for (u64 k = 16; k < mem.size(); ++k) CHECK(mem[k] == '\x5a');

  char none[1];
  OutputArchive empty(none, 0);
  empty(true);
  CHECK(empty.code() == ErrorCode::kTooLarge);
}

TEST_CASE("PatchBytes refuses ranges beyond what was written; Rewind drops bytes and errors") {
  char buf[16];
  OutputArchive ar(buf, sizeof(buf));
  ar(u32{1}, u32{2});
  const u32 three = 3;
  ar.PatchBytes(4, &three, 4);
  CHECK(ar.ok());
  ar.PatchBytes(6, &three, 4);
  CHECK(ar.code() == ErrorCode::kInvalidArgument);
  ar.Rewind(4);
  CHECK(ar.ok());
  CHECK(ar.Size() == 4);
  ar(u64{7});
  u32 a = 0;
  u64 b = 0;
  InputArchive in(buf, ar.Size());
  in(a, b);
  CHECK(in.ok());
  CHECK((a == 1 && b == 7));
}

// ---- Truncated and forged input ----

TEST_CASE("truncation at every prefix length of a multi-field buffer fails as truncated") {
  const Mixed m = SampleMixed();
  const std::vector<char> bytes = Encode(m);
  for (u64 len = 0; len <= bytes.size(); ++len) {
    CAPTURE(len);
    std::vector<char> cut = Prefix(bytes, len);
    Mixed back;
    InputArchive in(cut.data(), cut.size());
    in(back);
    if (len == bytes.size()) {
      CHECK(in.ok());
      CHECK(back == m);
    } else {
      CHECK_FALSE(in.ok());
      CHECK(in.code() == ErrorCode::kTruncated);
      CHECK(in.status().ToString().find("at offset") != std::string::npos);
    }
  }
}

TEST_CASE("after a failed read the target and every later target are left untouched") {
  const std::vector<char> bytes = Encode(u32{1}, std::string("abcdef"), u64{2});
  // Cut inside the string: the u32 decodes, the string and the u64 do not.
  std::vector<char> cut = Prefix(bytes, 4 + 8 + 3);
  u32 a = 0;
  std::string s = "keep";
  u64 b = 99;
  std::vector<int> v = {5, 6};
  InputArchive in(cut.data(), cut.size());
  in(a, s, b, v);
  CHECK(a == 1);
  CHECK(s == "keep");
  CHECK(b == 99);
  CHECK(v == std::vector<int>{5, 6});
  CHECK(in.code() == ErrorCode::kTruncated);
  CHECK(in.Remaining() == cut.size() - 4);  // the rejected length prefix is not consumed
  CHECK(in.status().ToString().find("string length at offset 4") != std::string::npos);

  // A vector of strings whose last element is cut keeps its old contents.
  std::vector<char> vs_bytes = Encode(std::vector<std::string>{"one", "two"});
  std::vector<char> vs_cut = Prefix(vs_bytes, vs_bytes.size() - 1);
  std::vector<std::string> vs = {"old"};
  InputArchive in2(vs_cut.data(), vs_cut.size());
  in2(vs);
  CHECK_FALSE(in2.ok());
  CHECK(vs == std::vector<std::string>{"old"});
}

TEST_CASE("a 1 GiB string length in a 100-byte buffer fails at once without allocating") {
  std::vector<char> buf(100, 'a');
  const u64 gib = 1ull << 30;
  std::memcpy(buf.data(), &gib, 8);
  std::string s;
  AllocationWatch watch;
  InputArchive in(buf.data(), buf.size());
  in(s);
  const std::size_t largest = watch.Largest();
  CHECK(in.code() == ErrorCode::kTruncated);
  CHECK(largest < 1024);
  CHECK(s.empty());
  const std::string msg = in.status().ToString();
  CHECK(msg.find("string length at offset 0") != std::string::npos);
  CHECK(msg.find("1073741824") != std::string::npos);

  // Counts whose byte size overflows 64 bits, or exceeds the input, for vectors.
  const u64 huge = 1ull << 62;
  std::memcpy(buf.data(), &huge, 8);
  std::vector<u64> wide;
  InputArchive in2(buf.data(), buf.size());
  in2(wide);
  CHECK(in2.code() == ErrorCode::kTooLarge);
  std::vector<std::string> huge_strings;
  InputArchive in3(buf.data(), buf.size());
  in3(huge_strings);
  CHECK(in3.code() == ErrorCode::kTooLarge);
  const u64 many = 1ull << 40;
  std::memcpy(buf.data(), &many, 8);
  std::vector<std::string> many_strings;
  InputArchive in4(buf.data(), buf.size());
  AllocationWatch watch2;
  in4(many_strings);
  CHECK(watch2.Largest() < 1024);
  CHECK(in4.code() == ErrorCode::kTruncated);
}

// ---- Batches ----

namespace {

/**
 * Decodes a record with layout `kind` and, when it decodes cleanly and exactly,
 * re-encodes the values: the format is canonical, so the bytes must come back.
 * Returns false only when that re-encoding differs.
 */
bool DecodeIsCanonical(InputArchive &ar, int kind) {
  std::vector<char> again;
  OutputArchive out(again);
  switch (kind) {
    case 0: { u32 a = 0; u64 b = 0; ar(a, b); out(a, b); break; }
    case 1: { std::string s; ar(s); out(s); break; }
    case 2: { PoolQuery q; TaskNode n; ar(q, n); out(q, n); break; }
    case 3: { std::vector<int> v; ar(v); out(v); break; }
    default: { Mixed m; ar(m); out(m); break; }
  }
  if (!ar.ok() || ar.Remaining() != 0) return true;
  return again.size() == ar.Size() && std::memcmp(again.data(), ar.Data(), again.size()) == 0;
}

}  // namespace

TEST_CASE("a record that does not fit is dropped whole and the batch stays valid") {
  std::vector<char> mem(200 + 8, '\x77');  // canary bytes after the capacity
  BatchWriter w(mem.data(), 200);
  CHECK(w.Append([](OutputArchive &ar) { ar(u64{1}, u64{2}); }));  // 24 + 8 + 16 = 48 bytes
  CHECK(w.ok());
  const u64 after_first = w.Size();
  CHECK(after_first == 48);
  CHECK_FALSE(w.Append([](OutputArchive &ar) { ar(std::string(500, 'x')); }));
  CHECK_FALSE(w.ok());
  CHECK(w.status().code() == ErrorCode::kTooLarge);
  CHECK(w.Count() == 1);
  CHECK(w.Size() == after_first);
  CHECK(w.Append([](OutputArchive &ar) { ar(u32{3}); }));  // a smaller record still fits
  CHECK(w.ok());
  CHECK(w.Count() == 2);
  for (u64 k = 200; k < mem.size(); ++k) CHECK(mem[k] == '\x77');

  // A serialize() failure drops the record the same way.
  CHECK_FALSE(w.Append([](OutputArchive &ar) { ar(u8{1}); ar.Fail(ErrorCode::kInvalidArgument, "no"); }));
  CHECK(w.status().code() == ErrorCode::kInvalidArgument);
  CHECK(w.Count() == 2);

  BatchReader r;
  REQUIRE(r.Open(w.Data(), w.Size()).ok());
  CHECK(r.Count() == 2);
  InputArchive rec;
  u64 a = 0, b = 0;
  u32 c = 0;
  REQUIRE(r.Next(rec));
  rec(a, b);
  REQUIRE(r.Next(rec));
  rec(c);
  CHECK_FALSE(r.Next(rec));
  CHECK((a == 1 && b == 2 && c == 3));

  char tiny[10];
  BatchWriter none(tiny, sizeof(tiny));  // not even the header fits
  CHECK_FALSE(none.ok());
  CHECK_FALSE(none.Append([](OutputArchive &ar) { ar(u8{1}); }));
  CHECK(none.status().code() == ErrorCode::kTooLarge);
  CHECK(none.Count() == 0);
  CHECK_FALSE(none.EndRecord());
}

TEST_CASE("a record read with the wrong layout fails alone and cannot reach the next record") {
  std::vector<char> bytes;
  BatchWriter w(bytes);
  w.Append([](OutputArchive &ar) { ar(u32{0xdeadbeef}); });
  w.Append([](OutputArchive &ar) { ar(u64{12345}); });
  BatchReader r;
  REQUIRE(r.Open(bytes.data(), bytes.size()).ok());
  InputArchive rec;
  REQUIRE(r.Next(rec));
  u64 wrong = 0;
  rec(wrong);  // 8 bytes asked from a 4-byte record
  CHECK(rec.code() == ErrorCode::kTruncated);
  CHECK(wrong == 0);
  // Offsets in record errors count from the batch start: header 24 + prefix 8.
  CHECK(rec.status().ToString().find("offset 32") != std::string::npos);
  REQUIRE(r.Next(rec));
  u64 right = 0;
  rec(right);
  CHECK(rec.ok());
  CHECK(right == 12345);
}

TEST_CASE("BatchReader::Open rejects bad headers and framing with the right code") {
  const std::vector<char> good = BuildBatch(3);
  auto open_with = [&](const std::function<void(std::vector<char> &)> &edit) {
    std::vector<char> b = good;
    edit(b);
    BatchReader r;
    chi::Status st = r.Open(b.data(), b.size());
    CHECK(r.Count() == (st.ok() ? 3u : 0u));
    InputArchive rec;
    if (!st.ok()) CHECK_FALSE(r.Next(rec));
    return st;
  };
  auto put32 = [](std::vector<char> &b, u64 at, u32 v) { std::memcpy(b.data() + at, &v, 4); };
  auto put64 = [](std::vector<char> &b, u64 at, u64 v) { std::memcpy(b.data() + at, &v, 8); };

  CHECK(open_with([](std::vector<char> &) {}).ok());
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 0, 0x12345678); }).code() == ErrorCode::kMalformed);
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 4, 2); }).code() == ErrorCode::kVersionMismatch);
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 12, 1); }).code() == ErrorCode::kMalformed);
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 8, 4); }).code() == ErrorCode::kTruncated);
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 8, 2); }).code() == ErrorCode::kMalformed);
  CHECK(open_with([&](std::vector<char> &b) { put64(b, 16, 1ull << 40); }).code() == ErrorCode::kTruncated);
  CHECK(open_with([&](std::vector<char> &b) { put64(b, 24, 1ull << 40); }).code() == ErrorCode::kTruncated);
  CHECK(open_with([&](std::vector<char> &b) { put32(b, 8, ~0u); }).code() == ErrorCode::kTruncated);

  // Unrelated bytes after a batch are not part of it; Size() says where it ends.
  std::vector<char> more = good;
  more.insert(more.end(), {'n', 'e', 'x', 't'});
  BatchReader r;
  REQUIRE(r.Open(more.data(), more.size()).ok());
  CHECK(r.Size() == good.size());

  chi::Status empty = r.Open(nullptr, 0);
  CHECK(empty.code() == ErrorCode::kTruncated);
  CHECK(empty.ToString().find("batch header") != std::string::npos);
}

// ---- Fuzzing: flipped bits and truncations never crash or over-read ----

TEST_CASE("every truncation of a valid batch is rejected by Open as truncated") {
  const std::vector<char> bytes = BuildBatch(40);
  for (u64 len = 0; len < bytes.size(); ++len) {
    std::vector<char> cut = Prefix(bytes, len);
    BatchReader r;
    chi::Status st = r.Open(cut.data(), cut.size());
    if (st.code() != ErrorCode::kTruncated) {
      CAPTURE(len);
      CHECK(st.code() == ErrorCode::kTruncated);
    }
  }
}

TEST_CASE("thousands of random bit flips in a batch never crash, over-read or over-allocate") {
  const std::vector<char> bytes = BuildBatch(40);
  std::mt19937_64 rng(20261122);
  int opened = 0, rejected = 0, record_errors = 0, non_canonical = 0, bad_count = 0;
  std::size_t largest = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    std::vector<char> b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const u64 bit = rng() % (b.size() * 8);
      b[bit / 8] = static_cast<char>(b[bit / 8] ^ (1 << (bit % 8)));
    }
    if (iter % 4 == 0) b.resize(rng() % (b.size() + 1));  // flipped and truncated
    b.shrink_to_fit();
    AllocationWatch watch;
    BatchReader r;
    if (!r.Open(b.data(), b.size()).ok()) {
      ++rejected;
      continue;
    }
    ++opened;
    InputArchive rec;
    u32 n = 0;
    while (r.Next(rec)) {
      for (int kind = 0; kind < kKinds; ++kind) {
        InputArchive again(rec.Data(), rec.Size());
        non_canonical += !DecodeIsCanonical(again, kind);
        record_errors += !again.ok();
      }
      ++n;
    }
    bad_count += n != r.Count();
    largest = std::max(largest, watch.Largest());
  }
  MESSAGE("bit flips: opened ", opened, ", rejected ", rejected, ", record decode failures ",
          record_errors);
  CHECK(opened > 0);
  CHECK(rejected > 0);
  CHECK(record_errors > 0);
  CHECK(non_canonical == 0);
  CHECK(bad_count == 0);
  // Allocations stay in proportion to the input (the batch is a few KiB).
  CHECK(largest < 8 * bytes.size());
}

TEST_CASE("random bytes decoded with every layout never crash and fail cleanly") {
  std::mt19937_64 rng(7);
  int failures = 0, non_canonical = 0;
  std::size_t largest = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<char> b(rng() % 200);
    for (char &c : b) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 3);  // many small lengths
    AllocationWatch watch;
    for (int kind = 0; kind < kKinds; ++kind) {
      InputArchive in(b.data(), b.size());
      non_canonical += !DecodeIsCanonical(in, kind);
      failures += !in.ok();
      if (!in.ok()) CHECK(in.status().message()[0] != '\0');
    }
    largest = std::max(largest, watch.Largest());
  }
  CHECK(failures > 0);
  CHECK(non_canonical == 0);
  CHECK(largest < 8 * 1024);
}
