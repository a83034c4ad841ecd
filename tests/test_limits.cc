// The config's `limits:` section at work. Hostfiles: one larger than max_hostfile_size, one
// naming more than max_hosts hosts, and short patterns whose expansion would pass either
// bound are refused, each before any host is made. An embedded runtime: subtasks nested past
// max_subtask_depth fail with kTooDeep (WaitTest), outputs past max_output_size with
// kTooLarge (LargeOutput), and it serves on. A standalone runtime applies the same bounds,
// and over every transport an answer past max_output_size becomes a kTooLarge error.
#include <chi/runtime/hostfile.h>

#include <cstddef>  // offsetof
#include <cstdio>   // std::remove of the config file
#include <string>
#include <vector>

#include "config_test_support.h"   // Contains
#include "cross_process_fixture.h"  // the standalone runtime child and its client sessions
#include "temp_file.h"              // hostfiles and configs

using chi::ErrorCode;
using chi::PoolQuery;
using chi::RuntimeLimits;
using chi::Status;
using chi::u32;
using chi::u64;
using chi_test::TempFile;
using config_test::Contains;

// The depth lives in what was TaskNode's padding: a task's size and layout are unchanged.
static_assert(sizeof(chi::TaskNode) == 16);
static_assert(sizeof(chi::Task) == 232);
static_assert(offsetof(chi::Task, pool_query_) == 24);

namespace {

/** An ErrorCode as the u32 a task's return code holds. */
u32 Code(ErrorCode c) { return static_cast<u32>(c); }

/** Parses a hostfile that must be refused: kBadConfig, every needle named, hosts untouched. */
void ExpectRefused(const std::string &path, const RuntimeLimits &limits,
                   const std::vector<std::string> &needles) {
  std::vector<std::string> hosts = {"kept"};
  const Status st = chi::ParseHostfile(path, &hosts, limits);
  const std::string msg = st.message();
  CAPTURE(msg);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  for (const std::string &needle : needles) {
    CAPTURE(needle);
    CHECK(Contains(st, needle));
  }
  CHECK(hosts == std::vector<std::string>{"kept"});
}

/** The bounds the runtime tests configure: small enough to reach in a test. */
constexpr u64 kOutputBound = 64 << 10;
constexpr u32 kDepthBound = 8;
const char *const kLimitsYaml =
    "limits:\n"
    "  max_output_size: 64k\n"
    "  max_subtask_depth: 8\n";

/**
 * An embedded runtime for one test case, started with kLimitsYaml (through
 * CHI_SERVER_CONF), with a demo pool; finalized (and the variables cleared) at the end.
 */
class EmbeddedSession {
 public:
  EmbeddedSession() : conf_(kLimitsYaml) {
    setenv("CHI_SERVER_CONF", conf_.path().c_str(), 1);
    setenv("CHI_WITH_RUNTIME", "1", 1);
    ok_ = chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true);
  }
  ~EmbeddedSession() {
    chi::CHIMAERA_FINALIZE();
    unsetenv("CHI_SERVER_CONF");
    unsetenv("CHI_WITH_RUNTIME");
  }
  bool ok() const { return ok_; }

 private:
  TempFile conf_;
  bool ok_ = false;
};

/** True when every byte of a LargeOutput answer is right (data[i] == i % 256). */
bool LargeOutputExact(const chimaera::demo::LargeOutputTask &t, u64 size) {
  if (t.data_.size() != size) return false;
  for (u64 i = 0; i < size; ++i) {
    if (t.data_.data()[i] != static_cast<char>(i % 256)) return false;
  }
  return true;
}

/**
 * WaitTest at the bound and past it, checked: the deepest chain allowed (kDepthBound
 * levels of subtasks below the root) completes; one more level, or a runaway depth, fails
 * with kTooDeep naming the bound.
 */
void CheckDepthBound(chimaera::demo::Client &c) {
  auto ok = c.AsyncWaitTest(PoolQuery::Local(), kDepthBound + 1);
  REQUIRE(ok.Wait(30));
  CHECK_MESSAGE(ok->GetReturnCode() == 0, ok->GetMessage());
  CHECK(ok->current_depth_ == kDepthBound + 1);
  for (u32 depth : {kDepthBound + 2, 100000u}) {
    CAPTURE(depth);
    auto deep = c.AsyncWaitTest(PoolQuery::Local(), depth);
    REQUIRE(deep.Wait(30));
    CHECK(deep->GetReturnCode() == Code(ErrorCode::kTooDeep));
    const std::string msg = deep->GetMessage();
    CAPTURE(msg);
    CHECK(msg.find("limits.max_subtask_depth = 8") != std::string::npos);
    CHECK(msg.find("depth 9") != std::string::npos);
  }
}

