// What a standalone runtime does with bad input from raw peers on both of its ZeroMQ
// endpoints (ipc and tcp): garbage, truncated and multi-frame messages, tasks before the
// handshake, a handshake in another protocol version, a 1 GiB length prefix inside a task
// and a 1 GiB ZeroMQ frame. Each gets an error answer or a dropped connection, the
// runtime's memory does not grow with what it was sent, and its own clients stay served.
#include <sys/un.h>  // the raw peer on the ipc endpoint's socket

#include <algorithm>  // std::min of the truncation points

#include "cross_process_fixture.h"

using namespace xp_test;

namespace {

/** How much the runtime's resident memory may grow through all the bad input. */
constexpr u64 kRssAllowanceKib = 16 * 1024;

/**
 * ASan's options for the runtime child: freed memory is reused at once, as without ASan
 * (its quarantine would otherwise keep up to 256 MiB of freed garbage resident and make
 * the RSS check meaningless). A leak still shows: leaked blocks are never reused.
 */
std::string RuntimeAsanOptions() {
  const char *inherited = std::getenv("ASAN_OPTIONS");
  std::string opts = inherited != nullptr ? inherited : "";
  if (!opts.empty()) opts += ':';
  return opts + "quarantine_size_mb=0:thread_local_quarantine_size_kb=0";
}
/**
 * Garbage messages per endpoint, each of 32-64 KiB: ~112 MiB on each endpoint, so a leak
 * of even a seventh of each message's bytes would outgrow the allowance.
 */
constexpr int kGarbageMessages = 2048;
constexpr size_t kGarbageBytes = 64 << 10;
/** Garbage messages sent before their answers are read: what may queue in the runtime. */
constexpr int kGarbageWindow = 32;

/** A raw ZeroMQ DEALER on the runtime's `mode` endpoint ("ipc" or "tcp"). */
class RawPeer {
 public:
  /** Connects to the runtime on `port` (no handshake yet). */
  RawPeer(zmq::context_t &ctx, const std::string &mode, u32 port)
      : mode_(mode), socket_(ctx, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(chi::ZmqEndpoint(mode, port));
  }
  /** The endpoint's transport: "ipc" or "tcp". */
  const std::string &mode() const { return mode_; }
  /** The DEALER itself (for multi-frame sends). */
  zmq::socket_t &socket() { return socket_; }

  /** Sends one single-frame message. */
  void Send(const void *data, size_t len) {
    socket_.send(zmq::message_t(data, len), zmq::send_flags::none);
  }
  /** Sends `m` as one frame. */
  void Send(const std::vector<char> &m) { Send(m.data(), m.size()); }
  /**
   * The next message within 5 s (empty when none came), skipping the runtime's pings
   * (it pings a registered client that has been quiet, as this one may be for a while).
   */
  zmq::message_t Recv() { return chi_test::RecvSkippingPings(socket_, 5000); }

  /** Sends a handshake speaking `version` of the protocol; the runtime's answer code. */
  u32 Handshake(u32 version) { return chi_test::HandshakeCode(socket_, mode_.c_str(), version); }

 private:
  std::string mode_;
  zmq::socket_t socket_;
};

/** An encoded Custom request (id 77) to the demo pool carrying `data`. */
std::vector<char> EncodedCustom(const std::string &data) {
  chimaera::demo::CustomTask task(chi::TaskBuffer(data.data(), data.size()));
  return chi_test::RawRequest(task, kDemoPool, chimaera::demo::Method::kCustom, 77);
}

/**
 * Sends kGarbageMessages of up to 64 KiB, kGarbageWindow at a time, each window's answers
 * read before the next: even ones a 64 KiB request truncated past its middle, odd ones a
 * request id followed by random bytes. Every one must be answered with an error.
 */
void SendGarbage(RawPeer &peer, std::mt19937 &rng) {
  const std::vector<char> full = EncodedCustom(std::string(kGarbageBytes - 64, 'g'));
  std::vector<char> noise(2 * kGarbageBytes);
  for (char &b : noise) b = static_cast<char>(rng());
  int answers = 0, errors = 0;
  for (int base = 0; base < kGarbageMessages; base += kGarbageWindow) {
    for (int i = base; i < base + kGarbageWindow; ++i) {
      std::vector<char> bad;
      if (i % 2 == 0) {
        bad.assign(full.begin(), full.begin() + full.size() / 2 + rng() % (full.size() / 2));
      } else {
        const size_t at = rng() % kGarbageBytes;
        bad.assign(full.begin(), full.begin() + 8);  // the request id
        bad.insert(bad.end(), noise.begin() + at, noise.begin() + at + kGarbageBytes - 8);
      }
      peer.Send(bad);
    }
    for (int i = 0; i < kGarbageWindow; ++i) {
      zmq::message_t m = peer.Recv();
      if (m.size() == 0) break;
      ++answers;
      errors += AnswerCode(m) != 0 ? 1 : 0;
    }
  }
  CHECK(answers == kGarbageMessages);
  CHECK(errors == kGarbageMessages);
}

/**
 * Speaks ZMTP 3 on a connected stream socket as a DEALER and then announces a 1 GiB frame;
 * true when the runtime closes the connection (within 10 s).
 */
bool HugeFrameIsDropped(int fd) {
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
    closed = read(fd, buf, sizeof(buf)) <= 0;
  }
  close(fd);
  return closed;
}

