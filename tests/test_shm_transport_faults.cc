// The shared-memory transport when things go wrong: a client SIGKILLed mid-stream is
// reclaimed by the runtime's reaper while others keep being served, a dead runtime fails
// pending waits with kPeerDead and a new one takes its port, bad bytes in a request ring
// reset only that client's slot, as do forged ring geometry, forged positions and a message
// total beyond memory, a slot claimed in another process's name is never served, and
// Connect, Start and Close fail with clear errors.
// The shared runtime child and fixtures are in shm_transport_fixture.h.
#include "shm_transport_fixture.h"

#include <grp.h>       // setgroups: a child of another user
#include <signal.h>    // SIGKILL
#include <sys/stat.h>  // segment permissions
#include <unistd.h>    // getpid

#include <chrono>   // deadlines
#include <cstdio>   // fprintf in child routines
#include <cstring>  // memcpy
#include <memory>   // make_unique of a runtime
#include <string>   // payloads, env values
#include <thread>   // sleep_for while polling from tests
#include <vector>   // ring bytes

using namespace shm_test;

namespace {

// ---- Child processes ----

/**
 * A client that dies mid-stream: a task in flight, then the first 64 KiB of a 4 MiB
 * request written into its ring, then it waits to be SIGKILLed.
 */
int DyingClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  auto held = client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kRead,
                                   300000000ull);
  const chi::ShmStream rs = tr->Segment().RequestStream(tr->SlotIndex());
  std::vector<char> piece(64u << 10, 'x');
  const u64 id = 0x5151;
  std::memcpy(piece.data(), &id, sizeof(id));
  checks.Expect(rs.WritableBytes(piece.size()) >= piece.size(), "room for the first piece");
  rs.WritePiece(true, 4u << 20, piece.data(), piece.size());
  tr->Segment().Header()->server_event_.Notify();
  SignalReady();
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 1;  // the parent should have killed us long ago
}
chi_test::ChildRoutine kDyingClientRoutine("shm_dying_client", DyingClientMain);

/** A client that streams 4 MiB echoes (two in flight) until it is killed. */
int StreamingClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  const std::string big = Pattern(4u << 20, 9);
  auto a = client.AsyncCustom(PoolQuery::Local(), big);
  bool signalled = false;
  for (int i = 0; i < 100000; ++i) {
    auto b = client.AsyncCustom(PoolQuery::Local(), big);
    if (!a.Wait(30) || a->GetReturnCode() != 0) return 2;
    if (!signalled) {
      SignalReady();
      signalled = true;
    }
    a = std::move(b);
  }
  return 1;
}
chi_test::ChildRoutine kStreamingClientRoutine("shm_streaming_client", StreamingClientMain);

/** A fresh client: echoes of several sizes must come back intact. */
int EchoClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  auto tr = ConnectFromChild(&checks);
  if (tr == nullptr) return checks.Result();
  chimaera::demo::Client client(kPool);
  for (u64 size : {16ull, 4000ull, 300000ull, 1ull << 20}) {
    const std::string data = Pattern(size, 5);
    auto f = client.AsyncCustom(PoolQuery::Local(), data);
    checks.Expect(f.Wait(30) && f->GetReturnCode() == 0 && f->data_.view() == data,
                  "echo of " + std::to_string(size) + " bytes");
  }
  chi::GetIpcManager().AttachTransport(nullptr, 0);
  tr->Close();
  return checks.Result();
}
chi_test::ChildRoutine kEchoClientRoutine("shm_echo_client", EchoClientMain);

// ---- Parent-side helpers ----

}  // namespace

