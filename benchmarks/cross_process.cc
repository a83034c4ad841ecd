// Cross-process clients of a standalone runtime, per transport: the task round
// trip (GpuSubmit, 16 B in and out) next to its floor measured in the same run
// (two-process shared-memory flag ping-pong for shm; raw ZeroMQ REQ/REP over the
// same endpoint type for ipc/tcp), then throughput with 1 and 4 client processes.
// The runtime, the floors' peers and the extra clients are this binary re-executed
// with a role argument.
//   bench_cross_process [round_trips=3000] [tasks_per_client=20000]
#include <fcntl.h>     // pipes for child reports
#include <signal.h>    // killing the runtime on failure
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execl, getpid

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // the runtime child serves the demo module

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench_util.h"

namespace {

using chi::u64;

constexpr chi::PoolId kPool(400, 0);

/** Runs this binary again with `args` and extra environment; stdout to `out_fd` when >= 0. */
pid_t Spawn(const std::vector<std::string> &args,
            const std::vector<std::pair<std::string, std::string>> &env, int out_fd = -1) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto &kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    std::vector<char *> argv;
    argv.push_back(const_cast<char *>("bench_cross_process"));
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- Child roles ----

/** The runtime. */
int ServerRole() {
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true)) return 1;
  chi::Chimaera::Get().WaitForStop();
  chi::CHIMAERA_FINALIZE();
  return 0;
}

/** The floor's server: echoes 16-byte messages on a REP socket until told to stop. */
int RepRole(const std::string &endpoint) {
  zmq::context_t ctx(1);
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  // Linger: the echo of the stop message must leave before close (with 0 it was at times
  // dropped, and the measuring process waited for it forever).
  rep.set(zmq::sockopt::linger, 1000);
  rep.bind(endpoint);
  for (;;) {
    zmq::message_t m;
    if (!rep.recv(m, zmq::recv_flags::none)) break;
    const bool last = m.size() == 1;
    rep.send(m, zmq::send_flags::none);
    if (last) break;
  }
  rep.close();
  ctx.close();
  return 0;
}

/** Two flags on separate cache lines: the shm floor's ping-pong. */
struct PingPong {
  alignas(64) chi::Atomic<u64> ping;
  alignas(64) chi::Atomic<u64> pong;
};
constexpr u64 kPingStop = ~0ull;

/** The shm floor's peer: answers every ping with the same value until kPingStop. */
int PongRole(const std::string &segment) {
  chi::PosixShmBackend seg;
  if (!seg.Attach(segment).ok()) return 1;
  auto *pp = reinterpret_cast<PingPong *>(seg.Data());
  u64 last = 0;
  for (;;) {
    const u64 v = pp->ping.Load(chi::MemOrder::kAcquire);  // acquire: pairs with the ping
    if (v == kPingStop) break;
    if (v != last) {
      pp->pong.Store(v, chi::MemOrder::kRelease);  // release: the answer after the read
      last = v;
    } else {
      chi::CpuRelax();
    }
  }
  return 0;
}

/** Median round trip of a two-process spinning flag ping-pong in shared memory. */
double ShmPingPongNs(int round_trips) {
  const std::string name = "bench_xp_pingpong_" + std::to_string(getpid());
  chi::PosixShmBackend seg;
  if (!seg.Create(name, sizeof(PingPong), chi::CreateMode::kReplace).ok()) return 0;
  auto *pp = new (seg.Data()) PingPong();
  const pid_t peer = Spawn({"--pong", name}, {});
  std::vector<double> samples;
  u64 v = 0;
  for (int i = 0; i < round_trips + 200; ++i) {
    const double t0 = chi_bench::NowNs();
    pp->ping.Store(++v, chi::MemOrder::kRelease);
    while (pp->pong.Load(chi::MemOrder::kAcquire) != v) chi::CpuRelax();
    if (i >= 200) samples.push_back(chi_bench::NowNs() - t0);
  }
  pp->ping.Store(kPingStop, chi::MemOrder::kRelease);
  WaitExit(peer);
  seg.Destroy();
  return chi_bench::Median(samples);
}

/** Connects this process as a pure client over `mode` and creates the pool. */
bool Connect(chimaera::demo::Client *c) {
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) return false;
  auto f = c->AsyncCreate(chi::PoolQuery::Dynamic(), "bench_xp", kPool);
  return f.Wait(20) && f->GetReturnCode() == 0;
}