/** A stream socket connected to the runtime's tcp endpoint (-1 on failure). */
int ConnectTcp(u32 port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

/** A stream socket connected to the runtime's ipc endpoint (-1 on failure). */
int ConnectIpc(u32 port) {
  const std::string path = chi::ZmqEndpoint("ipc", port).substr(std::string("ipc://").size());
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

}  // namespace

TEST_CASE("garbage from raw ZeroMQ peers is answered with errors and others are still served") {
  ServerProcess server(TestPort(6), {{"ASAN_OPTIONS", RuntimeAsanOptions()}});
  REQUIRE(server.ok());
  ClientSession session(server.port(), "ipc");
  REQUIRE(session.ok());
  chimaera::demo::Client c = DemoClient();
  const std::vector<char> request = EncodedCustom("hi");

  zmq::context_t ctx(1);
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (const char *mode : {"ipc", "tcp"}) {
    CAPTURE(mode);
    peers.push_back(std::make_unique<RawPeer>(ctx, mode, server.port()));
    RawPeer &peer = *peers.back();
    peer.Send("abc", 3);  // shorter than the envelope header
    zmq::message_t m = peer.Recv();
    REQUIRE(m.size() >= 8);
    CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kTruncated));
    peer.Send(request);  // a task before the handshake is refused
    m = peer.Recv();
    REQUIRE(m.size() >= 8);
    CHECK(chi::EnvelopeId(m.data()) == 77);
    CHECK(AnswerCode(m) == static_cast<u32>(chi::ErrorCode::kInvalidArgument));
    // A handshake in another protocol version is refused; the right one is accepted.
    CHECK(peer.Handshake(99) == static_cast<u32>(chi::ErrorCode::kVersionMismatch));
    CHECK(peer.Handshake(chi::kConnectProtocolVersion) == 0);
    peer.Send(request);  // now a well-formed request works
    CHECK(AnswerCode(peer.Recv()) == 0);
  }

  // From here on the runtime's memory may not grow with what it is sent.
  const u64 rss_before = RssKib(server.pid());
  REQUIRE(rss_before > 0);
  std::vector<char> huge = request;
  const u64 gib = 1ull << 30;
  const size_t len_at = huge.size() - 2 - sizeof(u64);  // the TaskBuffer length precedes "hi"
  std::memcpy(huge.data() + len_at, &gib, sizeof(gib));
  for (auto &peer : peers) {
    CAPTURE(peer->mode());
    peer->Send(huge);  // a 1 GiB length prefix in the payload is refused
    CHECK(AnswerCode(peer->Recv()) == static_cast<u32>(chi::ErrorCode::kMalformed));
    // A multi-frame message is refused.
    peer->socket().send(zmq::message_t(request.data(), request.size()), zmq::send_flags::sndmore);
    peer->Send(request);
    CHECK(AnswerCode(peer->Recv()) == static_cast<u32>(chi::ErrorCode::kMalformed));
  }
  CHECK(RssKib(server.pid()) < rss_before + kRssAllowanceKib);

  std::mt19937 rng(11);
  for (auto &peer : peers) {
    CAPTURE(peer->mode());
    SendGarbage(*peer, rng);
  }
  CHECK(RssKib(server.pid()) < rss_before + kRssAllowanceKib);

  // A raw peer announcing a 1 GiB ZeroMQ frame is disconnected, on either endpoint.
  const int tcp_fd = ConnectTcp(server.port());
  REQUIRE(tcp_fd >= 0);
  CHECK(HugeFrameIsDropped(tcp_fd));
  const int ipc_fd = ConnectIpc(server.port());
  REQUIRE(ipc_fd >= 0);
  CHECK(HugeFrameIsDropped(ipc_fd));
  CHECK(RssKib(server.pid()) < rss_before + kRssAllowanceKib);
  MESSAGE("runtime RSS: " << rss_before << " KiB before the bad input, "
                          << RssKib(server.pid()) << " KiB after");

  // The session's own client never noticed.
  CheckDemoCalls(c);
  peers.clear();
  ctx.close();
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}
