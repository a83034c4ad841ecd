// What a standalone runtime and its pure clients do when things go wrong: a client killed
// mid-stream is reaped, a runtime stopped with tasks in flight answers every waiter and is
// rejoined after a restart, a killed runtime fails its clients' waits, and garbage from a
// raw ZeroMQ peer is answered with errors while others are served.
#include "cross_process_fixture.h"

using namespace xp_test;

TEST_CASE("a client killed mid-stream is reaped and others keep getting answers") {
  ServerProcess server(TestPort(2));
  REQUIRE(server.ok());
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ClientSession session(server.port(), "ipc");  // the observer: one zmq client
    REQUIRE(session.ok());
    const std::string name = ServerName(mode);
    const u64 observers = name == "zmq" ? 1 : 0;     // our session, seen by that server
    const u64 outstanding = name == "zmq" ? 1 : 0;   // our Monitor task, seen by that server
    const u64 reaped_before = ServerStats(name).clients_reaped_;
    const pid_t victim = chi_test::SpawnChild("xp_stream_client", ClientEnv(server.port(), mode));
    // Wait until the victim is registered and streaming.
    const u64 requests_before = ServerStats(name).requests_;
    bool streaming = false;
    for (int i = 0; i < 2000 && !streaming; ++i) {
      const chimaera::admin::TransportStats s = ServerStats(name);
      streaming = s.clients_ == observers + 1 && s.requests_ > requests_before + 2000;
      if (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(streaming);
    kill(victim, SIGKILL);
    CHECK(chi_test::WaitChild(victim, 10) == 128 + SIGKILL);
    chimaera::admin::TransportStats after;
    bool reclaimed = false;
    for (int i = 0; i < 2000 && !reclaimed; ++i) {
      after = ServerStats(name);
      reclaimed = after.clients_ == observers && after.tasks_outstanding_ == outstanding &&
                  after.clients_reaped_ == reaped_before + 1;
      if (!reclaimed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(reclaimed);
    CHECK(after.bytes_held_ < (64ull << 20));
    auto env = ClientEnv(server.port(), mode);
    env.push_back({"XP_TASKS", "2000"});
    CHECK(chi_test::RunChild("xp_load_client", env, 60) == 0);
  }
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("stopping the runtime with tasks in flight answers every waiter and a restart is rejoined") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    const u32 port = TestPort(mode == "ipc" ? 3 : mode == "tcp" ? 4 : 9);
    auto server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    ClientSession session(port, mode, 20);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    std::vector<chi::Future<chimaera::demo::LockHoldTask>> held;
    for (int i = 0; i < 100; ++i) {
      held.push_back(c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                     2000000ull));
    }
    std::vector<chi::Future<chimaera::demo::CustomTask>> echoes;
    for (int i = 0; i < 200; ++i) echoes.push_back(c.AsyncCustom(chi::PoolQuery::Local(), "in flight"));
    auto stop = chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local());
    u32 answered = 0, failed = 0;
    for (auto &f : held) {
      const bool done = f.Wait(15);
      CHECK(done);
      if (done) (f->GetReturnCode() == 0 ? answered : failed) += 1;
    }
    for (auto &f : echoes) {
      const bool done = f.Wait(15);
      CHECK(done);
      if (done && f->GetReturnCode() == 0) CHECK(f->data_.view() == "in flight");
    }
    CHECK(stop.Wait(15));
    CHECK(answered + failed == held.size());
    CHECK(server->WaitExit() == 0);

    // While no runtime runs a task waits; the restarted runtime answers it.
    auto pending = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    REQUIRE(pending.Wait(20));
    // The new runtime has no demo pool yet: the waiting task is answered (with an error).
    CHECK(pending->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kUnknownPool));
    chimaera::demo::Client again = DemoClient();
    auto g = again.AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    REQUIRE(g.Wait(20));
    CHECK(g->GetReturnCode() == 0);
    CHECK(g->result_value_ == 15);
    // The same connection object rejoined the new runtime process.
    chi::ClientTransport *tr = chi::Chimaera::Get().GetTransport();
    if (mode == "shm") {
      auto *shm = dynamic_cast<chi::ShmReconnectingTransport *>(tr);
      REQUIRE(shm != nullptr);
      CHECK(shm->RuntimePid() == static_cast<u32>(server->pid()));
      CHECK(shm->Reconnects() >= 1);
      CHECK(shm->Current()->Failure() == chi::ErrorCode::kOk);
    } else {
      auto *zmq = dynamic_cast<chi::ZmqClientTransport *>(tr);
      REQUIRE(zmq != nullptr);
      CHECK(zmq->RuntimePid() == static_cast<u32>(server->pid()));
      CHECK(zmq->Stats().reconnects >= 1);
    }
    // Many tasks over the rejoined connection, every answer checked.
    std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> many;
    for (u32 v = 0; v < 500; ++v) {
      many.push_back(again.AsyncGpuSubmit(chi::PoolQuery::Local(), 2, v));
    }
    u32 right = 0;
    for (u32 v = 0; v < 500; ++v) {
      right += many[v].Wait(20) && many[v]->GetReturnCode() == 0 &&
               many[v]->result_value_ == v * 2 + 2;
    }
    CHECK(right == 500);
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);
  }
}

