// The demo module through an embedded runtime: the calls DESIGN.md section 2
// promises (Custom echo, GpuSubmit on the CPU, WaitTest, LargeOutput).
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>

#include <string>
#include <vector>

namespace {

/** Starts the embedded runtime once for this binary and creates one demo pool. */
chimaera::demo::Client &DemoPool() {
  static chimaera::demo::Client client = [] {
    REQUIRE(chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true));
    chimaera::demo::Client c;
    auto f = c.AsyncCreate(chi::PoolQuery::Dynamic(), "demo_pool", chi::PoolId(200, 0));
    REQUIRE(f.Wait(30));
    REQUIRE(f->GetReturnCode() == 0);
    REQUIRE(f->new_pool_id_ == chi::PoolId(200, 0));
    return c;
  }();
  return client;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) % 251);
  return s;
}

}  // namespace

TEST_CASE("Custom echoes 1 byte, 100 bytes and 64 KiB unchanged") {
  auto &client = DemoPool();
  for (size_t n : {size_t{1}, size_t{100}, size_t{64 * 1024}}) {
    CAPTURE(n);
    const std::string data = Pattern(n);
    auto f = client.AsyncCustom(chi::PoolQuery::Local(), data);
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->data_.view() == data);
  }
}

TEST_CASE("GpuSubmit on the CPU handler returns test_value * 2 + gpu_id") {
  auto &client = DemoPool();
  for (chi::u32 gpu = 0; gpu < 3; ++gpu) {
    for (chi::u32 v : {0u, 1u, 42u, 100u, 104u, 123u, 1000000u}) {
      auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), gpu, v);
      REQUIRE(f.Wait(30));
      CHECK(f->GetReturnCode() == 0);
      CHECK(f->result_value_ == v * 2 + gpu);
    }
  }
}

TEST_CASE("WaitTest nests subtasks to the requested depth") {
  auto &client = DemoPool();
  for (chi::u32 depth : {1u, 3u, 5u, 10u}) {
    auto f = client.AsyncWaitTest(chi::PoolQuery::Local(), depth);
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == 0);
    CHECK(f->current_depth_ == depth);
  }
  std::vector<chi::Future<chimaera::demo::WaitTestTask>> many;
  for (chi::u32 depth : {2u, 3u, 4u}) many.push_back(client.AsyncWaitTest(chi::PoolQuery::Local(), depth));
  REQUIRE(chi::WaitAll(many, 30));
  CHECK(many[0]->current_depth_ == 2);
  CHECK(many[1]->current_depth_ == 3);
  CHECK(many[2]->current_depth_ == 4);
}

TEST_CASE("LargeOutput returns 1 MiB with data[i] == i % 256") {
  auto &client = DemoPool();
  const chi::u64 size = 1 << 20;
  auto f = client.AsyncLargeOutput(chi::PoolQuery::Local(), size);
  REQUIRE(f.Wait(30));
  CHECK(f->GetReturnCode() == 0);
  REQUIRE(f->data_.size() == size);
  const char *d = f->data_.data();
  chi::u64 bad = 0;
  for (chi::u64 i = 0; i < size; ++i) bad += static_cast<unsigned char>(d[i]) != i % 256;
  CHECK(bad == 0);
}