/** Submits `tasks` GpuSubmit calls with up to 256 in flight; false on a wrong answer. */
bool Stream(chimaera::demo::Client &c, u64 tasks) {
  constexpr u64 kWindow = 256;
  std::vector<chi::Future<chimaera::demo::GpuSubmitTask>> window;
  window.reserve(kWindow);
  bool ok = true;
  for (u64 base = 0; base < tasks; base += kWindow) {
    window.clear();
    for (u64 i = base; i < tasks && i < base + kWindow; ++i) {
      window.push_back(c.AsyncGpuSubmit(chi::PoolQuery::Local(), 1, static_cast<chi::u32>(i)));
    }
    for (u64 k = 0; k < window.size(); ++k) {
      ok = ok && window[k].Wait(30) && window[k]->result_value_ == (base + k) * 2 + 1;
    }
  }
  return ok;
}

/** A throughput client: prints "start_ns end_ns" (CLOCK_MONOTONIC) of its stream. */
int ClientRole(u64 tasks) {
  chimaera::demo::Client c;
  if (!Connect(&c)) return 1;
  const u64 start = chi::NowNs();
  const bool ok = Stream(c, tasks);
  const u64 end = chi::NowNs();
  std::printf("%llu %llu\n", static_cast<unsigned long long>(start),
              static_cast<unsigned long long>(end));
  std::fflush(stdout);
  chi::CHIMAERA_FINALIZE();
  return ok ? 0 : 1;
}

// ---- Measurements ----

/** Median round trip of raw ZeroMQ REQ/REP (16 B) over `endpoint`. */
double RawReqRepNs(const std::string &endpoint, int round_trips) {
  const pid_t rep = Spawn({"--rep", endpoint}, {});
  zmq::context_t ctx(1);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::rcvtimeo, 10000);  // an echo that died (its port taken) ends the run
  req.connect(endpoint);
  char payload[16] = {};
  std::vector<double> samples;
  bool alive = true;
  for (int i = 0; alive && i < round_trips + 200; ++i) {
    const double t0 = chi_bench::NowNs();
    req.send(zmq::buffer(payload, sizeof(payload)), zmq::send_flags::none);
    zmq::message_t m;
    alive = req.recv(m, zmq::recv_flags::none).has_value();
    if (alive && i >= 200) samples.push_back(chi_bench::NowNs() - t0);
  }
  if (alive) {
    req.send(zmq::buffer(payload, 1), zmq::send_flags::none);  // tells the echo to stop
    zmq::message_t last;
    (void)req.recv(last, zmq::recv_flags::none);
  } else {
    std::fprintf(stderr, "raw ZeroMQ REQ/REP over %s: no echo\n", endpoint.c_str());
    kill(rep, SIGKILL);
  }
  req.close();
  ctx.close();
  WaitExit(rep);
  return chi_bench::Median(samples);
}

/** Median task round trip through the current client connection. */
double TaskRoundTripNs(chimaera::demo::Client &c, int round_trips) {
  std::vector<double> samples;
  for (int i = 0; i < round_trips + 200; ++i) {
    const double t0 = chi_bench::NowNs();
    auto f = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, static_cast<chi::u32>(i));
    f.Wait();
    if (i >= 200) samples.push_back(chi_bench::NowNs() - t0);
  }
  return chi_bench::Median(samples);
}

/** Tasks per second of `clients` client processes streaming concurrently. */
double MultiClientRate(int clients, u64 tasks, const std::vector<std::pair<std::string, std::string>> &env) {
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int i = 0; i < clients; ++i) {
    int p[2];
    if (pipe(p) != 0) return 0;
    pids.push_back(Spawn({"--client", std::to_string(tasks)}, env, p[1]));
    close(p[1]);
    fds.push_back(p[0]);
  }
  u64 first = ~0ull, last = 0;
  bool ok = true;
  for (int i = 0; i < clients; ++i) {
    char buf[128] = {};
    ssize_t n = 0, got = 0;
    while ((n = read(fds[i], buf + got, sizeof(buf) - 1 - got)) > 0) got += n;
    close(fds[i]);
    unsigned long long s = 0, e = 0;
    ok = WaitExit(pids[i]) == 0 && std::sscanf(buf, "%llu %llu", &s, &e) == 2 && ok;
    first = s < first ? s : first;
    last = e > last ? e : last;
  }
  if (!ok || last <= first) return 0;
  return static_cast<double>(tasks) * clients / ((last - first) / 1e9);
}