TEST_CASE("a client SIGKILLed mid-stream is reclaimed; other clients keep being served") {
  const u32 port = TestPort(3);
  RuntimeProcess runtime(port);
  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
  const u64 reclaimed_before = stats.reclaimed_clients;

  SUBCASE("killed with a task in flight and 64 KiB of a 4 MiB request in its ring") {
    ReadyPipe ready;
    pid_t pid = chi_test::SpawnChild(
        "shm_dying_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_READY_FD", ready.WriteFd()}});
    REQUIRE(ready.Wait(30));
    // The runtime holds the partial request while the client lives.
    auto holds_partial = [](const auto &s) {
      return s.clients == 2 && s.bytes_in_use >= (64u << 10);
    };
    CHECK(AwaitStats(port, holds_partial, 10, &stats));
    kill(pid, SIGKILL);
    CHECK(chi_test::WaitChild(pid, 30) == 128 + SIGKILL);
  }
  SUBCASE("killed at a random point while streaming 4 MiB echoes") {
    ReadyPipe ready;
    pid_t pid = chi_test::SpawnChild(
        "shm_streaming_client",
        {{"CHI_TEST_SHM_PORT", std::to_string(port)}, {"CHI_TEST_READY_FD", ready.WriteFd()}});
    REQUIRE(ready.Wait(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    kill(pid, SIGKILL);
    CHECK(chi_test::WaitChild(pid, 30) == 128 + SIGKILL);
  }

  // Reclaiming the slot and returning the dead client's buffers are separate steps: wait
  // (bounded) for both; memory still held after 20 s is a leak and fails here.
  CHECK(AwaitStats(port,
                   [&](const auto &s) {
                     return s.reclaimed_clients == reclaimed_before + 1 && s.clients == 1 &&
                            s.bytes_in_use == 0;
                   },
                   20, &stats));
  CHECK(stats.bytes_in_use == 0);
  CheckEcho(client, 4u << 20, 7);  // the surviving client
  CHECK(chi_test::RunChild("shm_echo_client", {{"CHI_TEST_SHM_PORT", std::to_string(port)}}, 60) ==
        0);
  CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
}

TEST_CASE("a pending Wait returns kPeerDead when the runtime dies; a new runtime takes the port") {
  const u32 port = TestPort(4);
  auto runtime = std::make_unique<RuntimeProcess>(port);
  {
    AttachedClient attached(runtime->Info());
    auto client = CreateDemoPool();
    auto held = client.AsyncLockHold(PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                     30000000000ull);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(held.IsComplete());
    CHECK(runtime->Kill() == 128 + SIGKILL);
    REQUIRE(held.Wait(5));  // the client notices the dead runtime within the wait's timeout
    CHECK(held->GetReturnCode() == Code(ErrorCode::kPeerDead));
    CHECK(std::string(held->GetMessage()).find("died") != std::string::npos);

    auto late = client.AsyncCustom(PoolQuery::Local(), "late");
    REQUIRE(late.Wait(5));
    CHECK(late->GetReturnCode() == Code(ErrorCode::kPeerDead));
    CHECK(attached.Transport().Failure() == ErrorCode::kPeerDead);
  }
  // The dead runtime's segment is still there: probes and connects say so.
  chi::ShmServerInfo stale;
  CHECK(chi::ShmServer::Probe(port, &stale).code() == ErrorCode::kPeerDead);
  std::unique_ptr<chi::ShmClientTransport> refused;
  chi::ShmServerInfo old_info = runtime->Info();
  CHECK(chi::ShmClientTransport::Connect(old_info, &refused).code() == ErrorCode::kPeerDead);

  // A new runtime replaces the stale segment and serves as before.
  runtime = std::make_unique<RuntimeProcess>(port);
  CHECK(runtime->Info().runtime_pid != old_info.runtime_pid);
  AttachedClient attached(runtime->Info());
  auto client = CreateDemoPool();
  CheckEcho(client, 1000, 8);
}

TEST_CASE("bad bytes in a request ring reset only that client's slot") {
  const u32 port = TestPort(5);
  RuntimeProcess runtime(port);
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));

  auto connect = [&] {
    std::unique_ptr<chi::ShmClientTransport> tr;
    chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &tr);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    return tr;
  };
  auto request_ring = [](chi::ShmClientTransport &tr) {
    return tr.Segment().RequestStream(tr.SlotIndex());
  };
  auto wake_runtime = [](chi::ShmClientTransport &tr) {
    tr.Segment().Header()->server_event_.Notify();
  };

  // A message that announces 1 GiB, beyond the runtime's 64 MiB limit.
  auto huge = connect();
  char head[16] = {};
  request_ring(*huge).WritePiece(true, 1ull << 30, head, sizeof(head));
  wake_runtime(*huge);
  auto after_huge = EchoVia(*huge, "after the huge prefix");
  REQUIRE(after_huge.Wait(10));
  CHECK(after_huge->GetReturnCode() == Code(ErrorCode::kTooLarge));
  CHECK(huge->Failure() == ErrorCode::kTooLarge);
  CheckEcho(client, 5000, 10);

  // Bytes that are no record at all.
  auto garbage = connect();
  std::vector<char> junk(96, static_cast<char>(0xAB));
  request_ring(*garbage).PublishUnframed(junk.data(), junk.size());
  wake_runtime(*garbage);
  auto after_junk = EchoVia(*garbage, "after the junk");
  REQUIRE(after_junk.Wait(10));
  CHECK(after_junk->GetReturnCode() == Code(ErrorCode::kMalformed));
  CheckEcho(client, 5000, 11);

  // A well-framed message whose content is garbage: an error answer, and the slot lives on.
  auto framed = connect();
  std::vector<char> nonsense(200, static_cast<char>(0x5A));
  request_ring(*framed).WritePiece(true, nonsense.size(), nonsense.data(), nonsense.size());
  wake_runtime(*framed);
  const auto t0 = Clock::now();
  while (framed->StrayAnswers() == 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(framed->StrayAnswers() == 1);  // the error answer names no task of ours
  auto still_ok = EchoVia(*framed, "still served");
  REQUIRE(still_ok.Wait(10));
  CHECK(still_ok->GetReturnCode() == 0);
  CHECK(still_ok->data_.view() == "still served");
  CHECK(framed->Failure() == ErrorCode::kOk);

  REQUIRE(chi::ShmServer::ProbeStats(port, &stats).ok());
  CHECK(stats.broken_streams == 2);
  huge->Close();
  garbage->Close();
  framed->Close();
  CHECK(AwaitStats(port, [](const auto &s) { return s.reclaimed_clients == 2 && s.clients == 1; },
                   10, &stats));
  CheckEcho(client, 1u << 20, 12);
}

