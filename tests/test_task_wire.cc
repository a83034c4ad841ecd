// The one wire format of a task: routing header + SerializeIn on the way in,
// answer header + SerializeOut on the way back, through a container's hooks
// exactly as a transport uses them; malformed bytes are refused.
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/mods/demo/demo_runtime.h>

#include <random>
#include <vector>

using chimaera::demo::CustomTask;
using chimaera::demo::Method;

namespace {

/** What a sending transport writes: routing header then inputs. */
std::vector<char> EncodeRequest(CustomTask &t) {
  std::vector<char> buf;
  chi::OutputArchive ar(buf);
  chi::detail::TaskOpsFor<CustomTask>::SaveIn(t, ar);
  REQUIRE(ar.ok());
  return buf;
}

/** What a receiving transport does: header into a base, then the container builds the task. */
chi::Task *DecodeRequest(chi::Container &c, const std::vector<char> &buf) {
  chi::InputArchive ar(buf.data(), buf.size());
  CustomTask base;
  base.SerializeBaseIn(ar);
  if (!ar.ok()) return nullptr;
  return c.LoadTaskIn(base.method_, base, ar);
}

}  // namespace

TEST_CASE("a task crosses the wire and its answer comes back byte-exact") {
  chimaera::demo::Runtime container;
  container.Init(chi::PoolId(7, 1), "wire", 0, 1);
  CustomTask original(chi::TaskBuffer("payload-123", 11));
  original.pool_id_ = chi::PoolId(7, 1);
  original.pool_query_ = chi::PoolQuery::DirectHash(99);
  original.method_ = Method::kCustom;
  original.task_node_ = chi::TaskNode(42, 3);
  original.task_flags_.SetBits(chi::TASK_HIGH_LATENCY);

  chi::Task *remote = DecodeRequest(container, EncodeRequest(original));
  REQUIRE(remote != nullptr);
  auto &r = static_cast<CustomTask &>(*remote);
  CHECK(r.pool_id_ == original.pool_id_);
  CHECK(r.pool_query_ == original.pool_query_);
  CHECK(r.task_node_ == original.task_node_);
  CHECK(r.task_flags_.Any(chi::TASK_HIGH_LATENCY));
  CHECK(r.data_.view() == "payload-123");

  r.visited_mask_ = 0x5;
  r.visits_ = 2;
  r.SetError(chi::ErrorCode::kIo, "disk on fire");
  std::vector<char> answer;
  chi::OutputArchive out(answer);
  r.ops_->save_out(r, out);
  REQUIRE(out.ok());
  chi::DeleteTask(remote);

  chi::InputArchive in(answer.data(), answer.size());
  original.ops_ = &chi::detail::TaskOpsFor<CustomTask>::kOps;
  original.ops_->load_out(original, in);
  CHECK(in.ok());
  CHECK(original.visited_mask_ == 0x5);
  CHECK(original.visits_ == 2);
  CHECK(original.GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kIo));
  CHECK(std::string(original.GetMessage()) == "disk on fire");
}

TEST_CASE("an unknown method or malformed request bytes build no task") {
  chimaera::demo::Runtime container;
  container.Init(chi::PoolId(7, 1), "wire", 0, 1);
  CustomTask t(chi::TaskBuffer(std::string(300, 'x').data(), 300));
  t.method_ = 4242;
  CHECK(DecodeRequest(container, EncodeRequest(t)) == nullptr);

  t.method_ = Method::kCustom;
  const std::vector<char> good = EncodeRequest(t);
  std::mt19937 rng(7);
  int built = 0;
  for (size_t cut = 0; cut < good.size(); ++cut) {  // every truncation is refused
    std::vector<char> bad(good.begin(), good.begin() + cut);
    chi::Task *x = DecodeRequest(container, bad);
    CHECK(x == nullptr);
    if (x != nullptr) chi::DeleteTask(x);
  }
  for (int i = 0; i < 2000; ++i) {  // random corruption never crashes; survivors are well-formed
    std::vector<char> bad = good;
    bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    if (chi::Task *x = DecodeRequest(container, bad)) {
      ++built;
      CHECK(static_cast<CustomTask *>(x)->data_.size() <= bad.size());
      chi::DeleteTask(x);
    }
  }
  CHECK(built < 2000);
}
