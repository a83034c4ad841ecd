// What dead runtimes leave on ports nobody takes again is swept: a dead runtime's segments
// and ipc socket file go once they are old enough and stay while young, a live runtime's
// stay however old, a half-made set of a crashed start goes, names of other shapes are
// never read as a runtime's, and starting a runtime sweeps the other ports.
#include <sys/socket.h>  // the ipc socket files a runtime binds
#include <sys/stat.h>    // utimensat: age a file
#include <sys/un.h>
#include <sys/wait.h>    // waitpid of the fabricating child

#include "cross_process_fixture.h"

using namespace xp_test;

namespace {

std::string UserPrefix() { return chi::UserSegmentFilePrefix(); }

/** The /dev/shm file of segment `name`. */
std::string ShmFile(const std::string &name) { return chi::PosixShmBackend::FilePath(name); }

/** The ipc socket file of the runtime on `port` (ZmqEndpoint's path). */
std::string IpcFile(u32 port) { return "/tmp/" + UserPrefix() + std::to_string(port) + ".ipc"; }

/** The files of a whole runtime's leftovers on `port`: three segments, transport, socket. */
std::vector<std::string> RuntimeFiles(u32 port) {
  std::vector<std::string> files = RuntimeSegmentFiles(port);
  files.push_back(IpcFile(port));
  return files;
}

/** Sets `path`'s modification time `age_s` seconds into the past. */
bool Age(const std::string &path, long age_s) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const timespec times[2] = {{now.tv_sec - age_s, 0}, {now.tv_sec - age_s, 0}};
  return utimensat(AT_FDCWD, path.c_str(), times, 0) == 0;
}

/** A unix socket listening on `path`, as ZeroMQ's ipc endpoint does (-1: failed). */
int Listen(const std::string &path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 4) != 0) {
    return -1;
  }
  return fd;
}

/** Small segments: these tests never serve from them. */
chi::ServerConfig SmallConfig() {
  chi::ServerConfig cfg;
  cfg.main_segment_bytes = 1 << 20;
  cfg.client_data_bytes = 1 << 20;
  cfg.runtime_data_bytes = 1 << 20;
  return cfg;
}

/** A runtime's whole set of leftovers on `port`, owned by this process (true when made). */
struct FakeRuntime {
  chi::RuntimeSegments segments;
  chi::ShmSegment transport;
  int socket_fd = -1;

  bool Make(u32 port) {
    chi::ShmGeometry g;
    g.num_slots = 1;
    g.ring_bytes = chi::ShmStream::kMinRingBytes;
    g.max_outstanding = 4;
    socket_fd = Listen(IpcFile(port));
    return segments.Create(SmallConfig(), port).ok() &&
           transport.Create(port, g, chi::SelfIdentity()).ok() && socket_fd >= 0;
  }
};