namespace {

/** Connects one more client to `runtime` (not attached to the IpcManager). */
std::unique_ptr<chi::ShmClientTransport> ConnectClient(const RuntimeProcess &runtime) {
  std::unique_ptr<chi::ShmClientTransport> tr;
  chi::Status st = chi::ShmClientTransport::Connect(runtime.Info(), &tr);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return tr;
}

/** True once the runtime has failed tr's connection with `code` (within 10 s). */
bool AwaitFailure(chi::ShmClientTransport &tr, ErrorCode code) {
  const auto t0 = Clock::now();
  while (tr.Failure() != code && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return tr.Failure() == code;
}

}  // namespace

TEST_CASE("forged ring geometry and forged positions reset only the forger's slot") {
  const u32 port = TestPort(7);
  // Small rings and no data segments: answers larger than a ring stream through it.
  RuntimeProcess runtime(port, 16u << 10);
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();

  // The segment header's geometry and the forger's streams' recorded sizes rewritten: the
  // runtime keeps the sizes it made, so a 60 KB echo that wraps both rings comes back
  // exact, and its statistics walk only the slots there are.
  {
    auto shaper = ConnectClient(runtime);
    chi::ShmSegmentHeader *h = shaper->Segment().Header();
    const chi::ShmSegmentHeader saved_geometry = [&] {
      chi::ShmSegmentHeader g;
      g.ring_bytes_ = h->ring_bytes_;
      g.num_slots_ = h->num_slots_;
      g.slot_bytes_ = h->slot_bytes_;
      return g;
    }();
    h->ring_bytes_ = 1u << 30;
    h->num_slots_ = 1u << 20;
    h->slot_bytes_ = 1ull << 30;
    const u32 i = shaper->SlotIndex();
    shaper->Segment().RequestStream(i).ForgeShared(0, 0, 1u << 30);
    shaper->Segment().AnswerStream(i).ForgeShared(0, 0, 1u << 30);
    const std::string data = Pattern(60000, 1);
    auto echo = EchoVia(*shaper, data);
    REQUIRE(echo.Wait(20));
    CHECK(echo->GetReturnCode() == 0);
    CHECK(echo->data_.view() == data);
    auto monitor = chimaera::admin::Client().AsyncMonitor(PoolQuery::Local());
    REQUIRE(monitor.Wait(20));
    CHECK(monitor->GetReturnCode() == 0);
    CheckEcho(client, 5000, 20);
    h->ring_bytes_ = saved_geometry.ring_bytes_;  // for the clients that connect next
    h->num_slots_ = saved_geometry.num_slots_;
    h->slot_bytes_ = saved_geometry.slot_bytes_;
    shaper->Close();
  }

  // Read positions off a record's start (a line): one 8 bytes in, where a well-formed
  // record waits (read there, it would be answered), and one 13 bytes in, whose header
  // word would be read misaligned.
  for (const u64 into : {u64{8}, u64{13}}) {
    CAPTURE(into);
    auto odd = ConnectClient(runtime);
    auto *t = chi::NewTask<chimaera::demo::CustomTask>(chi::TaskBuffer("x", 1));
    t->pool_id_ = kPool;
    t->pool_query_ = PoolQuery::Local();
    t->method_ = chimaera::demo::Method::kCustom;
    chi::GetIpcManager().Stamp(t);
    std::vector<char> request;
    chi::EncodeRequest(t, 0x77, &request);
    chi::DeleteTask(t);
    REQUIRE(request.size() <= 100);
    // The ring follows the stream's shared words (three lines) after the slot.
    char *ring = reinterpret_cast<char *>(odd->Segment().Slot(odd->SlotIndex())) +
                 sizeof(chi::ShmClientSlot) + 3 * chi::kCacheLine;
    const u64 word = static_cast<u64>(chi::ShmStream::kWhole) |
                     static_cast<u64>(request.size()) << 32;
    std::memcpy(ring + 64 + into + 8, request.data(), request.size());
    std::memcpy(ring + 64 + into, &word, sizeof(word));
    // Written up to the record's end: read at that position, it is all there is.
    odd->Segment().RequestStream(odd->SlotIndex()).ForgeShared(64 + into + 64, 64 + into,
                                                               16u << 10);
    odd->Segment().Header()->server_event_.Notify();
    CHECK(AwaitFailure(*odd, ErrorCode::kMalformed));
    CHECK(odd->StrayAnswers() == 0);  // nothing was read there, so nothing was answered
    CheckEcho(client, 5000, 21);
    odd->Close();
  }

  // An answer stream whose reader claims to be far ahead of the runtime's writes: room
  // without bound, if the runtime believed it (a 60 KB answer into a 16 KB ring).
  {
    auto ahead = ConnectClient(runtime);
    ahead->Segment().AnswerStream(ahead->SlotIndex()).ForgeShared(0, 1ull << 40, 16u << 10);
    auto echo = EchoVia(*ahead, Pattern(60000, 2));
    CHECK(AwaitFailure(*ahead, ErrorCode::kMalformed));
    REQUIRE(echo.Wait(20));
    CHECK(echo->GetReturnCode() != 0);
    CheckEcho(client, 60000, 22);
    ahead->Close();
  }
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(port, [](const auto &s) { return s.broken_streams == 3 && s.clients == 1; },
                   10, &stats));
  CheckEcho(client, 1u << 20, 23);
}

