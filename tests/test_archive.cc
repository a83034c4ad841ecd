// Serialization archives and batches, round trips: every supported type (scalars, enums,
// nested structs and C arrays, strings, vectors, ids, every PoolQuery) decodes back equal
// from the documented little-endian layout, the growing and fixed output modes agree, and
// batches of records read back in order. Hostile input is in test_archive_errors.cc.
// Also built as test_archive_asan.
#include <doctest/doctest.h>

#include <chi/core/ids.h>
#include <chi/core/pool_query.h>
#include <chi/serialize/archive.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "archive_test_support.h"  // Color, Flag, Inner, Mixed, Encode, batch records

using archive_test::AllQueries;
using archive_test::BuildBatch;
using archive_test::Color;
using archive_test::Encode;
using archive_test::Flag;
using archive_test::Inner;
using archive_test::kKinds;
using archive_test::Mixed;
using archive_test::SampleMixed;
using archive_test::WriteRecord;
using chi::BatchReader;
using chi::BatchWriter;
using chi::InputArchive;
using chi::OutputArchive;
using chi::PoolId;
using chi::PoolQuery;
using chi::TaskNode;
using chi::u16;
using chi::u32;
using chi::u64;
using chi::u8;

namespace {

// ---- Types under test (the shared ones are in archive_test_support.h) ----

/** An eight-byte signed enum, with a negative and a wide value. */
enum class Wide : std::int64_t { kLow = -5, kHigh = 1ll << 40 };
/** A plain (unscoped) two-byte enum. */
enum Plain : u16 { kPlainA = 7, kPlainB = 65535 };

/** Nested structs, C arrays of structs, scalars, bools and chars, an enum and a PoolId. */
struct Outer {
  Inner inner_;
  Inner many_[3];
  int grid_[3][2] = {};
  bool flags_[4] = {};
  char name_[8] = {};
  Color color_ = Color::kRed;
  PoolId pool_;
  bool operator==(const Outer &) const = default;
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(inner_, many_, grid_, flags_, name_, color_, pool_);
  }
};

/** Encodes value, decodes it into a fresh T, and checks it comes back equal and whole. */
template <typename T>
void CheckRoundTrip(const T &value) {
  std::vector<char> bytes = Encode(value);
  T back{};
  InputArchive in(bytes.data(), bytes.size());
  in(back);
  CHECK(in.ok());
  CHECK(in.Remaining() == 0);
  CHECK(back == value);
}

