// PoolId and PoolQuery: textual round trips, rejection of bad text, invariants.
#include <doctest/doctest.h>

#include <chi/core/pool_query.h>

#include <vector>

using chi::PoolId;
using chi::PoolQuery;

TEST_CASE("every PoolQuery factory survives ToString -> FromString") {
  std::vector<PoolQuery> all = {
      PoolQuery::Null(),          PoolQuery::Local(),          PoolQuery::Dynamic(),
      PoolQuery::DirectId(7),     PoolQuery::DirectHash(1ull << 40), PoolQuery::Range(3, 9),
      PoolQuery::Broadcast(),     PoolQuery::Physical(2),      PoolQuery::LocalGpuBcast(),
      PoolQuery::ToLocalGpu(1),   PoolQuery::ToLocalCpu()};
  for (const PoolQuery &q : all) {
    CAPTURE(q.ToString());
    PoolQuery back = PoolQuery::FromString(q.ToString());
    CHECK(back == q);
    CHECK(back.IsValid());
  }
  CHECK(PoolQuery::FromString("direct_hash:7").GetHash() == 7);
  CHECK(PoolQuery::FromString("range:2:5").GetRangeOffset() == 2);
  CHECK(PoolQuery::FromString("range:2:5").GetRangeCount() == 5);
}

TEST_CASE("invalid PoolQuery strings are rejected with a message naming the text") {
  for (const char *bad : {"", "locall", "direct_id", "direct_id:", "direct_id:x", "range:1",
                          "range:1:0", "direct_id:99999999999", "broadcast:3", "to_local_gpu:-1",
                          "physical:1:2"}) {
    CAPTURE(bad);
    PoolQuery q;
    chi::Status st = PoolQuery::Parse(bad, &q);
    CHECK_FALSE(st.ok());
    CHECK(st.code() == chi::ErrorCode::kInvalidArgument);
    CHECK(std::string(st.message()).find("pool query") != std::string::npos);
    CHECK_THROWS_AS(PoolQuery::FromString(bad), chi::Error);
  }
}

TEST_CASE("PoolId parses major.minor and rejects everything else") {
  CHECK(PoolId::FromString("200.0") == PoolId(200, 0));
  CHECK(PoolId::FromString("4294967295.1") == PoolId(0xffffffffu, 1));
  CHECK(PoolId(12, 34).ToString() == "12.34");
  CHECK(PoolId::FromString(PoolId(5, 6).ToString()) == PoolId(5, 6));
  for (const char *bad : {"", "200", "200.", ".1", "a.b", "1.2.3", "4294967296.0", "-1.0"}) {
    CAPTURE(bad);
    PoolId id;
    chi::Status st = PoolId::Parse(bad, &id);
    CHECK_FALSE(st.ok());
    CHECK(std::string(st.message()).find(bad) != std::string::npos);
  }
  CHECK(chi::kAdminPoolId == PoolId(1, 0));
  CHECK(PoolId().IsNull());
}
