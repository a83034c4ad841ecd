// Sweeping what dead runtimes left behind on any port of this user: their shared segments
// ("rt<port>_{main,cdata,rdata}", "shm_transport_<port>" in /dev/shm) and their ZeroMQ ipc
// socket files (/tmp/chi_<uid>_<port>.ipc). A runtime removes its own port's leftovers when
// it starts (RuntimeSegments::Create); a crash on a port no runtime takes again left them
// until the node rebooted. Every runtime start now sweeps the other ports too, and
// `chimaera runtime clean` sweeps on demand.
//
// Invariant: a port's segments are removed only when no live process owns them (neither
// the main header's runtime nor the transport header's) and each was created at least the
// minimum age ago: a runtime starting right now has young segments whose headers may not
// be written yet. An ipc socket file is removed only when nothing listens on it (connect
// is refused) and it is as old.
#pragma once

#include <dirent.h>      // opendir, readdir
#include <sys/socket.h>  // connect: does anything listen on an ipc socket file
#include <sys/stat.h>    // stat: the creation (modification) time
#include <sys/un.h>      // sockaddr_un
#include <time.h>        // clock_gettime(CLOCK_REALTIME), to compare with file times
#include <unistd.h>      // unlink, close

#include <algorithm>    // sort, unique of the swept ports
#include <cerrno>       // ECONNREFUSED
#include <cstring>      // memcpy of the socket path
#include <map>          // segments by port
#include <string>       // names
#include <string_view>  // parsing
#include <vector>       // results

#include "chi/core/types.h"                   // u32, u64
#include "chi/memory/posix_shm_backend.h"     // DestroyByName, kShmDir
#include "chi/transport/client_connect.h"     // RuntimeSegments::FindOwner
#include "chi/transport/shm_segment.h"        // ShmSegment::CheckNotServed
#include "chi/transport/zmq_common.h"         // ZmqEndpoint: the ipc socket path

namespace chi {

/** Seconds a dead runtime's leftovers must have existed before a runtime start sweeps them. */
inline constexpr u64 kStaleSweepMinAgeS = 60;

/** Where to look and what to spare (defaults: this user's files, every port, one minute). */
struct StaleSweepOptions {
  u64 min_age_s = kStaleSweepMinAgeS;  ///< younger leftovers stay (see the invariant)
  u32 skip_port = 0;                   ///< a port never swept (the caller's own; 0: none)
  u32 first_port = 0;                  ///< only ports in [first_port, last_port]
  u32 last_port = 65535;
};

/** What a sweep removed, and what it left because it was too young. */
struct StaleSweep {
  std::vector<u32> ports;  ///< ports with anything removed, ascending
  u32 segments = 0;        ///< shared segments removed
  u32 sockets = 0;         ///< ipc socket files removed
  u32 young = 0;           ///< dead leftovers spared for their age (a later sweep takes them)
};

namespace detail {

/** Reads a port: 1 to 5 decimal digits, at most 65535; false for anything else. */
inline bool ParsePort(std::string_view digits, u32 *port) {
  if (digits.empty() || digits.size() > 5) return false;
  u32 v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<u32>(c - '0');
  }
  if (v > 65535) return false;
  *port = v;
  return true;
}

/** Reads the port in the first run of digits of `s` at or after `from`; false if none is one. */
inline bool FirstPort(std::string_view s, size_t from, u32 *port) {
  const size_t first = s.find_first_of("0123456789", from);
  if (first == std::string_view::npos) return false;
  const size_t end = s.find_first_not_of("0123456789", first);
  return ParsePort(s.substr(first, end - first), port);  // npos - first: to the end
}

/** Seconds since `path` was last modified (created, for our files); false when it is gone. */
inline bool FileAgeS(const std::string &path, u64 *age_s) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return false;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  *age_s = now.tv_sec > st.st_mtim.tv_sec ? static_cast<u64>(now.tv_sec - st.st_mtim.tv_sec) : 0;
  return true;
}

/** True when something listens on unix socket `path` (a live ZeroMQ ipc endpoint). */
inline bool SocketListening(const std::string &path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return true;  // cannot tell: keep it
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  const bool refused =
      connect(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof(addr)) != 0 &&
      (errno == ECONNREFUSED || errno == ENOENT);
  close(fd);
  return !refused;
}

/**
 * Removes the files `paths` (absolute) of one dead port that are at least `min_age_s` old,
 * counting them in *removed; true when one was spared for its age.
 */