/** Leaves a dead runtime's whole set on `port`: a child makes it and dies (true when made). */
bool LeaveDeadRuntime(u32 port) {
  const pid_t pid = fork();
  if (pid == 0) {
    FakeRuntime fake;
    _exit(fake.Make(port) ? 0 : 1);  // no destructors: everything stays behind
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

/**
 * Rewrites the owner of a dead runtime's set on `port` as this process's pid with another
 * start time: its pid taken since by a live process. `transport`: the shm transport's header
 * too. True when the headers were there.
 */
bool GiveDeadRuntimeOurPid(u32 port, bool transport) {
  const chi::ProcessIdentity self = chi::SelfIdentity();
  chi::PosixShmBackend main;
  if (!main.Attach(chi::RuntimeSegmentName(port, "main")).ok()) return false;
  auto *h = reinterpret_cast<chi::RuntimeHeader *>(main.Data());
  h->pid_ = self.pid;
  h->start_ticks_ = self.start_ticks + 1;
  if (!transport) return true;
  chi::PosixShmBackend seg;
  if (!seg.Attach(chi::ShmSegmentName(port)).ok()) return false;
  auto *t = reinterpret_cast<chi::ShmSegmentHeader *>(seg.Data());
  t->runtime_pid_ = self.pid;
  t->runtime_start_ticks_ = self.start_ticks + 1;
  return true;
}

/** A sweep of `port` alone (other tests' leftovers are theirs to examine). */
chi::StaleSweep SweepPort(u32 port, u64 min_age_s) {
  chi::StaleSweepOptions o;
  o.min_age_s = min_age_s;
  o.first_port = port;
  o.last_port = port;
  return chi::SweepStaleSegments(o);
}

}  // namespace

TEST_CASE("names of other shapes are never read as a runtime's segments or sockets") {
  const u32 uid = static_cast<u32>(getuid());
  const std::string p = UserPrefix();
  u32 port = 0;
  std::string name;
  CHECK(chi::ParseRuntimeSegmentFile(p + "rt12345_main", &port, &name));
  CHECK(port == 12345);
  CHECK(name == "rt12345_main");
  CHECK(chi::ParseRuntimeSegmentFile(p + "rt7_rdata", &port, &name));
  CHECK(port == 7);
  CHECK(chi::ParseRuntimeSegmentFile(p + "shm_transport_65535", &port, &name));
  CHECK(name == "shm_transport_65535");
  const std::string other_user = "chi_" + std::to_string(uid + 1) + "_";
  const std::vector<std::string> not_segments = {
      p + "rt12345_other", p + "rt_main",          p + "rtx1_main",
      p + "rt65536_main",  p + "rt123456_main",    p + "shm_transport_",
      p + "shm_transport_12a", p + "rt12_main_x",  other_user + "rt12_main",
      p + "test_segment",  "rt12_main",      p + "rt012_main"};
  for (const std::string &bad : not_segments) {
    CAPTURE(bad);
    CHECK_FALSE(chi::ParseRuntimeSegmentFile(bad, &port, &name));
  }
  CHECK(chi::ParseIpcSocketFile(p + "10360.ipc", &port));
  CHECK(port == 10360);
  const std::vector<std::string> not_sockets = {p + ".ipc", p + "10360.ipcx", p + "x10360.ipc",
                                                p + "99999.ipc", other_user + "10360.ipc"};
  for (const std::string &bad : not_sockets) {
    CAPTURE(bad);
    CHECK_FALSE(chi::ParseIpcSocketFile(bad, &port));
  }
}

TEST_CASE("a dead runtime's segments and ipc socket file are swept once old enough") {
  const u32 port = TestPort(10);
  const std::vector<std::string> files = RuntimeFiles(port);
  REQUIRE(LeaveDeadRuntime(port));
  REQUIRE(CountExisting(files) == files.size());

  chi::StaleSweep young = SweepPort(port, 60);  // just made: a runtime may be starting
  CHECK(young.segments == 0);
  CHECK(young.sockets == 0);
  CHECK(young.young == 2);  // the segment set and the socket file
  CHECK(CountExisting(files) == files.size());

  chi::StaleSweep swept = SweepPort(port, 0);
  CHECK(swept.segments == 4);
  CHECK(swept.sockets == 1);
  CHECK(swept.young == 0);
  CHECK(swept.ports == std::vector<u32>{port});
  CHECK(CountExisting(files) == 0);
  bool stale = true;
  CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == 0);
  CHECK_FALSE(stale);
}

TEST_CASE("a live runtime's segments and socket are never swept, however old") {
  const u32 port = TestPort(11);
  const std::vector<std::string> files = RuntimeFiles(port);
  FakeRuntime live;
  REQUIRE(live.Make(port));
  for (const std::string &f : files) CHECK(Age(f, 3600));
  const chi::StaleSweep s = SweepPort(port, 0);
  CHECK(s.segments == 0);
  CHECK(s.sockets == 0);
  CHECK(s.ports.empty());
  CHECK(CountExisting(files) == files.size());
  live.segments.Destroy();
  live.transport.Destroy();
  close(live.socket_fd);
  unlink(IpcFile(port).c_str());
}

TEST_CASE("a half-made segment set of a crashed start is swept once old enough") {
  const u32 port = TestPort(12);
  const std::string name = chi::RuntimeSegmentName(port, "cdata");
  chi::PosixShmBackend seg;
  REQUIRE(seg.Create(name, 4096).ok());
  seg.Detach();  // its main segment never came: no header names an owner
  CHECK(SweepPort(port, 60).young == 1);
  CHECK(FileExists(ShmFile(name)));
  CHECK(Age(ShmFile(name), 120));
  const chi::StaleSweep s = SweepPort(port, 60);
  CHECK(s.segments == 1);
  CHECK_FALSE(FileExists(ShmFile(name)));
}