TEST_CASE("a chunk that names a message beyond memory is assembled in steps; only its slot resets") {
  const u32 port = TestPort(2);
  // The runtime takes messages up to 1 TiB: more than it can reserve at once.
  RuntimeProcess runtime(port, 256u << 10, 1u << 20, 8, "", 1ull << 40);
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();
  auto tr = ConnectClient(runtime);
  const chi::ShmStream rs = tr->Segment().RequestStream(tr->SlotIndex());
  // A first 4 KiB chunk of a 1 TiB message, then a chunk of another message: out of step.
  for (const chi::ShmDataRef &ref :
       {chi::ShmDataRef{0, 4096, 1ull << 40}, chi::ShmDataRef{4096, 4096, 1ull << 39}}) {
    REQUIRE(rs.WritableBytes(chi::ShmStream::kRefBytes) >= chi::ShmStream::kRefBytes);
    rs.WriteRef(&ref, chi::MemOrder::kSeqCst);
  }
  tr->Segment().Header()->server_event_.Notify();
  CHECK(AwaitFailure(*tr, ErrorCode::kMalformed));
  CheckEcho(client, 1u << 20, 30);  // the runtime lives, and serves the others
  tr->Close();
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(port, [](const auto &s) { return s.broken_streams == 1 && s.clients == 1; },
                   10, &stats));
}

