// What a standalone runtime and its pure clients do when things go wrong: a client killed
// mid-stream is reaped, a runtime stopped with tasks in flight answers every waiter and is
// rejoined after a restart, a killed runtime fails its clients' waits, and a stopped (alive)
// one fails them after the hang timeout, over every transport. Garbage from raw ZeroMQ peers
// is in test_cross_process_garbage.cc.
#include <cstdio>   // std::remove of the signal files
#include <fstream>  // the stop clients' reports

#include "cross_process_fixture.h"

using namespace xp_test;

namespace {

/** The shm victim's requests: 8 MiB, so each crosses the 1 MiB rings in 256 KiB pieces. */
constexpr u64 kLargeRequest = 8ull << 20;
/** What Monitor must show held beyond the baseline before the shm victim is killed. */
constexpr u64 kHeldEvidence = 1ull << 20;
/**
 * How far above its baseline shm's bytes_held_ may be once the victim is reaped: the
 * survivor's own small tasks in its rings come and go; the victim's partial request
 * (up to 8 MiB) may not stay.
 */
constexpr u64 kShmHeldSlack = 512ull << 10;
/**
 * The same for ZeroMQ, whose bytes_held_ is its pool of answer buffers kept for reuse:
 * any pooled slot may come to keep a buffer of one of the victim's 4 KiB answers, and
 * the pool holds about as many slots as the clients keep in flight together (victim 128,
 * survivor and newcomer 256 each), so up to ~640 buffers of at most 8 KiB (no leak shows
 * here: a slot that is never given back lowers it).
 */
constexpr u64 kZmqHeldSlack = 8ull << 20;

/**
 * Stops the shm victim (SIGSTOP) at moments until Monitor shows the runtime holding at
 * least kHeldEvidence of it beyond `baseline` (a request it was taking in, in pieces),
 * leaving it stopped there; false (victim running) when no moment showed that.
 */
bool StopVictimHoldingBytes(pid_t victim, u64 baseline, chimaera::admin::TransportStats *seen) {
  std::mt19937 rng(static_cast<u32>(victim));
  for (int attempt = 0; attempt < 50; ++attempt) {
    kill(victim, SIGSTOP);
    // The reaper publishes bytes_held every 20 ms while clients exist; by then the
    // runtime has also taken in what the victim had put in its ring.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    *seen = ServerStats("shm");
    if (seen->bytes_held_ >= baseline + kHeldEvidence) return true;
    kill(victim, SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % 20));
  }
  return false;
}

}  // namespace

