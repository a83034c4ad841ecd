// The one rule for the ports of tests that start runtimes. A port names a runtime's tcp
// endpoint, its ipc path and its shared-memory segments ("shm_transport_<port>",
// "rt<port>_*"), so two test processes that pick the same port at once break each other.
// Each fixture owns a range of its own: a test process claims a block of that range (the
// first free one from its pid's, held with an flock on a file in /tmp for the process's
// life, so two test processes never share a block), and a test picks a port of its
// block by index. Every range lies below
// Linux's ephemeral ports (32768-60999, net.ipv4.ip_local_port_range), from which the
// kernel takes the local ports of tcp connections, so a test's listener never races one.
//
//   10000-19999  cross_process_fixture.h  (500 blocks of 20)
//   20000-29999  shm_transport_fixture.h  (1250 blocks of 8)
//   30000-32767  tests/tools_smoke.sh     (one port, claimed the same way with flock(1))
#pragma once

#include <fcntl.h>     // open of the block's lock file
#include <sys/file.h>  // flock
#include <unistd.h>    // getpid

#include <cstdint>
#include <cstdlib>        // abort
#include <mutex>          // one claim per range and process
#include <string>         // lock file names
#include <unordered_map>  // claimed blocks by range

namespace chi_test {

/** The first port Linux hands out for outgoing connections by default. */
inline constexpr uint32_t kEphemeralPortStart = 32768;

/** A fixture's ports: `blocks` blocks of `width` ports from `base`, one block per pid. */
struct PortRange {
  uint32_t base;
  uint32_t width;
  uint32_t blocks;

  /** One past the range's last port. */
  constexpr uint32_t End() const { return base + width * blocks; }
  /**
   * Port n of this process's block: the same for one process, never another live test
   * process's (Block). An n past the block would take another block's port, so it aborts
   * the test instead.
   */
  uint32_t Port(uint32_t n) const {
    if (n >= width) std::abort();
    return base + width * Block() + n;
  }

  /**
   * This process's block of the range: claimed on first use, trying blocks from the
   * pid's onwards, and held until the process exits (the lock file's descriptor stays
   * open; it is not inherited by children, whom the parent tells their ports). Aborts
   * when every block is taken.
   */
  uint32_t Block() const {
    static std::mutex mu;
    static std::unordered_map<uint32_t, uint32_t> claimed;  // by base
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = claimed.find(base); it != claimed.end()) return it->second;
    const uint32_t first = static_cast<uint32_t>(getpid()) % blocks;
    for (uint32_t k = 0; k < blocks; ++k) {
      const uint32_t b = (first + k) % blocks;
      const std::string path = "/tmp/chi_test_ports_" + std::to_string(getuid()) + "_" +
                                std::to_string(base + width * b) + ".lock";
      const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        claimed.emplace(base, b);  // fd stays open: the claim lasts as long as we do
        return b;
      }
      close(fd);
    }
    std::abort();
  }
};

/** cross_process_fixture.h: standalone runtimes and their clients (TestPort(n), n < 20). */
inline constexpr PortRange kCrossProcessPorts{10000, 20, 500};
/** shm_transport_fixture.h: bare shm transport runtimes (TestPort(k), k < 8). */
inline constexpr PortRange kShmTransportPorts{20000, 8, 1250};
/** tests/tools_smoke.sh picks its port in [30000, 32768) by itself (a shell script). */
inline constexpr PortRange kToolsSmokePorts{30000, 1, 2768};

static_assert(kCrossProcessPorts.base >= 1024, "unprivileged ports only");
static_assert(kCrossProcessPorts.End() <= kShmTransportPorts.base, "ranges must be disjoint");
static_assert(kShmTransportPorts.End() <= kToolsSmokePorts.base, "ranges must be disjoint");
static_assert(kToolsSmokePorts.End() <= kEphemeralPortStart, "test ports stay below 32768");

}  // namespace chi_test