/** Bitwise equality: tells -0.0 from 0.0 and compares NaNs. */
template <typename T>
bool SameBits(const T &a, const T &b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace

// ---- Round trips ----

TEST_CASE("every arithmetic type round-trips bit-exactly at its natural size") {
  bool t = true, f = false;
  char c = 'z';
  signed char sc = -128;
  unsigned char uc = 255;
  char16_t c16 = u'\xffff';
  char32_t c32 = U'\U0010ffff';
  wchar_t wc = L'w';
  short s = std::numeric_limits<short>::min();
  unsigned short us = 65535;
  int i = std::numeric_limits<int>::min();
  unsigned ui = ~0u;
  long l = std::numeric_limits<long>::min();
  unsigned long ul = ~0ul;
  long long ll = std::numeric_limits<long long>::max();
  unsigned long long ull = ~0ull;
  float fl = -0.0f, fnan = std::numeric_limits<float>::quiet_NaN();
  double d = std::numeric_limits<double>::denorm_min(), dinf = -HUGE_VAL;
  std::vector<char> bytes = Encode(t, f, c, sc, uc, c16, c32, wc, s, us, i, ui, l, ul, ll, ull,
                                   fl, fnan, d, dinf);
  CHECK(bytes.size() == 2 + 3 + sizeof(c16) + sizeof(c32) + sizeof(wc) + 2 * sizeof(short) +
                            2 * sizeof(int) + 2 * sizeof(long) + 2 * sizeof(long long) +
                            2 * sizeof(float) + 2 * sizeof(double));

  bool t2 = false, f2 = true;
  char c2 = 0;
  signed char sc2 = 0;
  unsigned char uc2 = 0;
  char16_t c162 = 0;
  char32_t c322 = 0;
  wchar_t wc2 = 0;
  short s2 = 0;
  unsigned short us2 = 0;
  int i2 = 0;
  unsigned ui2 = 0;
  long l2 = 0;
  unsigned long ul2 = 0;
  long long ll2 = 0;
  unsigned long long ull2 = 0;
  float fl2 = 1, fnan2 = 0;
  double d2 = 0, dinf2 = 0;
  InputArchive in(bytes.data(), bytes.size());
  in(t2, f2, c2, sc2, uc2, c162, c322, wc2, s2, us2, i2, ui2, l2, ul2, ll2, ull2, fl2, fnan2, d2,
     dinf2);
  REQUIRE(in.ok());
  CHECK(in.Remaining() == 0);
  CHECK((t2 && !f2));
  CHECK((c2 == c && sc2 == sc && uc2 == uc && c162 == c16 && c322 == c32 && wc2 == wc));
  CHECK((s2 == s && us2 == us && i2 == i && ui2 == ui && l2 == l && ul2 == ul));
  CHECK((ll2 == ll && ull2 == ull));
  CHECK(SameBits(fl2, fl));  // -0.0 keeps its sign
  CHECK(SameBits(fnan2, fnan));
  CHECK(std::isnan(fnan2));
  CHECK(d2 == d);
  CHECK(dinf2 == dinf);
}

TEST_CASE("scalars are written as their in-memory little-endian bytes") {
  std::vector<char> bytes = Encode(u32{0x04030201}, u16{0x0605}, true);
  REQUIRE(bytes.size() == 7);
  const u8 expect[] = {1, 2, 3, 4, 5, 6, 1};
  CHECK(std::memcmp(bytes.data(), expect, sizeof(expect)) == 0);
}

TEST_CASE("enums travel as their underlying type and keep out-of-range values") {
  std::vector<char> bytes = Encode(Color::kBlue, Wide::kHigh, Wide::kLow, kPlainB, Flag::kOn,
                                   static_cast<Color>(200));
  CHECK(bytes.size() == 1 + 8 + 8 + 2 + 1 + 1);
  Color c{};
  Wide w1{}, w2{};
  Plain p{};
  Flag fl{};
  Color odd{};
  InputArchive in(bytes.data(), bytes.size());
  in(c, w1, w2, p, fl, odd);
  REQUIRE(in.ok());
  CHECK(c == Color::kBlue);
  CHECK(w1 == Wide::kHigh);
  CHECK(w2 == Wide::kLow);
  CHECK(p == kPlainB);
  CHECK(fl == Flag::kOn);
  CHECK(static_cast<u8>(odd) == 200);
}

TEST_CASE("nested structs and C arrays round-trip without length prefixes") {
  Outer o;
  o.inner_ = {9, {1.5, -2.5}};
  for (int k = 0; k < 3; ++k) o.many_[k] = {static_cast<u16>(k), {k * 1.0, k * 2.0}};
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 2; ++c) o.grid_[r][c] = r * 10 + c;
  o.flags_[1] = o.flags_[3] = true;
  std::memcpy(o.name_, "abcdefg", 8);
  o.color_ = Color::kGreen;
  o.pool_ = PoolId(200, 3);
  std::vector<char> bytes = Encode(o);
  const u64 inner_bytes = 2 + 16;
  CHECK(bytes.size() == 4 * inner_bytes + 6 * 4 + 4 + 8 + 1 + 8);
  CheckRoundTrip(o);
}

TEST_CASE("strings round-trip: empty, one byte, 1 MiB of every byte value, and views") {
  std::string big(1 << 20, '\0');
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<char>(k * 31 + 7);
  for (const std::string &s : {std::string(), std::string("x"), big}) {
    CAPTURE(s.size());
    std::vector<char> bytes = Encode(s);
    CHECK(bytes.size() == chi::kLengthPrefixBytes + s.size());
    CheckRoundTrip(s);
  }
  std::string_view view = "view me";
  std::vector<char> bytes = Encode(view, std::string("also"));
  std::string as_string;
  std::string_view as_view;
  InputArchive in(bytes.data(), bytes.size());
  in(as_string, as_view);
  REQUIRE(in.ok());
  CHECK(as_string == "view me");
  CHECK(as_view == "also");
  // A decoded string_view points into the input buffer (zero copy).
  CHECK(as_view.data() == bytes.data() + bytes.size() - 4);
}

TEST_CASE("vectors round-trip: numbers in bulk, strings, structs, bools, empty") {
  std::vector<int> ints = {1, -2, 3, 1 << 30};
  std::vector<std::string> strs = {"", "a", std::string(300, 'q'), "end"};
  std::vector<Inner> inners = {{1, {2, 3}}, {4, {5, 6}}};
  std::vector<bool> bits = {true, false, true, true};
  std::vector<double> none;
  std::vector<std::vector<u16>> nested = {{1, 2}, {}, {3}};
  std::vector<char> bytes = Encode(ints);
  CHECK(bytes.size() == 8 + 4 * sizeof(int));
  CheckRoundTrip(ints);
  CheckRoundTrip(strs);
  CheckRoundTrip(inners);
  CheckRoundTrip(bits);
  CheckRoundTrip(none);
  CheckRoundTrip(nested);
}

