// Who a client of a standalone runtime is comes from its transport, never from the bytes of
// its requests: RegisterMemory and ReadRegistered act for the sending process alone (never
// for the runtime's own pid), a client's host memory is copied by the kernel inside the range
// it registered, and only the runtime's user may stop it or destroy pools. A tcp client is
// that user only when it presents the key from the runtime's 0600 segment; a process of
// another user (the test drops to nobody when it runs as root) is refused over tcp and ipc.
// The standalone runtime tool serves the demo (test) module only when asked to.
#include <doctest/doctest.h>

#include <grp.h>       // setgroups: the nobody child drops root's groups
#include <sys/stat.h>  // chmod of the ipc socket

#include "cross_process_fixture.h"
#include "temp_file.h"

using namespace xp_test;

namespace {

using chi::ErrorCode;

constexpr u32 kNobody = 65534;

/** An ErrorCode as the u32 a task's return code holds. */
u32 Code(ErrorCode c) { return static_cast<u32>(c); }

/**
 * Sends t through the session's transport with its task id naming process `pid`, as a
 * client that forges the id would (the runtime once took the sender from there).
 */
template <typename T>
chi::Future<T> SendNaming(T *t, u32 pid) {
  chi::GetIpcManager().Stamp(t);
  t->task_id_.pid_ = pid;
  REQUIRE(chi::Chimaera::Get().GetTransport()->Send(t));
  return chi::Future<T>(t);
}

/** An admin RegisterMemory of host memory at `address` that names process `pid`. */
chi::Future<chimaera::admin::RegisterMemoryTask> RegisterNaming(u32 pid, u64 address) {
  chi::gpu::MemoryRegistration reg;
  reg.pid = pid;
  reg.type = chi::gpu::MemoryType::kCpuMemory;
  reg.address = address;
  reg.bytes = 4096;
  auto *t = chi::NewTask<chimaera::admin::RegisterMemoryTask>(reg);
  t->pool_id_ = chi::kAdminPoolId;
  t->pool_query_ = chi::PoolQuery::Local();
  t->method_ = chimaera::admin::Method::kRegisterMemory;
  return SendNaming(t, pid);
}

/** A demo ReadRegistered of [address, address + bytes) whose task id names `pid`. */
chi::Future<chimaera::demo::ReadRegisteredTask> ReadNaming(u32 pid, u64 address, u64 bytes) {
  auto *t = chi::NewTask<chimaera::demo::ReadRegisteredTask>(address, bytes);
  t->pool_id_ = kDemoPool;
  t->pool_query_ = chi::PoolQuery::Local();
  t->method_ = chimaera::demo::Method::kReadRegistered;
  return SendNaming(t, pid);
}

/** A raw DEALER connected to `endpoint`. */
std::unique_ptr<zmq::socket_t> RawPeer(zmq::context_t &ctx, const std::string &endpoint) {
  auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  s->set(zmq::sockopt::linger, 0);
  s->connect(endpoint);
  return s;
}

/**
 * A handshake that claims uid `uid` and presents `key` (empty: none); the runtime's answer
 * code (~0u when none came).
 */
u32 Handshake(zmq::socket_t &s, const char *mode, u32 uid, const std::string &key) {
  chi::ConnectRequest hello;
  hello.pid = static_cast<u32>(getpid());
  hello.uid = uid;
  hello.mode = mode;
  hello.key = key;
  s.send(chi::MakeControl(chi::zmq_control::kConnect, hello), zmq::send_flags::none);
  chi::ConnectAnswer answer;
  zmq::message_t m = chi_test::RecvSkippingPings(s, 5000);
  return chi::ParseControl(m, &answer) ? answer.rc : ~0u;
}

/** Sends `request` on a raw peer; the answer's code (~0u when none came). */
u32 RawCall(zmq::socket_t &s, const std::vector<char> &request) {
  s.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::none);
  return chi_test::AnswerCode(chi_test::RecvSkippingPings(s, 5000));
}

