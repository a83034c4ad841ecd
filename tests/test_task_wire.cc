// The one wire format of a task: routing header + SerializeIn on the way in,
// answer header + SerializeOut on the way back, through a container's hooks
// exactly as a transport uses them; malformed bytes are refused.
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/mods/demo/demo_runtime.h>

#include <cstring>  // memcpy of header words
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
      // A flipped method byte may name another method whose inputs the bytes also spell.
      if (x->method_ == Method::kCustom) {
        CHECK(static_cast<CustomTask *>(x)->data_.size() <= bad.size());
      }
      chi::DeleteTask(x);
    }
  }
  CHECK(built < 2000);
}

TEST_CASE("the routing header is compact for usual values and exact for every other") {
  chi::Task root;
  root.pool_id_ = chi::PoolId(7, 1);
  root.pool_query_ = chi::PoolQuery::Local();
  root.method_ = Method::kCustom;
  root.task_id_ = chi::TaskId{3, 4242, 99};
  root.task_node_ = chi::TaskNode(99, 0);  // a root task: (its unique id, 0)
  std::vector<char> small;
  chi::OutputArchive out(small);
  root.SerializeBaseIn(out);
  // pool, shape, method, flags, task id: a small request fits one cache line with its
  // 8-byte request id, 8-byte record header and a few input bytes.
  CHECK(small.size() == 36);
  chi::InputArchive in(small.data(), small.size());
  chi::Task back;
  back.period_ns_ = 5;  // stale values a reused decode target may hold are replaced
  back.task_node_ = chi::TaskNode(1, 1);
  back.SerializeBaseIn(in);
  CHECK(in.ok());
  CHECK(in.Remaining() == 0);
  CHECK(back.pool_query_ == chi::PoolQuery::Local());
  CHECK(back.period_ns_ == 0);
  CHECK(back.task_node_ == chi::TaskNode(99, 0));
  CHECK(back.task_id_ == root.task_id_);

  chi::Task full;
  full.pool_id_ = chi::PoolId(7, 1);
  full.pool_query_ = chi::PoolQuery::Range(3, 5);
  full.period_ns_ = 2.5e6;
  full.task_id_ = chi::TaskId{3, 4242, 100};
  full.task_node_ = chi::TaskNode(99, 2);  // a subtask of the root above
  std::vector<char> big;
  chi::OutputArchive out2(big);
  full.SerializeBaseIn(out2);
  CHECK(big.size() == 36 + 12 + 8 + 12);
  chi::InputArchive in2(big.data(), big.size());
  chi::Task back2;
  back2.SerializeBaseIn(in2);
  CHECK(in2.ok());
  CHECK(back2.pool_query_ == full.pool_query_);
  CHECK(back2.period_ns_ == full.period_ns_);
  CHECK(back2.task_node_ == full.task_node_);

  // Shape bits nobody defined: the query comes out invalid, so the request is refused.
  std::vector<char> odd = small;
  odd[8 + 3] = static_cast<char>(0x40);  // the shape word's top byte
  chi::InputArchive in3(odd.data(), odd.size());
  chi::Task back3;
  back3.SerializeBaseIn(in3);
  CHECK_FALSE(back3.pool_query_.IsValid());
  CHECK_FALSE(in3.ok());  // every decoder sees the refusal in its archive
  CHECK(in3.status().code() == chi::ErrorCode::kMalformed);

  // A known mode with arguments that make no sense (a range of no containers) too.
  chi::Task empty_range;
  empty_range.pool_query_ = chi::PoolQuery::Range(3, 1);
  std::vector<char> bad_range;
  chi::OutputArchive out4(bad_range);
  empty_range.SerializeBaseIn(out4);
  bad_range[36] = 0;  // the range's count (first argument after the 36-byte header)
  chi::InputArchive in4(bad_range.data(), bad_range.size());
  chi::Task back4;
  back4.SerializeBaseIn(in4);
  CHECK_FALSE(in4.ok());
}

