// What a ZeroMQ client does with the answers its runtime sent just before the connection
// closed: they are delivered, and only tasks the runtime never answered fail. The runtime
// here is played by the test process (a raw ROUTER), so it can answer a whole backlog and
// close while the client process is stopped, and the client finds both at once.
#include <doctest/doctest.h>

#include <signal.h>     // SIGSTOP / SIGCONT of the client
#include <sys/prctl.h>  // the client dies with the test binary

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>

#include "child_process.h"
#include "test_ports.h"
#include "zmq_raw_peer.h"

namespace {

using chi::u32;
using chi::u64;

/** Tasks the client sends; their answers sit in its socket when the close is found. */
constexpr u32 kTasks = 1000;
/** How many of them the stand-in runtime answers (the rest stay unanswered). */
constexpr u32 kAnswered = kTasks - 10;
/** A pool the stand-in runtime pretends to serve (no runtime creates it). */
constexpr chi::PoolId kPool(300, 0);

/** The payload of task i (its answer echoes it). */
std::string Payload(u32 i) { return "backlog " + std::to_string(i); }

/**
 * The client process: connects (CHI_IPC_MODE, CHI_PORT), sends kTasks Custom tasks and
 * waits for each. The first kAnswered must come back intact; the others must fail with
 * kPeerDead (the runtime went away without answering them). Exit code: the checks.
 */
int BacklogClientMain() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a failed test, stopped or not
  chi_test::ChildChecks checks;
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {
    checks.Expect(false, "CHIMAERA_INIT: " + chi::Chimaera::Get().LastError().ToString());
    return checks.Result();
  }
  chimaera::demo::Client client(kPool);
  std::vector<chi::Future<chimaera::demo::CustomTask>> futures;
  for (u32 i = 0; i < kTasks; ++i) {
    futures.push_back(client.AsyncCustom(chi::PoolQuery::Local(), Payload(i)));
  }
  u32 intact = 0, lost = 0, other = 0;
  for (u32 i = 0; i < kTasks; ++i) {
    if (!futures[i].Wait(30)) {
      checks.Expect(false, "task " + std::to_string(i) + " was never completed");
      continue;
    }
    const u32 rc = futures[i]->GetReturnCode();
    if (rc == 0 && futures[i]->data_.view() == Payload(i)) {
      ++intact;
    } else if (rc == static_cast<u32>(chi::ErrorCode::kPeerDead)) {
      ++lost;
    } else {
      ++other;
    }
  }
  checks.Expect(intact == kAnswered && lost == kTasks - kAnswered && other == 0,
                std::to_string(intact) + " answered intact, " + std::to_string(lost) +
                    " failed with kPeerDead, " + std::to_string(other) + " otherwise (want " +
                    std::to_string(kAnswered) + " / " + std::to_string(kTasks - kAnswered) +
                    " / 0)");
  chi::CHIMAERA_FINALIZE();
  return checks.Result();
}
chi_test::ChildRoutine kBacklogClientRoutine("zmq_backlog_client", BacklogClientMain);

/** The answer a runtime would send for the Custom request `m` (its payload echoed). */
zmq::message_t EchoAnswer(const zmq::message_t &m) {
  chimaera::demo::CustomTask task;
  task.ops_ = &chi::detail::TaskOpsFor<chimaera::demo::CustomTask>::kOps;
  chi::InputArchive ar(static_cast<const char *>(m.data()) + chi::kEnvelopeHeaderBytes,
                       m.size() - chi::kEnvelopeHeaderBytes);
  task.SerializeBaseIn(ar);
  task.SerializeIn(ar);
  REQUIRE(ar.ok());
  task.request_id_ = chi::EnvelopeId(m.data());
  std::vector<char> out;
  chi::EncodeAnswerKeep(&task, &out);
  return zmq::message_t(out.data(), out.size());
}

}  // namespace

TEST_CASE("answers a ZeroMQ runtime sent before it went away are delivered, not failed") {
  for (const char *mode : {"ipc", "tcp"}) {
    CAPTURE(mode);
    const u32 port = chi_test::kCrossProcessPorts.Port(mode[0] == 'i' ? 0 : 1);
    zmq::context_t ctx(1);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, -1);  // the close below delivers every answer
    router.set(zmq::sockopt::sndhwm, 0);
    router.set(zmq::sockopt::rcvhwm, 0);
    router.bind(chi::ZmqEndpoint(mode, port));
    const pid_t child = chi_test::SpawnChild(
        "zmq_backlog_client",
        {{"CHI_PORT", std::to_string(port)}, {"CHI_IPC_MODE", mode}, {"CHI_WITH_RUNTIME", "0"},
         {"CHI_RECONNECT_TIMEOUT", "1"}});
    // Play the runtime: accept the handshake, then collect every request.
    zmq::message_t peer;
    std::vector<zmq::message_t> requests;
    while (requests.size() < kTasks) {
      zmq::message_t id = chi_test::RecvWithin(router, 20000);
      REQUIRE(id.size() != 0);
      REQUIRE(id.more());
      zmq::message_t m;
      REQUIRE(router.recv(m, zmq::recv_flags::none));
      REQUIRE(m.size() >= chi::kEnvelopeHeaderBytes);
      if (chi::EnvelopeId(m.data()) == chi::zmq_control::kConnect) {
        chi::ConnectAnswer accept;
        accept.runtime_pid = static_cast<u32>(getpid());
        accept.port = port;
        peer.copy(id);
        router.send(id, zmq::send_flags::sndmore);
        router.send(chi::MakeControl(chi::zmq_control::kAccept, accept), zmq::send_flags::none);
        continue;
      }
      if (chi::EnvelopeId(m.data()) & chi::zmq_control::kBit) continue;
      requests.push_back(std::move(m));
    }
    // With the client stopped, answer all but the last few and go away: when it runs
    // again, its socket holds the answers and reports the closed connection together.
    REQUIRE(kill(child, SIGSTOP) == 0);
    std::atomic<int> closed{0};
    for (u32 i = 0; i < kAnswered; ++i) {
      zmq::message_t to;
      to.copy(peer);
      router.send(to, zmq::send_flags::sndmore);
      router.send(EchoAnswer(requests[i]), zmq::send_flags::none);
    }
    // The close returns once the answers are written to the connection; should the
    // connection not take them all while the client is stopped, it is woken after 10 s
    // (the check below then proves less, but nothing hangs).
    std::thread watchdog([child, done = &closed] {
      for (int i = 0; i < 1000 && done->load() == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (done->load() == 0) kill(child, SIGCONT);
    });
    router.close();
    ctx.close();
    closed.store(1);
    watchdog.join();
    REQUIRE(kill(child, SIGCONT) == 0);
    CHECK(chi_test::WaitChild(child, 60) == 0);
  }
}
