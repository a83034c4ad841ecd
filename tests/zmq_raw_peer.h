// What tests that speak to a runtime's ZeroMQ endpoints as a raw DEALER share: receiving
// with a deadline (past the pings the runtime sends quiet clients), the ClientConnect
// handshake, a task request's bytes and an answer's return code.
#pragma once

#include <unistd.h>  // getpid, getuid

#include <chrono>
#include <vector>

#include <zmq.hpp>

#include <chi/chi.h>

namespace chi_test {

/** Receives one message within `ms` milliseconds, or an empty one. */
inline zmq::message_t RecvWithin(zmq::socket_t &s, int ms) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  zmq::message_t m;
  if (zmq::poll(&item, 1, std::chrono::milliseconds(ms)) > 0) {
    (void)s.recv(m, zmq::recv_flags::none);
  }
  return m;
}

/**
 * Receives the next message that is not the runtime's kPing within `ms` milliseconds, or
 * an empty one (the runtime pings a registered client that has been quiet).
 */
inline zmq::message_t RecvSkippingPings(zmq::socket_t &s, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now()).count();
    zmq::message_t m = RecvWithin(s, left > 0 ? static_cast<int>(left) : 0);
    if (m.size() < chi::kEnvelopeHeaderBytes ||
        chi::EnvelopeId(m.data()) != chi::zmq_control::kPing) {
      return m;
    }
  }
}

/**
 * Sends a handshake naming process `pid` (0: this one), for transport `mode` in protocol
 * `version`; returns the runtime's answer code (~0u when no answer came within 5 s).
 */
inline chi::u32 HandshakeCode(zmq::socket_t &s, const char *mode,
                              chi::u32 version = chi::kConnectProtocolVersion, pid_t pid = 0) {
  chi::ConnectRequest hello;
  hello.pid = static_cast<chi::u32>(pid != 0 ? pid : getpid());
  hello.uid = static_cast<chi::u32>(getuid());
  hello.mode = mode;
  hello.protocol_version = version;
  s.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  chi::ConnectAnswer answer;
  zmq::message_t m = RecvSkippingPings(s, 5000);
  return chi::ParseControl(m, &answer) ? answer.rc : ~0u;
}

/** The request bytes a raw peer sends for `task` (on its stack): `pool`'s `method`, id `id`. */
template <typename T>
std::vector<char> RawRequest(T &task, chi::PoolId pool, chi::MethodId method, chi::u64 id) {
  task.ops_ = &chi::detail::TaskOpsFor<T>::kOps;
  task.pool_id_ = pool;
  task.pool_query_ = chi::PoolQuery::Local();
  task.method_ = method;
  std::vector<char> request;
  chi::EncodeRequest(&task, id, &request);
  return request;
}

/** The return code in an answer's header (what a client would see); ~0u if unreadable. */
inline chi::u32 AnswerCode(const zmq::message_t &m) {
  if (m.size() < chi::kEnvelopeHeaderBytes) return ~0u;
  chi::InputArchive ar(static_cast<const char *>(m.data()) + chi::kEnvelopeHeaderBytes,
                       m.size() - chi::kEnvelopeHeaderBytes);
  chi::Task header;
  header.SerializeBaseOut(ar);
  return ar.ok() ? header.GetReturnCode() : ~0u;
}

}  // namespace chi_test