/** The request bytes of an admin StopRuntime. */
std::vector<char> StopRequest() {
  chimaera::admin::StopRuntimeTask t;
  return chi_test::RawRequest(t, chi::kAdminPoolId, chimaera::admin::Method::kStopRuntime, 1);
}

/** The request bytes of an admin DestroyPool of the demo pool. */
std::vector<char> DestroyRequest() {
  chimaera::admin::DestroyPoolTask t(kDemoPool);
  return chi_test::RawRequest(t, chi::kAdminPoolId, chimaera::admin::Method::kDestroyPool, 2);
}

/** The request bytes of an admin RegisterMemory of this process's memory. */
std::vector<char> RegisterRequest() {
  chi::gpu::MemoryRegistration reg;
  reg.pid = static_cast<u32>(getpid());
  reg.address = reinterpret_cast<u64>(&reg);
  reg.bytes = sizeof(reg);
  chimaera::admin::RegisterMemoryTask t(reg);
  return chi_test::RawRequest(t, chi::kAdminPoolId, chimaera::admin::Method::kRegisterMemory, 3);
}

/**
 * A client of another user: drops from root to nobody, then over tcp (claiming uid 0 in
 * its handshake, without the key it cannot read) asks to stop the runtime, destroy its demo
 * pool and register memory, and over ipc (whose socket the parent opened to everyone) tries
 * to connect as uid 0.
 */
int NobodyClientMain() {
  DieWithParent();
  chi_test::ChildChecks checks;
  const u32 port = static_cast<u32>(EnvU64("CHI_PORT"));
  if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) {
    checks.Expect(false, "drop to nobody");
    return checks.Result();
  }
  checks.Expect(getuid() == kNobody, "runs as nobody");
  checks.Expect(chi::ReadRuntimeKey(port).empty(), "the runtime's key is unreadable to nobody");
  zmq::context_t ctx;
  {
    auto tcp = RawPeer(ctx, chi::ZmqEndpoint("tcp", port));
    checks.Expect(Handshake(*tcp, "tcp", 0, "") == 0, "tcp handshake accepted (as nobody known)");
    checks.Expect(RawCall(*tcp, StopRequest()) == Code(ErrorCode::kPermissionDenied),
                  "StopRuntime over tcp refused");
    checks.Expect(RawCall(*tcp, DestroyRequest()) == Code(ErrorCode::kPermissionDenied),
                  "DestroyPool over tcp refused");
    checks.Expect(RawCall(*tcp, RegisterRequest()) == Code(ErrorCode::kPermissionDenied),
                  "RegisterMemory over tcp refused");
  }
  {
    auto ipc = RawPeer(ctx, EnvStr("CHI_TEST_IPC_ENDPOINT"));
    checks.Expect(Handshake(*ipc, "ipc", 0, "") == Code(ErrorCode::kPermissionDenied),
                  "ipc handshake of another uid refused by the socket's credentials");
  }
  return checks.Result();
}
chi_test::ChildRoutine kNobodyClientRoutine("tb_nobody_client", NobodyClientMain);

/**
 * Starts the chimaera_start_runtime tool on `port` with `args` and configuration file
 * `conf` ("" for none); returns its pid once it serves, -1 when it did not come up.
 */
