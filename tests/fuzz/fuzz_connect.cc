// libFuzzer harness for the ClientConnect handshake: byte 0 picks the side, the rest is one
// control message ([u64 id][archive], as MakeControl frames it). Runtime side: ParseControl
// into a ConnectRequest, CheckConnectRequest, and the answer it leads to read back by the
// client. Client side: ParseControl into a ConnectAnswer, its Status, ShmInfoFromAnswer and
// DecodeGpuConnectInfo of its gpu_info. What decodes must encode canonically.
#include <cstdint>  // uint8_t
#include <cstring>  // strlen, strcmp
#include <string>   // messages
#include <vector>   // encoded bytes

#include <zmq.hpp>  // zmq::message_t, the frame both sides parse

#include "chi/gpu/gpu_connect_info.h"      // DecodeGpuConnectInfo
#include "chi/transport/client_connect.h"  // ConnectRequest, ConnectAnswer, CheckConnectRequest
#include "chi/transport/shm_reconnect.h"   // ShmInfoFromAnswer
#include "chi/transport/zmq_common.h"      // ParseControl, MakeControl, control ids
#include "fuzz_check.h"                    // FuzzCheck, FuzzBytes

using chi::ConnectAnswer;
using chi::ConnectRequest;
using chi::Status;
using chi::u32;
using chi::fuzz::FuzzBytes;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;

namespace {

/** The bytes of a control message. */
std::vector<char> BytesOf(const zmq::message_t &m) {
  const char *p = static_cast<const char *>(m.data());
  return std::vector<char>(p, p + m.size());
}

/**
 * Encodes a decoded body as control message `id`, decodes that and encodes again: the
 * second encoding must be the first. Returns the first.
 */
template <typename T>
std::vector<char> CheckCanonical(chi::u64 id, T &body, const char *what) {
  const std::vector<char> once = BytesOf(chi::MakeControl(id, body));
  T again;
  FuzzCheck(chi::ParseControl(zmq::message_t(once.data(), once.size()), &again), what);
  FuzzCheck(BytesOf(chi::MakeControl(id, again)) == once, what);
  return once;
}

/** Encodes a decoded archive value alone, decodes and encodes again: the same bytes. */
template <typename T>
void CheckCanonicalValue(T &value, const char *what) {
  std::vector<char> once;
  chi::OutputArchive w(once);
  w(value);
  FuzzCheck(w.ok(), what);
  T again;
  chi::InputArchive r(once.data(), once.size());
  r(again);
  FuzzCheck(r.ok() && r.Remaining() == 0, what);
  std::vector<char> twice;
  chi::OutputArchive w2(twice);
  w2(again);
  FuzzCheck(twice == once, what);
}

/**
 * The client's reading of an answer: its Status says exactly what the runtime answered
 * (accepted, or the code and as much of the message as a Status holds); then the shm and
 * GPU parts, which either decode (and re-encode canonically) or are refused with a reason.
 */
void CheckClientView(const ConnectAnswer &answer) {
  const Status st = answer.ToStatus();
  FuzzCheck(st.ok() == (answer.rc == 0), "an answer's Status is ok exactly when rc is 0");
  FuzzCheck(static_cast<u32>(st.code()) == answer.rc, "an answer's Status carries its rc");
  if (!st.ok()) {
    const std::string said = answer.msg.substr(0, chi::Status::kMaxMessage - 1);
    FuzzCheck(std::string(st.message()) == said.substr(0, std::strlen(said.c_str())),
              "a refusal's Status carries the runtime's message");
  }
  chi::ShmServerInfo info;
  const Status shm = chi::ShmInfoFromAnswer(answer, &info);
  if (shm.ok()) {
    CheckCanonicalValue(info, "a decoded shm server description encodes canonically");
  } else {
    FuzzCheckRefusal(shm, "a refused shm description has a code and a message");
    FuzzCheck(shm.code() == chi::ErrorCode::kUnsupported,
              "a refused shm description is kUnsupported");
  }
  chi::gpu::GpuConnectInfo gpu;
  const Status g = chi::gpu::DecodeGpuConnectInfo(answer.gpu_info, &gpu);
  if (g.ok()) {
    const std::vector<char> once = chi::gpu::EncodeGpuConnectInfo(gpu);
    chi::gpu::GpuConnectInfo again;
    FuzzCheck(chi::gpu::DecodeGpuConnectInfo(once, &again).ok(), "a re-encoded GPU blob decodes");
    FuzzCheck(chi::gpu::EncodeGpuConnectInfo(again) == once,
              "a GPU blob's second encoding is the first");
  } else {
    FuzzCheckRefusal(g, "a refused GPU blob has a code and a message");
  }
}

/**
 * Runtime side, as ZmqServerSockets::HandleControl reads a kConnect message: a request that
 * decodes re-encodes canonically and is accepted or refused with a code and a message; the
 * answer the runtime then sends reads back on the client as exactly that verdict.
 */
void CheckRuntimeSide(const zmq::message_t &msg) {
  ConnectRequest req;
  if (!chi::ParseControl(msg, &req)) return;  // the runtime answers "malformed ClientConnect"
  CheckCanonical(chi::zmq_control::kConnect, req, "a decoded ConnectRequest encodes canonically");
  const Status verdict = chi::CheckConnectRequest(req);
  ConnectAnswer answer;
  if (verdict.ok()) {
    answer.client_id = 1;
  } else {
    FuzzCheckRefusal(verdict, "a refused ConnectRequest has a code and a message");
    answer.rc = static_cast<u32>(verdict.code());
    answer.msg = verdict.message();
  }
  const std::vector<char> reply = BytesOf(chi::MakeControl(chi::zmq_control::kAccept, answer));
  ConnectAnswer read;
  FuzzCheck(chi::ParseControl(zmq::message_t(reply.data(), reply.size()), &read),
            "the runtime's answer decodes on the client");
  const Status seen = read.ToStatus();
  FuzzCheck(seen.code() == verdict.code() &&
                std::strcmp(seen.message(), verdict.message()) == 0,
            "the client reads the runtime's verdict unchanged");
  CheckClientView(read);
}

/** Client side, as ZmqClientConnection::HandleControl reads a kAccept message. */
void CheckClientSide(const zmq::message_t &msg) {
  ConnectAnswer answer;
  if (!chi::ParseControl(msg, &answer)) return;  // the client fails: "malformed ... answer"
  CheckCanonical(chi::zmq_control::kAccept, answer, "a decoded ConnectAnswer encodes canonically");
  CheckClientView(answer);
}

}  // namespace

/** Byte 0 picks the side (even: the runtime's, odd: the client's); the rest is the message. */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzBytes in(data, size);
  const bool client = (in.TakeByte() & 1) != 0;
  const zmq::message_t msg(in.RestData(), in.RestSize());
  if (client) {
    CheckClientSide(msg);
  } else {
    CheckRuntimeSide(msg);
  }
  return 0;
}