TEST_CASE("a client killed mid-stream is reaped and others keep getting answers") {
  ServerProcess server(TestPort(2));
  REQUIRE(server.ok());
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ClientSession session(server.port(), "ipc");  // the observer: one zmq client
    REQUIRE(session.ok());
    const std::string name = ServerName(mode);
    const bool shm = mode == "shm";
    const u64 observers = shm ? 0 : 1;    // our session, seen by that server
    const u64 outstanding = shm ? 0 : 1;  // our Monitor task, seen by that server
    const std::string ready = SignalPath("survivor_ready"), stop = SignalPath("survivor_stop");
    const std::string victim_ready = SignalPath("victim_ready");
    const std::string newcomer_ready = SignalPath("newcomer_ready");
    const std::vector<std::string> files = {ready, stop, victim_ready, newcomer_ready};
    for (const std::string &f : files) std::remove(f.c_str());

    // A survivor keeps running checked tasks through all that follows.
    auto env = ClientEnv(server.port(), mode);
    env.insert(env.end(),
               {{"XP_CLIENT_ID", "7"}, {"XP_READY_FILE", ready}, {"XP_STOP_FILE", stop}});
    const pid_t survivor = chi_test::SpawnChild("xp_survivor_client", env);
    REQUIRE(AwaitFile(ready));
    chimaera::admin::TransportStats before;
    // Its tasks show as outstanding (so the count's return to 0 below means something).
    CHECK(AwaitServerStats(name, [&](const auto &s) {
      return s.tasks_outstanding_ > outstanding;
    }, &before));
    REQUIRE(AwaitServerStats(name, [&](const auto &s) { return s.clients_ == observers + 1; },
                             &before));

    // The victim streams: on shm, 8 MiB requests that the runtime takes in piece by piece.
    env = ClientEnv(server.port(), mode);
    env.push_back({"XP_READY_FILE", victim_ready});
    if (shm) {
      env.insert(env.end(), {{"XP_STREAM_BYTES", std::to_string(kLargeRequest)},
                             {"XP_STREAM_WINDOW", "4"},
                             {"XP_STREAM_MISSING_POOL", "1"}});
    }
    const pid_t victim = chi_test::SpawnChild("xp_stream_client", env);
    REQUIRE(AwaitFile(victim_ready));
    chimaera::admin::TransportStats seen = ServerStats(name);
    CHECK(seen.clients_ == observers + 2);
    if (shm) {
      REQUIRE(StopVictimHoldingBytes(victim, before.bytes_held_, &seen));
      MESSAGE("held for the stopped victim: " << seen.bytes_held_ - before.bytes_held_);
    }
    kill(victim, SIGKILL);
    CHECK(chi_test::WaitChild(victim, 10) == 128 + SIGKILL);

    // Reaped while the survivor still runs; what it held is given back.
    const u64 slack = shm ? kShmHeldSlack : kZmqHeldSlack;
    chimaera::admin::TransportStats after;
    CHECK(AwaitServerStats(name, [&](const auto &s) {
      return s.clients_ == observers + 1 && s.clients_reaped_ == before.clients_reaped_ + 1 &&
             s.bytes_held_ <= before.bytes_held_ + slack;
    }, &after));
    CHECK(after.clients_reaped_ == before.clients_reaped_ + 1);
    CHECK(after.bytes_held_ <= before.bytes_held_ + slack);
    MESSAGE("bytes held: before " << before.bytes_held_ << ", after " << after.bytes_held_);

    // A newcomer (on shm it takes the victim's slot, the lowest free) gets every answer,
    // and with it served nothing of the victim's is held in that slot either.
    env = ClientEnv(server.port(), mode);
    env.insert(env.end(), {{"XP_CLIENT_ID", "8"}, {"XP_READY_FILE", newcomer_ready},
                           {"XP_STOP_FILE", stop}});
    const pid_t newcomer = chi_test::SpawnChild("xp_survivor_client", env);
    // The first counters that show it served (before its traffic could reuse the slot's
    // buffers): nothing of the victim's came back with the slot.
    CHECK(AwaitServerStats(name, [&](const auto &s) { return s.clients_ == observers + 2; },
                           &after));
    CHECK(after.bytes_held_ <= before.bytes_held_ + slack);
    REQUIRE(AwaitFile(newcomer_ready));
    WriteFile(stop);
    CHECK(chi_test::WaitChild(survivor, 60) == 0);  // every one of their answers was right
    CHECK(chi_test::WaitChild(newcomer, 60) == 0);
    CHECK(AwaitServerStats(name, [&](const auto &s) {
      return s.clients_ == observers && s.tasks_outstanding_ == outstanding;
    }, &after));
    CHECK(after.tasks_outstanding_ == outstanding);
    for (const std::string &f : files) std::remove(f.c_str());
  }
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

namespace {

/**
 * Long tasks each stop client has running when the stop arrives (read locks: they run at
 * once). The stop ends their sleep early and they fail with kShutdown ("cut short"), so
 * they add no test time.
 */
constexpr int kLongTasks = 4;
constexpr u64 kLongTaskNs = 3000000000ull;
/** Short tasks each stop client queues behind one mutex, and echoes. */
constexpr int kMutexTasks = 100;
constexpr int kEchoTasks = 200;

/** How the tasks of one client ended when its runtime was stopped under them. */
struct StopTally {
  u32 answered = 0;       ///< Wait returned true with return code 0
  u32 failed = 0;         ///< Wait returned true with an error
  u32 late = 0;           ///< Wait gave up (the timeout passed)
  u32 long_answered = 0;  ///< of the long tasks, answered (success or error)
  u32 long_cut = 0;       ///< of those, cut short by the stop (kShutdown)