/** LargeOutput at the bound (byte-exact) and one byte past it (kTooLarge naming it). */
void CheckOutputBound(chimaera::demo::Client &c) {
  auto at = c.AsyncLargeOutput(PoolQuery::Local(), kOutputBound);
  REQUIRE(at.Wait(30));
  REQUIRE_MESSAGE(at->GetReturnCode() == 0, at->GetMessage());
  CHECK(LargeOutputExact(*at, kOutputBound));
  auto past = c.AsyncLargeOutput(PoolQuery::Local(), kOutputBound + 1);
  REQUIRE(past.Wait(30));
  CHECK(past->GetReturnCode() == Code(ErrorCode::kTooLarge));
  const std::string msg = past->GetMessage();
  CAPTURE(msg);
  CHECK(msg.find("limits.max_output_size = 65536") != std::string::npos);
  CHECK(past->data_.size() == 0);
}

/** Creates a demo pool in the current session. */
chimaera::demo::Client NewDemoPool(const char *name, chi::PoolId id) {
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(PoolQuery::Dynamic(), name, id);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/** A Custom echo of n bytes: completes and is byte-exact. */
void CheckEcho(chimaera::demo::Client &c, u64 n) {
  const std::string data(n, 'e');
  auto f = c.AsyncCustom(PoolQuery::Local(), data);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  CHECK(f->data_.view() == data);
}

}  // namespace

// ---- Hostfiles ----

TEST_CASE("a hostfile larger than limits.max_hostfile_size is refused before it is parsed") {
  // 1 MiB + 2 bytes of well-formed hosts: only the default bound refuses it.
  std::string big;
  while (big.size() <= (1u << 20)) big += "h\n";
  TempFile file(big);
  ExpectRefused(file.path(), RuntimeLimits(), {"limits.max_hostfile_size = 1048576", "hostfile"});

  RuntimeLimits small;
  small.max_hostfile_size = 8;
  TempFile fits("a\nb\nc\nd\n");  // exactly 8 bytes
  std::vector<std::string> hosts;
  Status st = chi::ParseHostfile(fits.path(), &hosts, small);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(hosts == std::vector<std::string>{"a", "b", "c", "d"});
  TempFile over("a\nb\nc\nd\ne");  // 9 bytes
  ExpectRefused(over.path(), small, {"limits.max_hostfile_size = 8", over.path()});

  // Text handed over directly is held to the same bound.
  hosts = {"kept"};
  st = chi::ParseHostfileText("a\nb\nc\nd\ne", &hosts, "inline", small);
  const std::string msg = st.message();
  CAPTURE(msg);
  CHECK(st.code() == ErrorCode::kBadConfig);
  CHECK(Contains(st, "inline: 9 bytes, more than limits.max_hostfile_size = 8"));
  CHECK(hosts == std::vector<std::string>{"kept"});
}

TEST_CASE("a hostfile naming more than limits.max_hosts hosts is refused before expanding") {
  TempFile at_bound("n[0-65535]\n");
  std::vector<std::string> hosts;
  Status st = chi::ParseHostfile(at_bound.path(), &hosts);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(hosts.size() == 65536);
  CHECK(hosts.front() == "n0");
  CHECK(hosts.back() == "n65535");

  TempFile past("first\nn[0-65535]\n");
  ExpectRefused(past.path(), RuntimeLimits(),
                {past.path() + ":2: ", "limits.max_hosts = 65536",
                 "this line would add 65536 to the 1 before it (not expanded)"});

  // Plain lines count too, and so do the hosts of earlier lines.
  RuntimeLimits three;
  three.max_hosts = 3;
  TempFile plain("a\nb\n# c is not a host\nc\nd\n");
  ExpectRefused(plain.path(), three,
                {plain.path() + ":5: ", "limits.max_hosts = 3", "would add 1 to the 3 before it"});
  TempFile ranges("a[1-2]\nb[1-2]\n");
  ExpectRefused(ranges.path(), three,
                {ranges.path() + ":2: ", "limits.max_hosts = 3", "would add 2 to the 2 before it"});
}

TEST_CASE("a 383-byte hostfile whose ranges would expand past either bound is refused unexpanded") {
  // Six one-digit ranges after a long name: a million hosts of 358 bytes (359 MB one per line) from a
  // 383-byte file. The count, not the hosts, is what the refusal reports.
  const std::string line = std::string(352, 'a') + "[0-9][0-9][0-9][0-9][0-9][0-9]\n";
  REQUIRE(line.size() == 383);
  TempFile file(line);
  ExpectRefused(file.path(), RuntimeLimits(),
                {file.path() + ":1: ", "limits.max_hosts = 65536",
                 "would add 1000000 to the 0 before it (not expanded)"});
  // With room for the hosts, their bytes are what passes the bound.
  RuntimeLimits many;
  many.max_hosts = 1u << 20;
  ExpectRefused(file.path(), many,
                {file.path() + ":1: ", "limits.max_hostfile_size = 1048576 bytes",
                 "would add 359000000 to the 0 before it (not expanded)"});

  // 10000 hosts (within max_hosts) of 375 to 378 bytes: 3788890 bytes one per line.
  const std::string wide = std::string(374, 'b') + "[0-9999]\n";
  REQUIRE(wide.size() == 383);
  TempFile wide_file(wide);
  ExpectRefused(wide_file.path(), RuntimeLimits(),
                {"limits.max_hostfile_size = 1048576 bytes",
                 "would add 3788890 to the 0 before it (not expanded)"});

  // Ranges whose product passes what 64 bits count.
  TempFile huge("n[0-4294967295][0-4294967295][0-4294967295]\n");
  ExpectRefused(huge.path(), RuntimeLimits(),
                {"limits.max_hosts = 65536", "would add 2^64 - 1 or more to the 0"});
}

