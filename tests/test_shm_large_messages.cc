// Large messages over the shared-memory transport when the runtime shares data segments:
// requests travel whole in the client's region of the client data segment and answers in
// its region of the runtime data segment (a kRef record in the ring names each), larger
// ones still stream through the rings, a client with more large requests out than its
// region holds waits for room, bad refs reset only the slot that sent them (or fail the
// client that received one), and a client killed with blocks in its regions is reclaimed
// so that the next client in its slot starts clean. Runtime child and fixtures:
// shm_transport_fixture.h.
#include "shm_transport_fixture.h"

#include <signal.h>  // SIGKILL

#include <string>  // payloads
#include <thread>  // sleep_for while polling
#include <vector>  // futures

using namespace shm_test;

namespace {

constexpr u32 kRing = 256u << 10;
constexpr u32 kDataBytes = 8u << 20;     ///< each data segment: 8 slots of 1 MiB
constexpr u64 kRegion = kDataBytes / 8;  ///< one slot's region

/** The runtime's counters right now. */
chi::ShmServer::Stats StatsOf(u32 port) {
  chi::ShmServer::Stats s;
  REQUIRE(chi::ShmServer::ProbeStats(port, &s).ok());
  return s;
}

/**
 * A client that echoes 512 KiB (whole blocks) and 3 MiB (chunks of half its 1 MiB
 * regions) in turn, two in flight, until it is killed: the kill lands mid-message or
 * between messages, with blocks held in both regions.
 */
int RegionClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  const std::string sizes[2] = {Pattern(512u << 10, 3), Pattern(3 * kRegion, 4)};
  auto a = client.AsyncCustom(PoolQuery::Local(), sizes[0]);
  bool signalled = false;
  for (int i = 0; i < 1000000; ++i) {
    auto b = client.AsyncCustom(PoolQuery::Local(), sizes[(i + 1) % 2]);
    if (!a.Wait(30) || a->GetReturnCode() != 0 || a->data_.view() != sizes[i % 2]) return 2;
    if (!signalled && i >= 8) {
      SignalReady();
      signalled = true;
    }
    a = std::move(b);
  }
  return 1;  // the parent should have killed us long ago
}
chi_test::ChildRoutine kRegionClientRoutine("shm_region_client", RegionClientMain);

/**
 * A runtime child sharing two 8 MiB data segments on test port k, with this process
 * attached as its first client (slot 0) and the demo pool created.
 */
struct RegionRuntime {
  explicit RegionRuntime(u32 k)
      : port(TestPort(k)), runtime(port, kRing, kDataBytes), attached(runtime.Info()),
        client(CreateDemoPool()) {}
  u32 port;
  RuntimeProcess runtime;
  AttachedClient attached;
  chimaera::demo::Client client;
};

}  // namespace

TEST_CASE("requests and answers past the stack buffer travel in the data segments") {
  RegionRuntime rt(0);
  const u32 port = rt.port;
  chimaera::demo::Client &client = rt.client;
  const chi::ShmServer::Stats before = StatsOf(port);
  // Just past the 512-byte stack envelope, larger than the ring's pieces, about a region.
  const u64 whole[] = {600, 100000, 300000, kRegion - 4096};
  u32 seed = 1;
  for (u64 size : whole) CheckEcho(client, size, seed++);
  const chi::ShmServer::Stats after = StatsOf(port);
  CHECK(after.data_requests - before.data_requests == 4);
  CHECK(after.data_answers - before.data_answers == 4);
  // More than a region: in chunks of half a region, which the other side assembles.
  CheckEcho(client, kRegion + 4096, seed++);
  CheckEcho(client, 3 * kRegion, seed++);
  const chi::ShmServer::Stats streamed = StatsOf(port);
  CHECK(streamed.data_requests - after.data_requests == 2);
  CHECK(streamed.data_answers - after.data_answers == 2);
  // LargeOutput's answer lies in the runtime data segment; small tasks still use the ring.
  auto out = client.AsyncLargeOutput(PoolQuery::Local(), 512u << 10);
  REQUIRE(out.Wait(30));
  REQUIRE(out->GetReturnCode() == 0);
  CHECK(out->data_.size() == (512u << 10));
  auto small = client.AsyncGpuSubmit(PoolQuery::Local(), 0, 42);
  REQUIRE(small.Wait(30));
  CHECK(small->result_value_ == 84);
  const chi::ShmServer::Stats last = StatsOf(port);
  CHECK(last.data_answers == streamed.data_answers + 1);
  CHECK(last.data_requests == streamed.data_requests);
  chi::ShmServer::Stats settled;
  CHECK(AwaitStats(port, [](const auto &s) { return s.bytes_in_use == 0; }, 10, &settled));
}

TEST_CASE("more large requests in flight than a region holds wait for room; every answer is right") {
  RegionRuntime rt(1);
  const u32 port = rt.port;
  chimaera::demo::Client &client = rt.client;
  const chi::ShmServer::Stats before = StatsOf(port);
  constexpr u32 kTasks = 24;  // 24 x 200 KiB: almost 5 regions' worth at once
  std::vector<std::string> data;
  std::vector<chi::Future<chimaera::demo::CustomTask>> futures;
  for (u32 k = 0; k < kTasks; ++k) {
    data.push_back(Pattern(200u << 10, 100 + k));
    futures.push_back(client.AsyncCustom(PoolQuery::Local(), data.back()));
  }
  for (u32 k = 0; k < kTasks; ++k) {
    REQUIRE(futures[k].Wait(30));
    REQUIRE_MESSAGE(futures[k]->GetReturnCode() == 0, futures[k]->GetMessage());
    CHECK(futures[k]->data_.view() == data[k]);
  }
  const chi::ShmServer::Stats after = StatsOf(port);
  CHECK(after.data_requests - before.data_requests == kTasks);
  CHECK(after.data_answers > before.data_answers);  // the rest streamed while it was full
}

