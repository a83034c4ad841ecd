// A downstream program: includes <chi/chi.h> as users do and checks that pool ids
// and pool queries survive their textual round trip. tests/packaging.cmake builds it
// against the build tree, an install prefix and single_include/ alone; any mismatch
// makes it exit non-zero.
#include <chi/chi.h>  // the whole public API

// Built against single_include/ only: the split headers must not be reachable.
#if defined(CHI_CONSUMER_SINGLE_INCLUDE) && __has_include(<chi/core/macros.h>)
#error "include/ is on the include path of the single-header build"
#endif

#include <cstdio>  // std::fprintf

namespace {

int g_failures = 0;

/** Records and prints one failed expectation. */
void Expect(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "chi_consumer: FAILED: %s\n", what);
    ++g_failures;
  }
}

}  // namespace

int main() {
  const chi::PoolId id(200, 7);
  Expect(chi::PoolId::FromString(id.ToString()) == id, "PoolId 200.7 round trip");
  Expect(id.ToString() == "200.7", "PoolId prints as major.minor");
  Expect(chi::PoolId::FromString("1.0") == chi::kAdminPoolId, "admin pool id is 1.0");

  const chi::PoolQuery queries[] = {
      chi::PoolQuery::Local(),        chi::PoolQuery::Dynamic(),
      chi::PoolQuery::DirectId(3),    chi::PoolQuery::DirectHash(1ull << 40),
      chi::PoolQuery::Range(2, 5),    chi::PoolQuery::Broadcast(),
      chi::PoolQuery::Physical(4),    chi::PoolQuery::LocalGpuBcast(),
      chi::PoolQuery::ToLocalGpu(1),  chi::PoolQuery::ToLocalCpu(),
      chi::PoolQuery::Null()};
  for (const chi::PoolQuery &q : queries) {
    Expect(chi::PoolQuery::FromString(q.ToString()) == q, q.ToString().c_str());
  }
  Expect(chi::PoolQuery::FromString("direct_hash:7").GetHash() == 7, "direct_hash:7 parses");

  chi::PoolQuery bad;
  Expect(!chi::PoolQuery::Parse("direct_id:x", &bad).ok(), "bad query text is rejected");

  chi::Atomic<chi::u32> counter;
  counter.FetchAdd(2);
  Expect(counter.Load() == 2, "host Atomic adds");

  if (g_failures == 0) std::printf("chi_consumer: all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
