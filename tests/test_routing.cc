// Routing in one process: every PoolQuery mode reaches exactly the containers
// it names, fan-out results are aggregated, and bad selectors are errors.
#include "embedded_fixture.h"

#include <functional>
#include <vector>

using chi::PoolQuery;

namespace {

chimaera::demo::Client &FourContainers() {
  static chimaera::demo::Client c = chi_test::MakeDemoPool("routing4", chi::PoolId(210, 0), 4);
  return c;
}

}  // namespace

TEST_CASE("DirectHash spreads 10^4 keys over 4 containers within 20% of even") {
  auto &client = FourContainers();
  int per[4] = {0, 0, 0, 0};
  std::vector<chi::Future<chimaera::demo::CustomTask>> fs;
  for (int i = 0; i < 10000; ++i) {
    const chi::u64 h = std::hash<std::string>()("key-" + std::to_string(i));
    fs.push_back(client.AsyncCustom(PoolQuery::DirectHash(h), ""));
    if (fs.size() == 512 || i == 9999) {
      REQUIRE(chi::WaitAll(fs, 30));
      for (auto &f : fs) {
        REQUIRE(f->GetReturnCode() == 0);
        REQUIRE(f->visits_ == 1);
        for (int c = 0; c < 4; ++c) per[c] += (f->visited_mask_ >> c) & 1;
      }
      fs.clear();
    }
  }
  for (int c = 0; c < 4; ++c) {
    CAPTURE(c);
    CHECK(per[c] >= 2000);
    CHECK(per[c] <= 3000);
  }
  CHECK(per[0] + per[1] + per[2] + per[3] == 10000);
}

TEST_CASE("DirectHash of one key always lands on hash % containers") {
  auto &client = FourContainers();
  for (chi::u64 h : {0ull, 1ull, 2ull, 3ull, 4ull, 7ull, 1000003ull}) {
    auto f = client.AsyncCustom(PoolQuery::DirectHash(h), "x");
    REQUIRE(f.Wait(30));
    CHECK(f->visited_mask_ == (1ull << (h % 4)));
  }
}

TEST_CASE("Broadcast reaches every container exactly once and echoes the data") {
  auto &client = FourContainers();
  for (int round = 0; round < 20; ++round) {
    auto f = client.AsyncCustom(PoolQuery::Broadcast(), "hello");
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->visits_ == 4);
    CHECK(f->visited_mask_ == 0xF);
    CHECK(f->data_.view() == "hello");
  }
}

TEST_CASE("Range and DirectId hit exactly the named containers") {
  auto &client = FourContainers();
  struct Case {
    PoolQuery q;
    chi::u64 mask;
    chi::u32 visits;
  };
  for (const Case &c : {Case{PoolQuery::Range(1, 2), 0x6, 2}, Case{PoolQuery::Range(0, 4), 0xF, 4},
                        Case{PoolQuery::Range(3, 1), 0x8, 1}, Case{PoolQuery::DirectId(0), 0x1, 1},
                        Case{PoolQuery::DirectId(3), 0x8, 1}}) {
    CAPTURE(c.q.ToString());
    auto f = client.AsyncCustom(c.q, "r");
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->visited_mask_ == c.mask);
    CHECK(f->visits_ == c.visits);
  }
}

TEST_CASE("Local and Physical(this node) reach the first local container") {
  auto &client = FourContainers();
  for (PoolQuery q : {PoolQuery::Local(), PoolQuery::Physical(0), PoolQuery::ToLocalCpu()}) {
    CAPTURE(q.ToString());
    auto f = client.AsyncCustom(q, "l");
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->visited_mask_ == 0x1);
  }
}

TEST_CASE("Dynamic goes through the container's Monitor(kGlobalSchedule)") {
  auto &client = FourContainers();
  for (int i = 0; i < 16; ++i) {
    auto f = client.AsyncCustom(PoolQuery::Dynamic(), "d");
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->via_monitor_ == 1);
    CHECK(f->visited_mask_ == (1ull << (f->task_node_.major_ % 4)));
  }
}

TEST_CASE("selectors outside the pool are errors that name the problem") {
  auto &client = FourContainers();
  for (PoolQuery q : {PoolQuery::DirectId(4), PoolQuery::Range(3, 2), PoolQuery::Physical(9),
                      PoolQuery::Null(), PoolQuery::ToLocalGpu(0)}) {
    CAPTURE(q.ToString());
    auto f = client.AsyncCustom(q, "e");
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() != 0);
    CHECK(std::string(f->GetMessage()).find("210.0") != std::string::npos);
  }
}

TEST_CASE("a pool keeps serving after routing errors") {
  auto &client = FourContainers();
  auto bad = client.AsyncCustom(PoolQuery::DirectId(99), "x");
  REQUIRE(bad.Wait(30));
  CHECK(bad->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kInvalidArgument));
  auto good = client.AsyncCustom(PoolQuery::DirectId(2), "y");
  REQUIRE(good.Wait(30));
  CHECK(good->GetReturnCode() == 0);
  CHECK(good->visited_mask_ == 0x4);
}

TEST_CASE("the pool table finds each of hundreds of pools by id and forgets destroyed ones") {
  chi::PoolManager pools;
  std::vector<chi::PoolId> ids;
  // Ids that share a major, share a minor, and sit far apart: every probe chain is tried.
  for (chi::u32 i = 0; i < 100; ++i) ids.push_back(chi::PoolId(500, i));
  for (chi::u32 i = 0; i < 100; ++i) ids.push_back(chi::PoolId(600 + i, 7));
  for (chi::u32 i = 0; i < 100; ++i) ids.push_back(chi::PoolId(0xffff0000u + i * 977, i));
  for (size_t k = 0; k < ids.size(); ++k) {
    std::unique_ptr<chi::PoolInfo> info;
    REQUIRE(pools.PreparePool(chimaera::demo::kModuleName, "table" + std::to_string(k), ids[k],
                              1, &info).ok());
    REQUIRE(pools.CommitPool(std::move(info)).ok());
    // Every pool committed so far is found (the index is rebuilt as the table grows).
    for (size_t j = 0; j <= k; j += 37) CHECK(pools.Contains(ids[j]));
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    chi::PoolInfo *p = pools.Acquire(ids[k]);
    REQUIRE(p != nullptr);
    CHECK(p->id_ == ids[k]);
    pools.Release(p);
  }
  CHECK(pools.Acquire(chi::PoolId(500, 100)) == nullptr);
  CHECK(pools.Acquire(chi::PoolId(777, 777)) == nullptr);
  for (size_t k = 0; k < ids.size(); k += 2) {  // destroy every other pool
    chi::Status st;
    chi::PoolInfo *p = pools.BeginDestroy(ids[k], &st);
    REQUIRE(p != nullptr);
    CHECK(pools.Acquire(ids[k]) == nullptr);  // refused while it is destroyed
    pools.FinishDestroy(p);
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    CAPTURE(k);
    CHECK(pools.Contains(ids[k]) == (k % 2 == 1));
    chi::PoolInfo *p = pools.Acquire(ids[k]);
    CHECK((p != nullptr) == (k % 2 == 1));
    if (p != nullptr) {
      CHECK(p->id_ == ids[k]);
      pools.Release(p);
    }
  }
}