TEST_CASE("after a reconnect the connect answer describes the restarted runtime") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    const u32 port = TestPort(mode == "ipc" ? 11 : mode == "tcp" ? 12 : 10);
    auto server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    ClientSession session(port, mode, 20);
    REQUIRE(session.ok());
    const chi::ConnectAnswer first = chi::Chimaera::Get().GetConnectAnswer();
    CHECK(first.runtime_pid == static_cast<u32>(server->pid()));
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);

    server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    // The first task after the restart (creating the pool again) makes the client rejoin.
    auto rejoin = DemoClient().AsyncGpuSubmit(chi::PoolQuery::Local(), 1, 7);
    REQUIRE(rejoin.Wait(20));
    CHECK(rejoin->GetReturnCode() == 0);
    const chi::ConnectAnswer now = chi::Chimaera::Get().GetConnectAnswer();
    CHECK(now.rc == 0);
    CHECK(now.runtime_pid == static_cast<u32>(server->pid()));
    CHECK(now.runtime_pid != first.runtime_pid);
    CHECK(now.port == port);
    CHECK(now.segments.size() == 3);
    CHECK(StopThroughSession());
    CHECK(server->WaitExit() == 0);
  }
}

TEST_CASE("a killed runtime fails its clients' waits and its stale segments are cleaned") {
  const u32 port = TestPort(5);
  std::unique_ptr<ServerProcess> server;
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    server = std::make_unique<ServerProcess>(port);  // the first start after a kill cleans up
    REQUIRE(server->ok());
    ClientSession session(port, mode, 0.5);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    auto slow = c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                5000000000ull);
    CHECK_FALSE(slow.Wait(0.05f));
    CHECK(server->Kill() == 128 + SIGKILL);
    REQUIRE(slow.Wait(10));
    CHECK(slow->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kPeerDead));
    auto after = c.AsyncCustom(chi::PoolQuery::Local(), "nobody");
    REQUIRE(after.Wait(10));  // no runtime comes back within 0.5 s
    CHECK(after->GetReturnCode() != 0);
    bool stale = false;
    CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == 0);
    CHECK(stale);
  }
  server = std::make_unique<ServerProcess>(port);
  REQUIRE(server->ok());
  chi::ServerConfig cfg;
  chi::RuntimeSegments second;
  chi::Status st = second.Create(cfg, port);
  CHECK(st.code() == chi::ErrorCode::kAlreadyExists);  // a live runtime owns the port
  CHECK(std::string(st.message()).find(std::to_string(server->pid())) != std::string::npos);
  ClientSession session(port, "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server->WaitExit() == 0);
}