  /** Counts one task's end, waiting at most 15 s for it. */
  template <typename Future>
  bool Add(Future &f) {
    if (!f.Wait(15)) {
      ++late;
      return false;
    }
    (f->GetReturnCode() == 0 ? answered : failed) += 1;
    return f->GetReturnCode() == 0;
  }
  /** The tally as one line of text (the report a stop client writes). */
  std::string Text() const {
    return std::to_string(answered) + " " + std::to_string(failed) + " " + std::to_string(late) +
           " " + std::to_string(long_answered) + " " + std::to_string(long_cut);
  }
};

/**
 * A client whose runtime is stopped while its tasks are in flight: kLongTasks long
 * LockHold tasks, kMutexTasks short ones behind one mutex and kEchoTasks echoes; creates
 * XP_READY_FILE once all are sent, then waits for each and writes its StopTally to
 * XP_REPORT_FILE. Fails when a wait times out or an answered echo is wrong.
 */
int StopClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&checks, &client)) return checks.Result();
  using chimaera::demo::LockMode;
  const chi::PoolQuery local = chi::PoolQuery::Local();
  std::vector<chi::Future<chimaera::demo::LockHoldTask>> long_tasks, short_tasks;
  std::vector<chi::Future<chimaera::demo::CustomTask>> echoes;
  for (int i = 0; i < kLongTasks; ++i) {
    long_tasks.push_back(client.AsyncLockHold(local, LockMode::kRead, kLongTaskNs));
  }
  for (int i = 0; i < kMutexTasks; ++i) {
    short_tasks.push_back(client.AsyncLockHold(local, LockMode::kMutex, 2000000ull));
  }
  for (int i = 0; i < kEchoTasks; ++i) {
    echoes.push_back(client.AsyncCustom(local, "in flight " + std::to_string(i)));
  }
  u32 long_done = 0;
  for (auto &f : long_tasks) long_done += f.IsComplete() ? 1 : 0;
  checks.Expect(long_done == 0, "the long tasks still run once all are sent");
  WriteFile(EnvStr("XP_READY_FILE"));
  StopTally tally;
  for (auto &f : long_tasks) {
    tally.Add(f);
    if (!f.IsComplete()) continue;
    ++tally.long_answered;
    const bool cut = f->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kShutdown);
    tally.long_cut += cut ? 1 : 0;
    // A hold either ran its whole time (success) or says the stop cut it short.
    const u64 held_ms = (f->end_ns_ - f->start_ns_) / 1000000;
    checks.Expect(cut || (f->GetReturnCode() == 0 && f->end_ns_ - f->start_ns_ >= kLongTaskNs),
                  "a long task's result matches how long it held (rc " +
                      std::to_string(f->GetReturnCode()) + ": '" + f->GetMessage() + "', held " +
                      std::to_string(held_ms) + " ms)");
  }
  for (auto &f : short_tasks) tally.Add(f);
  for (int i = 0; i < kEchoTasks; ++i) {
    if (tally.Add(echoes[i])) {
      checks.Expect(echoes[i]->data_.view() == "in flight " + std::to_string(i), "echo intact");
    }
  }
  checks.Expect(tally.late == 0, std::to_string(tally.late) + " waits ran past their timeout");
  WriteFile(EnvStr("XP_REPORT_FILE"), tally.Text());
  chi::CHIMAERA_FINALIZE();  // with its runtime gone
  return checks.Result();
}
chi_test::ChildRoutine kStopClientRoutine("xp_stop_client", StopClientMain);