TEST_CASE("a bad ref resets only the slot that sent it; a bad ref in an answer fails its client") {
  RegionRuntime rt(2);
  const u32 port = rt.port;
  RuntimeProcess &runtime = rt.runtime;
  chimaera::demo::Client &client = rt.client;
  auto connect = [&] {
    std::unique_ptr<chi::ShmClientTransport> tr;
    chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &tr);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    return tr;
  };
  // Writes kRef records into a connection's request ring and wakes the runtime.
  auto send_refs = [](chi::ShmClientTransport &tr, std::vector<chi::ShmDataRef> refs) {
    const chi::ShmStream rs = tr.Segment().RequestStream(tr.SlotIndex());
    for (const chi::ShmDataRef &ref : refs) {
      REQUIRE(rs.WritableBytes(chi::ShmStream::kRefBytes) >= chi::ShmStream::kRefBytes);
      rs.WriteRef(&ref, chi::MemOrder::kSeqCst);
    }
    tr.Segment().Header()->server_event_.Notify();
  };
  struct Case {
    const char *what;
    std::vector<chi::ShmDataRef> refs;
    ErrorCode expect;
  };
  const Case cases[] = {
      {"crossing the region's end", {{kRegion - 64, 128, 128}}, ErrorCode::kMalformed},
      {"longer than the region", {{0, kRegion + 1, kRegion + 1}}, ErrorCode::kMalformed},
      {"empty", {{64, 0, 0}}, ErrorCode::kMalformed},
      {"a chunk longer than its message", {{0, 4096, 100}}, ErrorCode::kMalformed},
      {"a chunk of another message", {{0, 4096, 9000}, {4096, 4096, 8000}}, ErrorCode::kMalformed},
      {"a chunk past its message's end", {{0, 4096, 6000}, {4096, 4096, 6000}},
       ErrorCode::kMalformed},
      {"a message over the 64 MiB limit", {{0, 4096, 1ull << 40}}, ErrorCode::kTooLarge},
  };
  const u64 broken_before = StatsOf(port).broken_streams;
  for (const Case &c : cases) {
    CAPTURE(c.what);
    auto bad = connect();
    send_refs(*bad, c.refs);
    auto after = EchoVia(*bad, "after the bad ref");
    REQUIRE(after.Wait(10));
    CHECK(after->GetReturnCode() == Code(c.expect));
    CHECK(bad->Failure() == c.expect);
    bad->Close();
    CheckEcho(client, 300000, 20);  // by ref, on the good client's slot
  }
  CHECK(StatsOf(port).broken_streams - broken_before == 7);

  // A ref inside the region to bytes that are no request: an error answer, the slot lives.
  auto framed = connect();
  send_refs(*framed, {{4096, 700, 700}});
  const auto t0 = Clock::now();
  while (framed->StrayAnswers() == 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(framed->StrayAnswers() == 1);
  auto still = EchoVia(*framed, std::string(5000, 'k'));
  REQUIRE(still.Wait(10));
  CHECK(still->GetReturnCode() == 0);
  CHECK(still->data_.view() == std::string(5000, 'k'));

  // The runtime's side: an answer ref outside the client's region fails that client.
  auto victim = connect();
  const chi::ShmStream as = victim->Segment().AnswerStream(victim->SlotIndex());
  const chi::ShmDataRef wild{kRegion - 16, 4096, 4096};
  as.WriteRef(&wild, chi::MemOrder::kSeqCst);
  victim->Segment().Slot(victim->SlotIndex())->answer_ready_.Notify();
  const auto t1 = Clock::now();
  while (victim->Failure() == ErrorCode::kOk && SecondsSince(t1) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(victim->Failure() == ErrorCode::kMalformed);
  victim->Close();
  framed->Close();
  CheckEcho(client, kRegion / 2, 21);
}

TEST_CASE("a client killed mid-message in its regions is reclaimed; its slot's next client starts clean") {
  RegionRuntime rt(3);  // this process holds slot 0
  const u32 port = rt.port;
  RuntimeProcess &runtime = rt.runtime;
  chimaera::demo::Client &client = rt.client;
  ReadyPipe ready;
  const pid_t victim = chi_test::SpawnChild(
      "shm_region_client",
      {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_READY_FD", ready.WriteFd()}});
  REQUIRE(victim > 0);
  REQUIRE_MESSAGE(ready.Wait(30), "the victim never got its answers");
  const u64 served = StatsOf(port).data_requests;
  CHECK(served >= 9);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));  // a little further into a message
  kill(victim, SIGKILL);
  CHECK(chi_test::WaitChild(victim, 30) == 128 + SIGKILL);
  chi::ShmServer::Stats s;
  REQUIRE(AwaitStats(
      port, [](const auto &st) { return st.reclaimed_clients == 1 && st.clients == 1; }, 20, &s));
  CHECK(AwaitStats(port, [](const auto &st) { return st.bytes_in_use == 0; }, 10, &s));

  // The next connection takes the victim's slot (slot 1) and must see nothing of its blocks.
  std::unique_ptr<chi::ShmClientTransport> next;
  chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &next);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  CHECK(next->SlotIndex() == 1);
  for (u32 k = 0; k < 6; ++k) {
    const std::string data = Pattern(400000, 60 + k);
    auto f = EchoVia(*next, data);
    REQUIRE(f.Wait(30));
    REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
    CHECK(f->data_.view() == data);
  }
  CHECK(StatsOf(port).data_requests >= served + 6);
  next->Close();
  CheckEcho(client, 700000, 70);
}