pid_t StartTool(u32 port, const std::vector<std::string> &args, const std::string &conf) {
  const char *dir = std::getenv("CHI_TEST_TOOLS_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "CHI_TEST_TOOLS_DIR names the built tools (tests/CMakeLists.txt)");
  const std::string exe = std::string(dir) + "/chimaera_start_runtime";
  const pid_t pid = fork();
  if (pid == 0) {
    DieWithParent();
    setenv("CHI_PORT", std::to_string(port).c_str(), 1);
    setenv("CHI_SERVER_CONF", conf.c_str(), 1);
    std::vector<char *> argv{const_cast<char *>(exe.c_str())};
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  const bool up = chi_test::PollUntil(
      [&] {
        bool stale = false;
        return chi::RuntimeSegments::FindOwner(port, &stale) == static_cast<u32>(pid);
      },
      20);
  if (!up) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

}  // namespace

TEST_CASE("the standalone runtime serves the demo module only with --with-demo or a compose") {
  const u32 port = TestPort(8);
  auto create = [&] {
    ClientSession session(port, "ipc");
    REQUIRE(session.ok());
    auto f = chimaera::demo::Client().AsyncCreate(chi::PoolQuery::Dynamic(), "tb_demo", kDemoPool);
    REQUIRE(f.Wait(20));
    const u32 rc = f->GetReturnCode();
    if (rc != 0) CHECK(std::string(f->GetMessage()).find("chimaera_demo") != std::string::npos);
    CHECK(StopThroughSession());
    return rc;
  };
  pid_t pid = StartTool(port, {}, "");
  REQUIRE(pid > 0);
  CHECK(create() == Code(ErrorCode::kUnknownModule));
  CHECK(chi_test::WaitChild(pid, 30) == 0);

  pid = StartTool(port, {"--with-demo"}, "");
  REQUIRE(pid > 0);
  CHECK(create() == 0);
  CHECK(chi_test::WaitChild(pid, 30) == 0);

  chi_test::TempFile conf(
      "compose:\n"
      "  - mod_name: chimaera_demo\n"
      "    pool_name: tb_demo\n"
      "    pool_id: " + kDemoPool.ToString() + "\n");
  pid = StartTool(port, {}, conf.path());
  REQUIRE(pid > 0);
  CHECK(create() == 0);  // the composed pool, found by name
  CHECK(chi_test::WaitChild(pid, 30) == 0);

  pid = StartTool(port, {"--with-dmeo"}, "");  // a typo is refused, not ignored
  CHECK(pid == -1);
}

TEST_CASE("RegisterMemory for another pid or the runtime's own is refused, over every transport") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ServerProcess server(TestPort(mode == "shm" ? 0 : mode == "ipc" ? 1 : 2));
    REQUIRE(server.ok());
    ClientSession session(server.port(), mode);
    REQUIRE(session.ok());
    chimaera::demo::Client demo = DemoClient();
    const u32 runtime = static_cast<u32>(server.pid());
    // The runtime's own heap (it would be echoed back by ReadRegistered), and address 0x10
    // (which once crashed it), registered in the runtime's name.
    for (u64 address : {u64{0x10}, u64{0x400000}}) {
      auto reg = RegisterNaming(runtime, address);
      REQUIRE(reg.Wait(20));
      CHECK(reg->GetReturnCode() == Code(ErrorCode::kPermissionDenied));
      CHECK(std::string(reg->GetMessage()).find("RegisterMemory") != std::string::npos);
    }
    auto other = RegisterNaming(1, 0x10);  // another live process (init)
    REQUIRE(other.Wait(20));
    CHECK(other->GetReturnCode() == Code(ErrorCode::kPermissionDenied));
    // Whatever the request says, ReadRegistered reads the sender's registrations: none.
    for (u32 named : {runtime, static_cast<u32>(getpid())}) {
      auto read = ReadNaming(named, 0x10, 16);
      REQUIRE(read.Wait(20));
      CHECK(read->GetReturnCode() ==
            Code(mode == "tcp" ? ErrorCode::kPermissionDenied : ErrorCode::kNotFound));
    }
    auto alive = demo.AsyncCustom(chi::PoolQuery::Local(), std::string("still serving"));
    REQUIRE(alive.Wait(20));
    CHECK(alive->GetReturnCode() == 0);
    CHECK(StopThroughSession());
    CHECK(server.WaitExit() == 0);
  }
}