TEST_CASE("starting a runtime sweeps dead runtimes' leftovers on other ports") {
  const u32 dead_port = TestPort(13);
  const std::vector<std::string> files = RuntimeFiles(dead_port);
  REQUIRE(LeaveDeadRuntime(dead_port));
  for (const std::string &f : files) CHECK(Age(f, 2 * chi::kStaleSweepMinAgeS));
  ServerProcess server(TestPort(14));
  REQUIRE(server.ok());
  // The start sweeps right after making its own segments, which ServerProcess waits for.
  CHECK(chi_test::PollUntil([&] { return CountExisting(files) == 0; }, 10));
  ClientSession session(server.port(), "tcp");
  REQUIRE(session.ok());
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("a dead runtime's segments whose pid another process took since are stale") {
  const u32 port = TestPort(15);
  const std::vector<std::string> files = RuntimeFiles(port);
  REQUIRE(LeaveDeadRuntime(port));
  // The dead runtime's pid is now this process's (as after a restart with the same pid,
  // in a container that keeps /dev/shm): both headers name it, with the dead one's start.
  const chi::ProcessIdentity self = chi::SelfIdentity();
  REQUIRE(self.start_ticks != 0);
  REQUIRE(GiveDeadRuntimeOurPid(port, true));
  bool stale = false;
  CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == 0);  // not this process's set
  CHECK(stale);
  CHECK(chi::ShmSegment::CheckNotServed(chi::ShmSegmentName(port), port).ok());

  for (const std::string &f : files) CHECK(Age(f, 120));
  const chi::StaleSweep s = SweepPort(port, 60);
  CHECK(s.segments == 4);
  CHECK(s.sockets == 1);
  CHECK(CountExisting(files) == 0);

  // A runtime starting on the port with that pid takes it over (it used to refuse, naming
  // itself as the live runtime).
  REQUIRE(LeaveDeadRuntime(port));
  REQUIRE(GiveDeadRuntimeOurPid(port, false));
  chi::RuntimeSegments restarted;
  bool cleaned = false;
  const chi::Status st = restarted.Create(SmallConfig(), port, &cleaned);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cleaned);
  CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == self.pid);
  CHECK_FALSE(stale);
  restarted.Destroy();
  chi::PosixShmBackend::DestroyByName(chi::ShmSegmentName(port));
  unlink(IpcFile(port).c_str());
}

TEST_CASE("a segment set of another layout version is kept while its runtime lives") {
  const u32 port = TestPort(16);
  const std::vector<std::string> files = RuntimeFiles(port);
  REQUIRE(LeaveDeadRuntime(port));
  chi::PosixShmBackend main;
  REQUIRE(main.Attach(chi::RuntimeSegmentName(port, "main")).ok());
  auto *h = reinterpret_cast<chi::RuntimeHeader *>(main.Data());
  // An older build's runtime, still running: its layout differs past the pid.
  h->version_ = chi::kRuntimeHeaderVersion - 1;
  h->pid_ = static_cast<u32>(getpid());
  h->start_ticks_ = 12345;  // not a field of that layout: never compared
  bool stale = true;
  CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == static_cast<u32>(getpid()));
  CHECK_FALSE(stale);
  chi::RuntimeSegments newer;
  const chi::Status st = newer.Create(SmallConfig(), port);
  CHECK(st.code() == chi::ErrorCode::kAlreadyExists);  // a newer build does not remove it
  for (const std::string &f : files) CHECK(Age(f, 120));
  CHECK(SweepPort(port, 60).segments == 0);  // a live runtime's set is kept whole
  for (const char *role : chi::RuntimeSegments::kRoles) {
    CHECK(FileExists(ShmFile(chi::RuntimeSegmentName(port, role))));
  }

  const pid_t gone = fork();  // a pid that no longer runs
  if (gone == 0) _exit(0);
  REQUIRE(gone > 0);
  REQUIRE(waitpid(gone, nullptr, 0) == gone);
  h->pid_ = static_cast<u32>(gone);
  CHECK(chi::RuntimeSegments::FindOwner(port, &stale) == 0);
  CHECK(stale);
  main.Detach();
  const chi::StaleSweep s = SweepPort(port, 60);
  CHECK(s.segments == 4);
  CHECK(CountExisting(files) == 0);
}