int Run(int round_trips, u64 tasks) {
  const chi::u32 port = 30000 + static_cast<chi::u32>(getpid()) % 10000;
  const std::vector<std::pair<std::string, std::string>> server_env = {
      {"CHI_PORT", std::to_string(port)}};
  const pid_t server = Spawn({"--server"}, server_env);
  for (int i = 0; i < 2000; ++i) {  // until the runtime owns its segments
    bool stale = false;
    if (chi::RuntimeSegments::FindOwner(port, &stale) == static_cast<chi::u32>(server)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("bench_cross_process: runtime pid %d on port %u, %d round trips, %llu tasks per "
              "client\n", server, port, round_trips, static_cast<unsigned long long>(tasks));
  int rc = 0;
  for (const std::string mode : {"shm", "ipc", "tcp"}) {
    setenv("CHI_PORT", std::to_string(port).c_str(), 1);
    setenv("CHI_IPC_MODE", mode.c_str(), 1);
    setenv("CHI_WITH_RUNTIME", "0", 1);
    chimaera::demo::Client c;
    if (!Connect(&c)) {
      std::fprintf(stderr, "cannot connect over %s\n", mode.c_str());
      rc = 1;
      break;
    }
    const std::string floor_ep = mode == "ipc"
        ? "ipc:///tmp/chi_bench_floor_" + std::to_string(getpid()) + ".ipc"
        : "tcp://127.0.0.1:" + std::to_string(port + 1);
    const double floor = mode == "shm" ? ShmPingPongNs(round_trips)
                                       : RawReqRepNs(floor_ep, round_trips);
    const double ours = TaskRoundTripNs(c, round_trips);
    const std::string label = mode + ": task round trip (GpuSubmit)";
    const std::string floor_label = mode == "shm" ? std::string("two-process shm ping-pong")
                                                  : "raw ZeroMQ REQ/REP 16 B " + mode;
    chi_bench::ReportLatency(label.c_str(), ours, floor_label.c_str(), floor);
    if (auto *shm = dynamic_cast<chi::ShmReconnectingTransport *>(
            chi::Chimaera::Get().GetTransport())) {
      // Who took the answers off the wire: the caller spinning in Wait, or the receiver.
      std::printf("shm: answers delivered by the waiting caller: %llu of %d\n",
                  static_cast<unsigned long long>(shm->Current()->HelpedAnswers()),
                  round_trips + 201);
    }
    const u64 t0 = chi::NowNs();
    const bool ok = Stream(c, tasks);
    const double one = ok ? tasks / ((chi::NowNs() - t0) / 1e9) : 0;
    chi::CHIMAERA_FINALIZE();
    chi_bench::ReportRate((mode + ": throughput, 1 client (256 in flight)").c_str(), one);
    const double four = MultiClientRate(4, tasks, {{"CHI_PORT", std::to_string(port)},
                                                   {"CHI_IPC_MODE", mode},
                                                   {"CHI_WITH_RUNTIME", "0"}});
    chi_bench::ReportRate((mode + ": throughput, 4 client processes").c_str(), four);
    if (!ok || four == 0) rc = 1;
  }
  setenv("CHI_IPC_MODE", "tcp", 1);
  if (chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {
    chimaera::admin::Client().AsyncStopRuntime(chi::PoolQuery::Local()).Wait(10);
    chi::CHIMAERA_FINALIZE();
  } else {
    kill(server, SIGKILL);
  }
  WaitExit(server);
  return rc;
}

}  // namespace

using chi::u64;

int main(int argc, char **argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "--server") return ServerRole();
  if (role == "--rep" && argc > 2) return RepRole(argv[2]);
  if (role == "--pong" && argc > 2) return PongRole(argv[2]);
  if (role == "--client" && argc > 2) return ClientRole(std::strtoull(argv[2], nullptr, 10));
  const int round_trips = argc > 1 ? std::atoi(argv[1]) : 3000;
  const u64 tasks = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20000;
  return Run(round_trips > 0 ? round_trips : 3000, tasks > 0 ? tasks : 20000);
}