template <typename Remove>
bool RemoveIfOld(const std::vector<std::string> &paths, u64 min_age_s, Remove remove,
                 u32 *removed) {
  bool spared = false;
  for (const std::string &path : paths) {
    u64 age = 0;  // read just before the removal: a runtime may be starting on the port
    if (!FileAgeS(path, &age)) continue;
    if (age < min_age_s) {
      spared = true;
    } else if (remove(path)) {
      ++*removed;
    }
  }
  return spared;
}

}  // namespace detail

/**
 * This user's file name prefix for shared segments ("chi_<uid>_"): PosixShmBackend::OsName
 * without its leading slash.
 */
inline std::string UserSegmentFilePrefix() { return PosixShmBackend::OsName("").substr(1); }

/**
 * The port of a runtime segment of this user, from its file name in /dev/shm; false for any
 * other name. A name counts only when RuntimeSegmentName or ShmSegmentName would make it
 * for that port. *name gets the segment's name as PosixShmBackend knows it (no prefix).
 */
inline bool ParseRuntimeSegmentFile(std::string_view file, u32 *port, std::string *name) {
  const std::string prefix = UserSegmentFilePrefix();
  if (file.substr(0, prefix.size()) != prefix) return false;
  const std::string_view rest = file.substr(prefix.size());
  u32 p = 0;
  if (!detail::FirstPort(rest, 0, &p)) return false;
  bool ok = rest == ShmSegmentName(p);
  for (const char *role : RuntimeSegments::kRoles) ok = ok || rest == RuntimeSegmentName(p, role);
  if (!ok) return false;
  *port = p;
  *name = std::string(rest);
  return true;
}

/**
 * The port of a runtime's ipc socket file of this user, from its name in /tmp; false unless
 * ZmqEndpoint("ipc", port) names exactly that file.
 */
inline bool ParseIpcSocketFile(std::string_view file, u32 *port) {
  u32 p = 0;
  if (!detail::FirstPort(file, UserSegmentFilePrefix().size(), &p)) return false;
  if (ZmqEndpoint("ipc", p) != "ipc:///tmp/" + std::string(file)) return false;
  *port = p;
  return true;
}

/**
 * Removes the leftovers of dead runtimes of this user (the invariant above says which).
 * Never fails: what it cannot read or remove stays, as it was.
 */
inline StaleSweep SweepStaleSegments(const StaleSweepOptions &o = {}) {
  const auto wanted = [&](u32 port) {
    return port != o.skip_port && port >= o.first_port && port <= o.last_port;
  };
  StaleSweep out;
  std::map<u32, std::vector<std::string>> segments;  // by port: names without the prefix
  if (DIR *dir = opendir(kShmDir)) {
    while (const dirent *e = readdir(dir)) {
      u32 port = 0;
      std::string name;
      if (ParseRuntimeSegmentFile(e->d_name, &port, &name) && wanted(port)) {
        segments[port].push_back(std::move(name));
      }
    }
    closedir(dir);
  }
  const std::string file_prefix = std::string(kShmDir) + "/" + UserSegmentFilePrefix();
  for (const auto &[port, names] : segments) {
    bool stale = false;
    if (RuntimeSegments::FindOwner(port, &stale) != 0) continue;  // its runtime runs
    if (!ShmSegment::CheckNotServed(ShmSegmentName(port), port).ok()) continue;
    std::vector<std::string> paths;
    for (const std::string &name : names) paths.push_back(file_prefix + name);
    const u32 before = out.segments;
    const auto destroy = [&](const std::string &path) {
      return PosixShmBackend::DestroyByName(path.substr(file_prefix.size())).ok();
    };
    out.young += detail::RemoveIfOld(paths, o.min_age_s, destroy, &out.segments) ? 1 : 0;
    if (out.segments != before) out.ports.push_back(port);
  }
  std::vector<u32> socket_ports;  // the ipc endpoints' files (ZmqEndpoint's path)
  if (DIR *dir = opendir("/tmp")) {
    while (const dirent *e = readdir(dir)) {
      u32 port = 0;
      if (ParseIpcSocketFile(e->d_name, &port) && wanted(port)) socket_ports.push_back(port);
    }
    closedir(dir);
  }
  for (u32 port : socket_ports) {
    const std::string path = ZmqEndpoint("ipc", port).substr(std::strlen("ipc://"));
    if (detail::SocketListening(path)) continue;
    const u32 before = out.sockets;
    const auto unlink_file = [](const std::string &p) { return unlink(p.c_str()) == 0; };
    out.young += detail::RemoveIfOld({path}, o.min_age_s, unlink_file, &out.sockets) ? 1 : 0;
    if (out.sockets != before) out.ports.push_back(port);
  }
  std::sort(out.ports.begin(), out.ports.end());
  out.ports.erase(std::unique(out.ports.begin(), out.ports.end()), out.ports.end());
  return out;
}

}  // namespace chi