/** Reads the StopTally a stop client wrote to `path` (all zero when unreadable). */
StopTally ReadTally(const std::string &path) {
  StopTally t;
  std::ifstream(path) >> t.answered >> t.failed >> t.late >> t.long_answered >> t.long_cut;
  return t;
}

}  // namespace

TEST_CASE("stopping the runtime with tasks in flight answers every waiter and a restart is rejoined") {
  constexpr int kClients = 2;
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    const u32 port = TestPort(mode == "ipc" ? 3 : mode == "tcp" ? 4 : 9);
    auto server = std::make_unique<ServerProcess>(port);
    REQUIRE(server->ok());
    ClientSession session(port, mode, 20);
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    // Client processes with long, queued and quick tasks in flight.
    std::vector<pid_t> clients;
    std::vector<std::string> ready, report;
    for (int k = 0; k < kClients; ++k) {
      ready.push_back(SignalPath("stop_ready_" + std::to_string(k)));
      report.push_back(SignalPath("stop_report_" + std::to_string(k)));
      std::remove(ready.back().c_str());
      std::remove(report.back().c_str());
      auto env = ClientEnv(port, mode);
      env.insert(env.end(), {{"CHI_RECONNECT_TIMEOUT", "20"}, {"XP_READY_FILE", ready.back()},
                             {"XP_REPORT_FILE", report.back()}});
      clients.push_back(chi_test::SpawnChild("xp_stop_client", env));
    }
    for (const std::string &f : ready) REQUIRE(AwaitFile(f));
    // And this process's own.
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
    for (int k = 0; k < kClients; ++k) {
      CAPTURE(k);
      CHECK(chi_test::WaitChild(clients[k], 30) == 0);  // no wait ran past its timeout
      const StopTally t = ReadTally(report[k]);
      MESSAGE("client " << k << ": " << t.answered << " answered, " << t.failed << " errors; "
                        << t.long_answered << " of " << kLongTasks << " long tasks answered, "
                        << t.long_cut << " of them cut short by the stop");
      CHECK(t.late == 0);
      CHECK(t.answered + t.failed == kLongTasks + kMutexTasks + kEchoTasks);
      std::remove(ready[k].c_str());
      std::remove(report[k].c_str());
    }
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

TEST_CASE("a stopped runtime fails its clients' waits after the hang timeout; a busy one does not") {
  const u32 port = TestPort(9);
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ServerProcess server(port);
    REQUIRE(server.ok());
    setenv("CHI_HANG_TIMEOUT", "1", 1);
    ClientSession session(port, mode, 5);
    unsetenv("CHI_HANG_TIMEOUT");
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    // Busy: a task that takes 2.5 s (a fiber sleep in the handler) while the runtime lives.
    auto busy = c.AsyncLockHold(chi::PoolQuery::Local(), chimaera::demo::LockMode::kMutex,
                                2500000000ull);
    REQUIRE(busy.Wait(20));
    CHECK(busy->GetReturnCode() == 0);
    // Stopped: nothing reads the request; the wait ends with the hang, not never.
    REQUIRE(StopProcess(server.pid()));
    auto stuck = c.AsyncCustom(chi::PoolQuery::Local(), "anyone there?");
    const bool answered = stuck.Wait(20);
    REQUIRE(kill(server.pid(), SIGCONT) == 0);
    REQUIRE(answered);
    CHECK(stuck->GetReturnCode() == static_cast<u32>(chi::ErrorCode::kPeerDead));
    if (mode == "shm") {
      CHECK(std::string(stuck->GetMessage()).find("no sign of life") != std::string::npos);
    }
    // Resumed, the runtime is rejoined.
    auto after = c.AsyncCustom(chi::PoolQuery::Local(), "back again");
    REQUIRE(after.Wait(20));
    CHECK(after->GetReturnCode() == 0);
    CHECK(after->data_.view() == "back again");
    CHECK(StopThroughSession());
    CHECK(server.WaitExit() == 0);
  }
}
