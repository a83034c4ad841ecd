// Shared parts of the archive tests (test_archive.cc: round trips; test_archive_errors.cc:
// hostile input): the types both serialize, the encoder, and the batch of mixed records
// both build. Included by one test file per binary.
#pragma once

#include <doctest/doctest.h>

#include <chi/core/ids.h>
#include <chi/core/pool_query.h>
#include <chi/serialize/archive.h>

#include <cstdint>  // Mixed's int32_t field
#include <string>   // Mixed's strings, record kind 1
#include <vector>   // encoded bytes, Mixed's vectors, record kind 3

namespace archive_test {

using chi::BatchWriter;
using chi::OutputArchive;
using chi::PoolQuery;
using chi::TaskNode;
using chi::u16;
using chi::u32;
using chi::u64;
using chi::u8;

// ---- Types under test ----

/** A one-byte scoped enum; 200 stands for a value outside its enumerators. */
enum class Color : u8 { kRed = 1, kGreen = 2, kBlue = 3 };
/** A bool-based enum: its byte must be 0 or 1 like a bool's. */
enum class Flag : bool { kOff = false, kOn = true };

/** A small struct of a scalar and a C array, nested in the larger types below. */
struct Inner {
  u16 a_ = 0;
  double b_[2] = {0, 0};
  bool operator==(const Inner &) const = default;
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(a_, b_);
  }
};

/** One field of every kind the archive handles, for multi-field buffers and batch records. */
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

/** A Mixed with every field set away from its default. */
inline Mixed SampleMixed() {
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

/** One PoolQuery from every factory. */
inline const std::vector<PoolQuery> &AllQueries() {
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

// ---- Batches ----

/** The number of record layouts a test batch cycles through. */
inline constexpr int kKinds = 5;

/** Record i of a test batch: its kind (i % kKinds) picks one of five layouts. */
inline void WriteRecord(OutputArchive &ar, int i, int kind) {
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

/** A valid batch of `records` records written by WriteRecord, in a growing vector. */
inline std::vector<char> BuildBatch(int records) {
  std::vector<char> bytes;
  BatchWriter w(bytes);
  for (int i = 0; i < records; ++i) {
    REQUIRE(w.Append([&](OutputArchive &ar) { WriteRecord(ar, i, i % kKinds); }));
  }
  REQUIRE(w.Count() == static_cast<u32>(records));
  REQUIRE(w.Size() == bytes.size());
  return bytes;
}

}  // namespace archive_test