TEST_CASE("PoolId, TaskNode, TaskId and every PoolQuery factory survive the archive") {
  CheckRoundTrip(PoolId(200, 7));
  CheckRoundTrip(chi::kAdminPoolId);
  CheckRoundTrip(TaskNode(1ull << 50, 3));
  chi::TaskId id{4, 1234, 1ull << 60};
  CheckRoundTrip(id);
  for (const PoolQuery &q : AllQueries()) {
    CAPTURE(q.ToString());
    std::vector<char> bytes = Encode(q);
    CHECK(bytes.size() == 16);  // mode u32, count u32, value u64
    CheckRoundTrip(q);
  }
}

TEST_CASE("the growing mode appends to what the vector holds and matches the fixed mode") {
  Outer o;
  o.pool_ = PoolId(5, 6);
  std::vector<char> grown = {'h', 'd', 'r'};
  OutputArchive g(grown);
  g(o, std::string("tail"), u64{42});
  REQUIRE(g.ok());
  CHECK(grown.size() == 3 + g.Size());
  CHECK(std::string(grown.data(), 3) == "hdr");

  std::vector<char> fixed(g.Size());
  OutputArchive f(fixed.data(), fixed.size());
  f(o, std::string("tail"), u64{42});
  REQUIRE(f.ok());
  CHECK(f.Size() == fixed.size());
  CHECK(std::memcmp(fixed.data(), grown.data() + 3, fixed.size()) == 0);
}

// ---- Batches ----

namespace {

/** Reads record i with layout `kind` and checks it against what WriteRecord wrote. */
bool RecordMatches(InputArchive &ar, int i, int kind) {
  const auto &qs = AllQueries();
  switch (kind) {
    case 0: {
      u32 a = 0;
      u64 b = 0;
      ar(a, b);
      return ar.ok() && a == static_cast<u32>(i) && b == static_cast<u64>(i) * i;
    }
    case 1: {
      std::string s;
      ar(s);
      return ar.ok() && s == std::string(static_cast<std::size_t>(i % 50), static_cast<char>('a' + i % 26));
    }
    case 2: {
      PoolQuery q;
      TaskNode n;
      ar(q, n);
      return ar.ok() && q == qs[static_cast<std::size_t>(i) % qs.size()] &&
             n == TaskNode(static_cast<u64>(i), i + 1);
    }
    case 3: {
      std::vector<int> v;
      ar(v);
      return ar.ok() && v == std::vector<int>(static_cast<std::size_t>(i % 20), i);
    }
    default: {
      Mixed want = SampleMixed();
      want.b_ = i;
      want.f_ = std::to_string(i);
      Mixed m;
      ar(m);
      return ar.ok() && m == want;
    }
  }
}

}  // namespace

TEST_CASE("a batch of 1000 records of varying types reads back equal, in order") {
  const std::vector<char> bytes = BuildBatch(1000);
  u32 declared = 0;
  std::memcpy(&declared, bytes.data() + 8, 4);
  CHECK(declared == 1000);

  // The fixed-buffer writer produces the same bytes.
  std::vector<char> fixed(bytes.size());
  BatchWriter fw(fixed.data(), fixed.size());
  for (int i = 0; i < 1000; ++i) {
    fw.BeginRecord();
    WriteRecord(fw.BeginRecord(), i, i % kKinds);  // a second Begin drops the empty open one
    REQUIRE(fw.EndRecord());
  }
  CHECK(fw.Count() == 1000);
  CHECK(fw.Size() == fixed.size());
  CHECK(fixed == bytes);

  BatchReader r;
  REQUIRE(r.Open(bytes.data(), bytes.size()).ok());
  CHECK(r.Count() == 1000);
  CHECK(r.Size() == bytes.size());
  InputArchive rec;
  int seen = 0, good = 0;
  while (r.Next(rec)) {
    good += RecordMatches(rec, seen, seen % kKinds) && rec.Remaining() == 0;
    ++seen;
  }
  CHECK(seen == 1000);
  CHECK(good == 1000);
  CHECK(r.Index() == 1000);
}

TEST_CASE("an empty batch is a valid 24-byte batch with no records") {
  std::vector<char> bytes;
  BatchWriter w(bytes);
  CHECK(w.Count() == 0);
  CHECK(bytes.size() == chi::kBatchHeaderBytes);
  BatchReader r;
  REQUIRE(r.Open(bytes.data(), bytes.size()).ok());
  InputArchive rec;
  CHECK_FALSE(r.Next(rec));
  CHECK(r.Count() == 0);
}