TEST_CASE("garbage from a raw ZeroMQ peer is answered with errors and others are still served") {
  ServerProcess server(TestPort(6));
  REQUIRE(server.ok());
  ClientSession session(server.port(), "ipc");
  REQUIRE(session.ok());
  chimaera::demo::Client c = DemoClient();

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(chi::ZmqEndpoint("tcp", server.port()));
  auto send = [&](const void *data, size_t len) { raw.send(zmq::message_t(data, len), zmq::send_flags::none); };

  send("abc", 3);  // shorter than the envelope header
  zmq::message_t m = RecvWithin(raw, 5000);
  REQUIRE(m.size() >= 8);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kTruncated));

  // A task before the handshake is refused.
  chimaera::demo::CustomTask probe(chi::TaskBuffer("hi", 2));
  probe.ops_ = &chi::detail::TaskOpsFor<chimaera::demo::CustomTask>::kOps;
  probe.pool_id_ = kDemoPool;
  probe.pool_query_ = chi::PoolQuery::Local();
  probe.method_ = chimaera::demo::Method::kCustom;
  std::vector<char> request;
  chi::EncodeRequest(&probe, 77, &request);
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  REQUIRE(m.size() >= 8);
  CHECK(chi::EnvelopeId(m.data()) == 77);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kInvalidArgument));

  // A handshake in another protocol version is refused; the right one is accepted.
  chi::ConnectRequest hello;
  hello.pid = static_cast<u32>(getpid());
  hello.uid = static_cast<u32>(getuid());
  hello.mode = "tcp";
  hello.protocol_version = 99;
  raw.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  m = RecvWithin(raw, 5000);
  chi::ConnectAnswer answer;
  REQUIRE(chi::ParseControl(m, &answer));
  CHECK(answer.rc == static_cast<u32>(chi::ErrorCode::kVersionMismatch));
  hello.protocol_version = chi::kConnectProtocolVersion;
  raw.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  m = RecvWithin(raw, 5000);
  REQUIRE(chi::ParseControl(m, &answer));
  CHECK(answer.rc == 0);

  // Now a well-formed request works, and a 1 GiB length prefix in its payload is refused.
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == 0);
  std::vector<char> huge = request;
  const u64 gib = 1ull << 30;
  const size_t len_at = huge.size() - 2 - sizeof(u64);  // the TaskBuffer length precedes "hi"
  std::memcpy(huge.data() + len_at, &gib, sizeof(gib));
  send(huge.data(), huge.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kMalformed));

  // Multi-frame messages and truncations are refused; every one gets an answer.
  raw.send(zmq::message_t(request.data(), request.size()), zmq::send_flags::sndmore);
  send(request.data(), request.size());
  m = RecvWithin(raw, 5000);
  CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kMalformed));
  const u64 rss_before = RssKib(server.pid());
  std::mt19937 rng(11);
  int answers = 0, errors = 0;
  constexpr int kGarbage = 3000;
  for (int i = 0; i < kGarbage; ++i) {  // truncated requests, then random bytes after an id
    std::vector<char> bad = request;
    if (i % 2 == 0) {
      bad.resize(8 + rng() % (bad.size() - 8));
    } else {
      bad.resize(8 + rng() % 200);
      for (size_t k = 8; k < bad.size(); ++k) bad[k] = static_cast<char>(rng());
    }
    send(bad.data(), bad.size());
  }
  for (int i = 0; i < kGarbage; ++i) {
    m = RecvWithin(raw, 5000);
    if (m.size() == 0) break;
    ++answers;
    errors += AnswerCode(m) != 0 ? 1 : 0;
  }
  CHECK(answers == kGarbage);
  CHECK(errors == kGarbage);
  CHECK(RssKib(server.pid()) < rss_before + 32 * 1024);

  // A raw TCP peer announcing a 1 GiB ZeroMQ frame is disconnected.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  unsigned char greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
  const unsigned char ready[] = {0x04, 28, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e',
                                 't', '-', 'T', 'y', 'p', 'e', 0, 0, 0, 6, 'D', 'E', 'A', 'L',
                                 'E', 'R'};
  const unsigned char frame[] = {0x02, 0, 0, 0, 0, 0x40, 0, 0, 0};  // long frame, 1 GiB
  CHECK(write(fd, greeting, sizeof(greeting)) == sizeof(greeting));
  CHECK(write(fd, ready, sizeof(ready)) == sizeof(ready));
  CHECK(write(fd, frame, sizeof(frame)) == sizeof(frame));
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof(buf));
    closed = n <= 0;
  }
  CHECK(closed);
  close(fd);

  // The session's own client never noticed.
  CheckDemoCalls(c);
  raw.close();
  ctx.close();
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}
