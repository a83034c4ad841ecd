// Serialization archives and batches: round trips of every supported type, and
// hostile input (truncation, bit flips, forged lengths) that must fail cleanly.
// Also built as test_archive_asan: every decode below reads from an exact-size
// heap copy, so any read past the input is caught by AddressSanitizer.
#include <doctest/doctest.h>

#include <chi/core/ids.h>
#include <chi/core/pool_query.h>
#include <chi/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using chi::BatchReader;
using chi::BatchWriter;
using chi::ErrorCode;
using chi::InputArchive;
using chi::OutputArchive;
using chi::PoolId;
using chi::PoolQuery;
using chi::TaskNode;
using chi::u16;
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

// ---- Types under test ----

enum class Color : u8 { kRed = 1, kGreen = 2, kBlue = 3 };
enum class Wide : std::int64_t { kLow = -5, kHigh = 1ll << 40 };
enum Plain : u16 { kPlainA = 7, kPlainB = 65535 };
enum class Flag : bool { kOff = false, kOn = true };

struct Inner {
  u16 a_ = 0;
  double b_[2] = {0, 0};
  bool operator==(const Inner &) const = default;
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(a_, b_);
  }
};

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

const std::vector<PoolQuery> &AllQueries() {
  static const std::vector<PoolQuery> all = {
      PoolQuery::Null(),          PoolQuery::Local(),         PoolQuery::Dynamic(),
      PoolQuery::DirectId(7),     PoolQuery::DirectHash(~0ull), PoolQuery::Range(3, 9),
      PoolQuery::Broadcast(),     PoolQuery::Physical(2),     PoolQuery::LocalGpuBcast(),
      PoolQuery::ToLocalGpu(1),   PoolQuery::ToLocalCpu()};
  return all;
}

/** Serializes args into a growing vector. */
template <typename... Args>
std::vector<char> Encode(const Args &...args) {
  std::vector<char> out;
  OutputArchive ar(out);
  ar(args...);
  REQUIRE(ar.ok());
  REQUIRE(ar.Size() == out.size());
  return out;
}

/** An exact-size heap copy of the first len bytes, so ASan sees any over-read. */
std::vector<char> Prefix(const std::vector<char> &bytes, u64 len) {
  return std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len));
}

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

namespace {

struct Mixed {
  u8 a_ = 0;
  std::int32_t b_ = 0;
  double c_ = 0;
  bool d_ = false;
  Color e_ = Color::kRed;
  std::string f_;
  std::vector<int> g_;
  PoolQuery h_;
  TaskNode i_;
  int j_[3] = {};
  std::vector<std::string> k_;
  Inner l_;
  bool operator==(const Mixed &) const = default;
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(a_, b_, c_, d_, e_, f_, g_, h_, i_, j_, k_, l_);
  }
};

Mixed SampleMixed() {
  Mixed m;
  m.a_ = 7;
  m.b_ = -12345;
  m.c_ = 3.25;
  m.d_ = true;
  m.e_ = Color::kBlue;
  m.f_ = "hello";
  m.g_ = {1, 2, 3};
  m.h_ = PoolQuery::Range(2, 5);
  m.i_ = TaskNode(77, 8);
  m.j_[0] = 1;
  m.j_[2] = 3;
  m.k_ = {"x", "yz"};
  m.l_ = {4, {0.5, 0.25}};
  return m;
}

}  // namespace

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

constexpr int kKinds = 5;

/** Record i of a test batch: its kind (i % kKinds) picks one of five layouts. */
void WriteRecord(OutputArchive &ar, int i, int kind) {
  const auto &qs = AllQueries();
  switch (kind) {
    case 0: ar(static_cast<u32>(i), static_cast<u64>(i) * i); break;
    case 1: ar(std::string(static_cast<std::size_t>(i % 50), static_cast<char>('a' + i % 26))); break;
    case 2: ar(qs[static_cast<std::size_t>(i) % qs.size()], TaskNode(static_cast<u64>(i), i + 1)); break;
    case 3: ar(std::vector<int>(static_cast<std::size_t>(i % 20), i)); break;
    default: {
      Mixed m = SampleMixed();
      m.b_ = i;
      m.f_ = std::to_string(i);
      ar(m);
    }
  }
}

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

std::vector<char> BuildBatch(int records) {
  std::vector<char> bytes;
  BatchWriter w(bytes);
  for (int i = 0; i < records; ++i) {
    REQUIRE(w.Append([&](OutputArchive &ar) { WriteRecord(ar, i, i % kKinds); }));
  }
  REQUIRE(w.Count() == static_cast<u32>(records));
  REQUIRE(w.Size() == bytes.size());
  return bytes;
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