TEST_CASE("hosts within both bounds expand in order, with their zero padding") {
  RuntimeLimits tight;
  tight.max_hosts = 6;
  tight.max_hostfile_size = 40;  // the text is 15 bytes; its 6 hosts take 36, one per line
  std::vector<std::string> hosts;
  const Status st = chi::ParseHostfileText("r[1-2]n[08-10]\n", &hosts, "<string>", tight);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(hosts ==
        std::vector<std::string>{"r1n08", "r1n09", "r1n10", "r2n08", "r2n09", "r2n10"});
  tight.max_hostfile_size = 35;  // one byte short of the hosts one per line
  hosts.clear();
  const Status over = chi::ParseHostfileText("r[1-2]n[08-10]\n", &hosts, "<string>", tight);
  const std::string msg = over.message();
  CAPTURE(msg);
  CHECK(over.code() == ErrorCode::kBadConfig);
  CHECK(Contains(over, "limits.max_hostfile_size = 35 bytes: this line would add 36"));
  CHECK(hosts.empty());
}

// ---- An embedded runtime ----

TEST_CASE("an embedded runtime refuses subtasks past limits.max_subtask_depth and serves on") {
  EmbeddedSession session;
  REQUIRE(session.ok());
  CHECK(chi::Chimaera::Get().GetConfig().limits.max_subtask_depth == kDepthBound);
  chimaera::demo::Client c = NewDemoPool("limits_depth", chi::PoolId(310, 0));
  CheckDepthBound(c);
  // Many at once, too deep and within the bound side by side: each gets its own answer.
  std::vector<chi::Future<chimaera::demo::WaitTestTask>> deep, fine;
  for (int i = 0; i < 8; ++i) {
    deep.push_back(c.AsyncWaitTest(PoolQuery::Local(), kDepthBound + 2 + i));
    fine.push_back(c.AsyncWaitTest(PoolQuery::Local(), 1 + i));
  }
  REQUIRE(chi::WaitAll(deep, 30));
  REQUIRE(chi::WaitAll(fine, 30));
  for (int i = 0; i < 8; ++i) {
    CHECK(deep[i]->GetReturnCode() == Code(ErrorCode::kTooDeep));
    CHECK(fine[i]->GetReturnCode() == 0);
    CHECK(fine[i]->current_depth_ == static_cast<u32>(1 + i));
  }
  CheckDepthBound(c);  // the refusals left nothing behind
  CheckEcho(c, 100);
}

TEST_CASE("an embedded runtime refuses outputs past limits.max_output_size and serves on") {
  EmbeddedSession session;
  REQUIRE(session.ok());
  CHECK(chi::MaxOutputSize() == kOutputBound);
  chimaera::demo::Client c = NewDemoPool("limits_output", chi::PoolId(311, 0));
  CheckOutputBound(c);
  // In the same process no answer is encoded: an echo past the bound is the caller's own.
  CheckEcho(c, kOutputBound + 4096);
  CheckOutputBound(c);
}

// ---- A standalone runtime and its clients ----

TEST_CASE("a standalone runtime applies its limits; over every transport an answer past "
          "limits.max_output_size becomes kTooLarge") {
  const std::string conf = xp_test::WriteConfigFile(
      "limits", std::string(kLimitsYaml) +
                    "shm:\n  main_size: 8m\n  client_data_size: 16m\n"
                    "  runtime_data_size: 16m\n");
  xp_test::ServerProcess server(xp_test::TestPort(0), {{"CHI_SERVER_CONF", conf}});
  REQUIRE(server.ok());
  for (const std::string &mode : xp_test::Transports()) {
    CAPTURE(mode);
    xp_test::ClientSession session(server.port(), mode);
    REQUIRE(session.ok());
    chimaera::demo::Client c = xp_test::DemoClient();
    CheckDepthBound(c);
    CheckOutputBound(c);  // exactly the bound still reaches the caller, headers and all
    CheckEcho(c, kOutputBound - 4096);
    // Custom echoes its input: an answer the handler never checked, refused where it is
    // encoded for this caller.
    const std::string data(kOutputBound + 2048, 'x');
    auto f = c.AsyncCustom(PoolQuery::Local(), data);
    REQUIRE(f.Wait(30));
    CHECK(f->GetReturnCode() == Code(ErrorCode::kTooLarge));
    const std::string msg = f->GetMessage();
    CAPTURE(msg);
    CHECK(msg.find("answer of at least") != std::string::npos);
    CHECK(msg.find("limits.max_output_size = 65536") != std::string::npos);
    CheckEcho(c, 100);  // the runtime serves on
    CheckEcho(c, kOutputBound - 4096);
  }
  {
    xp_test::ClientSession session(server.port(), "tcp");
    REQUIRE(session.ok());
    CHECK(xp_test::StopThroughSession());
  }
  std::remove(conf.c_str());
  CHECK(server.WaitExit() == 0);
}