TEST_CASE("a client that forges how far it freed its answer region has its slot reset") {
  const u32 port = TestPort(1);
  RuntimeProcess runtime(port, 256u << 10, 1u << 20);  // 128 KiB answer regions per slot
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();
  auto tr = ConnectClient(runtime);
  for (u32 k = 0; k < 4; ++k) {  // answers by ref move the runtime's writer past a region
    const std::string data = Pattern(100000, 40 + k);
    auto echo = EchoVia(*tr, data);
    REQUIRE(echo.Wait(20));
    REQUIRE(echo->GetReturnCode() == 0);
    CHECK(echo->data_.view() == data);
  }
  // "Freed up to 0": more than two regions behind the writer, as no reader can be. The
  // client frees the last answer's block once it has decoded it, maybe after Wait
  // returned; it touches the word no more until its next answer.
  chi::Atomic<u64> &released = tr->Segment().Slot(tr->SlotIndex())->answer_data_released_;
  const auto t0 = Clock::now();
  while (released.Load(chi::MemOrder::kSeqCst) < 3 * (128u << 10) && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(released.Load(chi::MemOrder::kSeqCst) >= 3 * (128u << 10));
  released.Store(0, chi::MemOrder::kSeqCst);
  auto stuck = EchoVia(*tr, Pattern(100000, 50));
  CHECK(AwaitFailure(*tr, ErrorCode::kMalformed));
  REQUIRE(stuck.Wait(20));
  CHECK(stuck->GetReturnCode() != 0);
  CheckEcho(client, 100000, 51);
  tr->Close();
}

TEST_CASE("a slot claimed in another process's name is refused and never served") {
  const u32 port = TestPort(0);
  RuntimeProcess runtime(port);
  AttachedClient good(runtime.Info());
  auto client = CreateDemoPool();
  chi::ShmSegment seg;
  REQUIRE(seg.Attach(runtime.Info()).ok());
  chi::ShmSegmentHeader *h = seg.Header();
  // Claims a free slot for (pid, start ticks) the way a client does, then waits for the
  // runtime's verdict: the code it broke the slot with (0 when it served it).
  auto claim = [&](u32 pid, u64 ticks) {
    u32 i = 0;
    for (; i < seg.NumSlots(); ++i) {
      u32 expected = 0;
      if (seg.Slot(i)->owner_pid_.CompareExchange(expected, pid, chi::MemOrder::kAcqRel)) break;
    }
    REQUIRE(i < seg.NumSlots());
    chi::ShmClientSlot *slot = seg.Slot(i);
    slot->owner_start_ticks_.Store(ticks, chi::MemOrder::kRelaxed);
    slot->state_.Store(static_cast<u32>(chi::ShmSlotState::kActive), chi::MemOrder::kRelease);
    // A request waits in it: a slot the runtime served would answer it.
    const std::string request(64, 'r');
    seg.RequestStream(i).WritePiece(true, request.size(), request.data(), request.size());
    h->membership_seq_.FetchAdd(1, chi::MemOrder::kSeqCst);
    h->server_event_.Notify();
    const auto t0 = Clock::now();
    while (slot->state_.Load(chi::MemOrder::kAcquire) !=
               static_cast<u32>(chi::ShmSlotState::kBroken) &&
           SecondsSince(t0) < 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const u32 code = slot->broken_code_.Load(chi::MemOrder::kRelaxed);
    CHECK(seg.AnswerStream(i).UsedBytes() == 0);  // nothing was answered there
    // Leave as a client leaves; the runtime reclaims the slot.
    slot->state_.Store(static_cast<u32>(chi::ShmSlotState::kClosed), chi::MemOrder::kRelease);
    h->membership_seq_.FetchAdd(1, chi::MemOrder::kSeqCst);
    h->server_event_.Notify();
    return code;
  };
  const chi::ProcessIdentity runtime_id{static_cast<u32>(runtime.Pid()),
                                        h->runtime_start_ticks_};
  CHECK(claim(runtime_id.pid, runtime_id.start_ticks) == Code(ErrorCode::kPermissionDenied));
  const chi::ProcessIdentity self = chi::SelfIdentity();
  CHECK(claim(self.pid, self.start_ticks + 1) == Code(ErrorCode::kPermissionDenied));
  if (getuid() == 0) {  // a live process of another user (CI runs as root)
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    const pid_t other = fork();
    if (other == 0) {
      const bool dropped = setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0;
      char b = dropped ? 1 : 0;
      if (write(ready[1], &b, 1) != 1) _exit(1);
      pause();  // until the test kills it
      _exit(0);
    }
    char b = 0;
    REQUIRE(read(ready[0], &b, 1) == 1);
    REQUIRE(b == 1);
    CHECK(claim(static_cast<u32>(other), chi::IdentityOf(static_cast<u32>(other)).start_ticks) ==
          Code(ErrorCode::kPermissionDenied));
    kill(other, SIGKILL);
    waitpid(other, nullptr, 0);
    close(ready[0]);
    close(ready[1]);
  } else {
    WARN_MESSAGE(false, "not root: no process of another user to claim a slot for");
  }
  seg.Detach();
  CheckEcho(client, 5000, 31);
  chi::ShmServer::Stats stats;
  CHECK(AwaitStats(port, [](const auto &s) { return s.clients == 1; }, 10, &stats));
}

TEST_CASE("Connect, Start and Close fail with clear errors and free what they hold") {
  const u32 port = TestPort(6);
  chi::ShmServerInfo missing{chi::ShmSegmentName(port), 1u << 20, chi::kShmTransportVersion, port,
                             1};
  std::unique_ptr<chi::ShmClientTransport> tr;
  CHECK(chi::ShmClientTransport::Connect(missing, &tr).code() == ErrorCode::kNotFound);

  RuntimeProcess runtime(port);
  struct stat st {};
  const std::string os_name =
      "/dev/shm" + chi::PosixShmBackend::OsName(chi::ShmSegmentName(port));
  REQUIRE(stat(os_name.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  chi::ShmServerInfo wrong_version = runtime.Info();
  wrong_version.version += 1;
  chi::Status s = chi::ShmClientTransport::Connect(wrong_version, &tr);
  CHECK(s.code() == ErrorCode::kVersionMismatch);
  CHECK(std::string(s.message()).find("version") != std::string::npos);
  chi::ShmServerInfo wrong_size = runtime.Info();
  wrong_size.size += 4096;
  s = chi::ShmClientTransport::Connect(wrong_size, &tr);
  CHECK(s.code() == ErrorCode::kSizeMismatch);
  CHECK(tr == nullptr);

  // A second runtime on a live runtime's port is refused and names the owner.
  chi::RequestDispatcher no_runtime(nullptr, nullptr);
  chi::ShmServer second;
  s = second.Start(&no_runtime, chi::ShmServer::Options{}, port);
  CHECK(s.code() == ErrorCode::kAlreadyExists);
  CHECK(std::string(s.message()).find(std::to_string(runtime.Pid())) != std::string::npos);

  AttachedClient attached(runtime.Info());
  auto client = CreateDemoPool();
  REQUIRE(chi::ShmClientTransport::Connect(runtime.Info(), &tr).ok());
  chi::ShmServer::Stats stats;
  REQUIRE(AwaitStats(port, [](const auto &x) { return x.clients == 2; }, 10, &stats));
  auto *hold = chi::NewTask<chimaera::demo::LockHoldTask>(chimaera::demo::LockMode::kRead,
                                                          30000000000ull, 0u);
  hold->pool_id_ = kPool;
  hold->pool_query_ = PoolQuery::Local();
  hold->method_ = chimaera::demo::Method::kLockHold;
  chi::GetIpcManager().Stamp(hold);
  REQUIRE(tr->Send(hold));
  chi::Future<chimaera::demo::LockHoldTask> held(hold);
  CHECK_FALSE(held.Wait(0.05f));
  tr->Close();
  REQUIRE(held.Wait(1));
  CHECK(held->GetReturnCode() == Code(ErrorCode::kShutdown));
  auto *after = chi::NewTask<chimaera::demo::CustomTask>();
  CHECK_FALSE(tr->Send(after));
  chi::DeleteTask(after);
  CHECK(AwaitStats(port, [](const auto &x) { return x.clients == 1; }, 10, &stats));
  CheckEcho(client, 64, 13);
}