TEST_CASE("the routing header's fixed block has one layout, and a short one decodes to nothing") {
  chi::Task t;
  t.pool_id_ = chi::PoolId(0x01020304, 0x05060708);
  t.pool_query_ = chi::PoolQuery::Local();
  t.method_ = 0x0a0b0c0d;
  t.task_flags_ = chi::IntFlag(0x11121314);
  t.task_id_ = chi::TaskId{0x21222324, 0x31323334, 0x4142434445464748ull};
  t.task_node_ = chi::TaskNode(t.task_id_.unique_, 0);
  std::vector<char> bytes;
  chi::OutputArchive out(bytes);
  t.SerializeBaseIn(out);
  REQUIRE(bytes.size() == chi::Task::kWireHeadBytes);
  // Field by field, little-endian, no padding: what the block replaced wrote the same.
  auto word = [&](chi::u64 at) {
    chi::u32 v = 0;
    std::memcpy(&v, bytes.data() + at, sizeof(v));
    return v;
  };
  CHECK(word(0) == 0x01020304);
  CHECK(word(4) == 0x05060708);
  CHECK(word(8) == static_cast<chi::u32>(chi::RoutingMode::kLocal));  // the shape word
  CHECK(word(12) == 0x0a0b0c0d);
  CHECK(word(16) == 0x11121314);
  CHECK(word(20) == 0x21222324);
  CHECK(word(24) == 0x31323334);
  chi::u64 unique = 0;
  std::memcpy(&unique, bytes.data() + 28, sizeof(unique));
  CHECK(unique == 0x4142434445464748ull);

  // One byte short: truncated, and the target keeps every field it had.
  chi::InputArchive in(bytes.data(), bytes.size() - 1);
  chi::Task back;
  back.pool_id_ = chi::PoolId(9, 9);
  back.method_ = 77;
  back.task_id_ = chi::TaskId{1, 2, 3};
  back.SerializeBaseIn(in);
  CHECK_FALSE(in.ok());
  CHECK(in.status().code() == chi::ErrorCode::kTruncated);
  CHECK(back.pool_id_ == chi::PoolId(9, 9));
  CHECK(back.method_ == 77);
  CHECK(back.task_id_ == chi::TaskId{1, 2, 3});
}

TEST_CASE("the answer header is the code, the message's length and its text, and refuses too long a message") {
  chi::Task sent;
  sent.SetError(chi::ErrorCode::kMalformed, "boom");
  std::vector<char> buf;
  chi::OutputArchive out(buf);
  sent.SerializeBaseOut(out);
  REQUIRE(out.ok());
  // The layout of ar(rc_, msg_): u32 code, u32 length, then the bytes.
  REQUIRE(buf.size() == 8 + 4);
  chi::u32 words[2];
  std::memcpy(words, buf.data(), sizeof(words));
  CHECK(words[0] == static_cast<chi::u32>(chi::ErrorCode::kMalformed));
  CHECK(words[1] == 4);
  CHECK(std::string(buf.data() + 8, 4) == "boom");

  chi::Task got;
  chi::InputArchive in(buf.data(), buf.size());
  got.SerializeBaseOut(in);
  REQUIRE(in.ok());
  CHECK(got.GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kMalformed));
  CHECK(got.msg_.view() == "boom");

  // A length above the message's capacity is malformed, and nothing is taken from it.
  words[1] = chi::kTaskMessageSize + 10;
  std::vector<char> bad(8 + chi::kTaskMessageSize + 10, 'x');
  std::memcpy(bad.data(), words, sizeof(words));
  chi::Task refused;
  chi::InputArchive bad_in(bad.data(), bad.size());
  refused.SerializeBaseOut(bad_in);
  CHECK(bad_in.status().code() == chi::ErrorCode::kMalformed);
  CHECK(bad_in.status().ToString().find("longer than its capacity") != std::string::npos);
  CHECK(refused.msg_.empty());

  // A header cut short leaves the task as it was.
  chi::Task cut;
  chi::InputArchive short_in(buf.data(), 6);
  cut.SerializeBaseOut(short_in);
  CHECK(!short_in.ok());
  CHECK(cut.GetReturnCode() == 0);
  CHECK(cut.msg_.empty());
}

TEST_CASE("an error answered with no message still says what failed") {
  // The runtime's answer: an error code and an empty message, with and without outputs.
  for (bool with_outputs : {false, true}) {
    CAPTURE(with_outputs);
    chimaera::demo::GpuSubmitTask answered;
    answered.rc_ = static_cast<chi::u32>(chi::ErrorCode::kUnknownPool);
    std::vector<char> bytes;
    chi::OutputArchive out = chi::BeginEnvelope(7, &bytes);
    if (with_outputs) {
      answered.SerializeBaseOut(out);
      answered.SerializeOut(out);
    } else {
      answered.SerializeBaseOut(out);
    }
    REQUIRE(out.ok());
    auto *t = chi::NewTask<chimaera::demo::GpuSubmitTask>();
    chi::DecodeAnswer(t, bytes.data(), bytes.size());
    CHECK(t->GetReturnCode() == static_cast<chi::u32>(chi::ErrorCode::kUnknownPool));
    const std::string msg = t->GetMessage();
    CHECK(msg.find("unknown pool") != std::string::npos);
    CHECK(msg.find("no message") != std::string::npos);
    chi::DeleteTask(t);
  }
}