TEST_CASE("a client's own host memory is read by the kernel over shm and ipc; tcp is refused") {
  for (const std::string &mode : Transports()) {
    CAPTURE(mode);
    ServerProcess server(TestPort(mode == "shm" ? 3 : mode == "ipc" ? 4 : 5));
    REQUIRE(server.ok());
    ClientSession session(server.port(), mode);
    REQUIRE(session.ok());
    chimaera::demo::Client demo = DemoClient();
    std::vector<char> mine(1 << 20);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<char>(i * 7 + 3);
    const chi::Status st = chi::GetIpcManager().RegisterMemory(
        mine.data() + 4096, 65536, chi::gpu::MemoryType::kCpuMemory);
    if (mode == "tcp") {
      CHECK(st.code() == ErrorCode::kPermissionDenied);
      CHECK(std::string(st.message()).find("tcp") != std::string::npos);
    } else {
      REQUIRE_MESSAGE(st.ok(), st.ToString());
      const char *base = mine.data() + 4096;
      auto whole = demo.AsyncReadRegistered(chi::PoolQuery::Local(), base, 65536);
      REQUIRE(whole.Wait(20));
      REQUIRE_MESSAGE(whole->GetReturnCode() == 0, whole->GetMessage());
      CHECK(whole->checksum_ == chimaera::demo::Checksum(mine.data() + 4096, 65536));
      // One byte outside the registered range on either side is not there.
      for (const char *at : {base - 1, base + 65536 - 15}) {
        auto outside = demo.AsyncReadRegistered(chi::PoolQuery::Local(), at, 16);
        REQUIRE(outside.Wait(20));
        CHECK(outside->GetReturnCode() == Code(ErrorCode::kNotFound));
      }
    }
    CHECK(StopThroughSession());
    CHECK(server.WaitExit() == 0);
  }
}

TEST_CASE("a tcp client that does not present the runtime's key cannot stop it; one that does can") {
  ServerProcess server(TestPort(6));
  REQUIRE(server.ok());
  {
    ClientSession session(server.port(), "ipc");  // the demo pool, for DestroyPool to aim at
    REQUIRE(session.ok());
    DemoClient();
  }
  zmq::context_t ctx;
  const std::string endpoint = chi::ZmqEndpoint("tcp", server.port());
  auto stranger = RawPeer(ctx, endpoint);
  REQUIRE(Handshake(*stranger, "tcp", static_cast<u32>(getuid()), "") == 0);
  CHECK(RawCall(*stranger, StopRequest()) == Code(ErrorCode::kPermissionDenied));
  CHECK(RawCall(*stranger, DestroyRequest()) == Code(ErrorCode::kPermissionDenied));
  auto forger = RawPeer(ctx, endpoint);
  REQUIRE(Handshake(*forger, "tcp", static_cast<u32>(getuid()), std::string(32, 'k')) == 0);
  CHECK(RawCall(*forger, StopRequest()) == Code(ErrorCode::kPermissionDenied));
  const std::string key = chi::ReadRuntimeKey(server.port());
  REQUIRE(key.size() == chi::kRuntimeKeyBytes);
  auto owner = RawPeer(ctx, endpoint);
  REQUIRE(Handshake(*owner, "tcp", static_cast<u32>(getuid()), key) == 0);
  CHECK(RawCall(*owner, DestroyRequest()) == 0);
  CHECK(RawCall(*owner, StopRequest()) == 0);
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("StopRuntime and DestroyPool from another user are refused over tcp and ipc") {
  if (getuid() != 0) {
    WARN_MESSAGE(false, "not root: no second user to run a client as (CI runs this as root)");
    return;
  }
  ServerProcess server(TestPort(7));
  REQUIRE(server.ok());
  ClientSession session(server.port(), "shm");
  REQUIRE(session.ok());
  chimaera::demo::Client demo = DemoClient();
  const std::string ipc = chi::ZmqEndpoint("ipc", server.port());
  // Let nobody reach the socket at all: only its credentials can turn it away then.
  REQUIRE(chmod(ipc.c_str() + std::strlen("ipc://"), 0777) == 0);
  CHECK(chi_test::RunChild("tb_nobody_client",
                           {{"CHI_PORT", std::to_string(server.port())},
                            {"CHI_TEST_IPC_ENDPOINT", ipc}},
                           60) == 0);
  // Nothing the stranger asked for happened: the pool and the runtime serve on.
  auto alive = demo.AsyncCustom(chi::PoolQuery::Local(), std::string("after the stranger"));
  REQUIRE(alive.Wait(20));
  CHECK(alive->GetReturnCode() == 0);
  CHECK(alive->data_.view() == "after the stranger");
  CHECK(StopThroughSession());
  CHECK(server.WaitExit() == 0);
}
