// Cross-process clients of a standalone runtime, per transport: the task round
// trip (GpuSubmit, 16 B in and out) next to its floor measured in the same run
// (two-process shared-memory flag ping-pong for shm; raw ZeroMQ REQ/REP over the
// same endpoint type for ipc/tcp), then throughput with 1 and 4 client processes.
// The runtime, the floors' peers and the extra clients are this binary re-executed
// with a role argument.
// The round trip and its floor are taken in alternating blocks (see MeasureInterleaved).
// With payload_bytes the round trip is a Custom echo of that many bytes instead, and the
// floors move the same bytes: the shm peer copies them out of a shared buffer and back into
// another (four copies per round trip, as an echo needs), raw ZeroMQ echoes a message of
// that size.
//   bench_cross_process [round_trips=6000] [tasks_per_client=20000 (0: no throughput)]
//                       [transports=shm,ipc,tcp] [payload_bytes=0 (GpuSubmit)]
#include <fcntl.h>     // pipes for child reports
#include <signal.h>    // killing the runtime on failure
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execl, getpid

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // the runtime child serves the demo module

#include <cstdio>
#include <cstdlib>
#include <cstring>  // the shm copy floor's memcpy
#include <memory>  // the pong peer's copy buffer
#include <new>
#include <algorithm>  // sort of block ratios
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench_util.h"

namespace {

using chi::u64;

constexpr chi::PoolId kPool(400, 0);
constexpr int kBlocks = 20;  ///< alternating floor/task blocks per transport
u64 g_payload = 0;           ///< bytes each round trip echoes (0: a 16 B GpuSubmit)

/**
 * Runs this binary again with `args` and extra environment; stdout to `out_fd` and stdin
 * from `in_fd` when >= 0.
 */
pid_t Spawn(const std::vector<std::string> &args,
            const std::vector<std::pair<std::string, std::string>> &env, int out_fd = -1,
            int in_fd = -1) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto &kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    if (in_fd >= 0) dup2(in_fd, STDIN_FILENO);
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
  rep.connect(endpoint);  // the measuring side bound it (a port of its choosing)
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

/**
 * Round trips per timed sample. A clock read costs ~24 ns and ticks in 10 ns steps on the
 * VM: timing each round trip alone would add that much to a 100 ns floor (flattering every
 * ratio), so a sample times 8 in a row and records their mean.
 */
constexpr int kPerSample = 8;

/**
 * Runs one(i) `warm` times untimed, then n times in timed samples of kPerSample, appending
 * each sample's mean round trip to *out. False as soon as one() fails.
 */
template <typename Fn>
bool TimeRoundTrips(int warm, int n, std::vector<double> *out, Fn one) {
  for (int i = 0; i < warm; ++i) {
    if (!one(i)) return false;
  }
  for (int i = 0; i + kPerSample <= n; i += kPerSample) {
    const double t0 = chi_bench::NowNs();
    for (int k = 0; k < kPerSample; ++k) {
      if (!one(warm + i + k)) return false;
    }
    out->push_back((chi_bench::NowNs() - t0) / kPerSample);
  }
  return true;
}

/**
 * The shm floor's shared words: two flags on separate cache lines, and a futex word that
 * parks the peer between blocks, so it never spins while the task round trips run.
 */
struct PingPong {
  alignas(64) chi::Atomic<u64> ping;
  alignas(64) chi::Atomic<u64> pong;
  alignas(64) chi::Atomic<chi::u32> go;  ///< 0: park, 1: answer pings, 2: exit
};
constexpr u64 kBlockEnd = ~0ull;  ///< ping value that ends a block (echoed as its ack)

/** Where copy buffer k (0: request, 1: answer) of `bytes` lies after the flags. */
char *CopyBuffer(chi::PosixShmBackend &seg, int k, u64 bytes) {
  return seg.Data() + chi::RoundUpTo(sizeof(PingPong), 64) + k * bytes;
}

/**
 * The shm floor's peer: answers every ping with the same value, block after block; with
 * `bytes`, it first copies the request buffer out and its copy into the answer buffer.
 */
int PongRole(const std::string &segment, u64 bytes) {
  chi::PosixShmBackend seg;
  if (!seg.Attach(segment).ok()) return 1;
  auto *pp = reinterpret_cast<PingPong *>(seg.Data());
  // Not a std::vector: GCC 12 then warns (-Wstringop-overread) that the memcpy below
  // reads its empty allocation, though it runs only with bytes != 0.
  const std::unique_ptr<char[]> mine(new char[bytes]);
  u64 last = 0;
  for (;;) {
    chi::u32 go = 0;
    // acquire: the measuring side's block set-up precedes its go.
    while ((go = pp->go.Load(chi::MemOrder::kAcquire)) == 0) chi::FutexWait(pp->go.Raw(), 0);
    if (go == 2) return 0;
    for (;;) {
      const u64 v = pp->ping.Load(chi::MemOrder::kAcquire);  // acquire: pairs with the ping
      if (v != last) {
        if (bytes != 0 && v != kBlockEnd) {
          std::memcpy(mine.get(), CopyBuffer(seg, 0, bytes), bytes);
          std::memcpy(CopyBuffer(seg, 1, bytes), mine.get(), bytes);
        }
        pp->pong.Store(v, chi::MemOrder::kRelease);  // release: the answer after the read
        last = v;
        if (v == kBlockEnd) break;  // go was cleared before this ping: park again
      } else {
        chi::CpuRelax();
      }
    }
  }
}

/** The shm floor: a two-process spinning flag ping-pong, run in blocks. */
class ShmPingPong {
 public:
  bool Start() {
    name_ = "bench_xp_pingpong_" + std::to_string(getpid());
    const u64 bytes = chi::RoundUpTo(sizeof(PingPong), 64) + 2 * g_payload;
    if (!seg_.Create(name_, bytes, chi::CreateMode::kReplace).ok()) return false;
    pp_ = new (seg_.Data()) PingPong();
    peer_ = Spawn({"--pong", name_, std::to_string(g_payload)}, {});
    mine_.assign(g_payload, 'p');
    return true;
  }
  /** Appends one block of n round trips (after `warm` unrecorded ones) to *out; true. */
  bool Block(int warm, int n, std::vector<double> *out) {
    pp_->go.Store(1, chi::MemOrder::kRelease);  // release: pairs with the peer's acquire
    chi::FutexWake(pp_->go.Raw(), 1);
    TimeRoundTrips(warm, n, out, [&](int) {
      if (g_payload != 0) std::memcpy(CopyBuffer(seg_, 0, g_payload), mine_.data(), g_payload);
      pp_->ping.Store(++v_, chi::MemOrder::kRelease);
      while (pp_->pong.Load(chi::MemOrder::kAcquire) != v_) chi::CpuRelax();
      if (g_payload != 0) std::memcpy(mine_.data(), CopyBuffer(seg_, 1, g_payload), g_payload);
      return true;
    });
    pp_->go.Store(0, chi::MemOrder::kRelaxed);  // relaxed: the ping below publishes it
    pp_->ping.Store(kBlockEnd, chi::MemOrder::kRelease);
    while (pp_->pong.Load(chi::MemOrder::kAcquire) != kBlockEnd) chi::CpuRelax();
    return true;
  }
  void Stop() {
    pp_->go.Store(2, chi::MemOrder::kRelease);  // release: as in Block
    chi::FutexWake(pp_->go.Raw(), 1);
    WaitExit(peer_);
    seg_.Destroy();
  }

 private:
  std::string name_;
  chi::PosixShmBackend seg_;
  PingPong *pp_ = nullptr;
  pid_t peer_ = -1;
  u64 v_ = 0;
  std::vector<char> mine_;  ///< the payload on this side (copied in and out)
};

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

/**
 * A throughput client: connects, says "ready", waits for a byte on stdin (all clients
 * start together), then prints "start_ns end_ns" (CLOCK_MONOTONIC) of its stream.
 */
int ClientRole(u64 tasks) {
  chimaera::demo::Client c;
  if (!Connect(&c)) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  char go = 0;
  if (read(STDIN_FILENO, &go, 1) != 1) return 1;
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

/** The ipc/tcp floor: raw ZeroMQ REQ/REP (16 B) to an echo process, run in blocks. */
class RawReqRep {
 public:
  explicit RawReqRep(const std::string &endpoint) : endpoint_(endpoint) {}
  /**
   * Binds the REQ side (a tcp endpoint ending in :* takes a free port: a fixed one was at
   * times still held by an earlier run) and starts the echo, which connects to it.
   */
  bool Start() {
    req_.set(zmq::sockopt::linger, 0);
    req_.set(zmq::sockopt::rcvtimeo, 10000);  // an echo that died ends the run
    try {
      req_.bind(endpoint_);
      endpoint_ = req_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t &e) {
      std::fprintf(stderr, "raw ZeroMQ REQ/REP: cannot bind %s: %s\n", endpoint_.c_str(),
                   e.what());
      alive_ = false;
      return false;
    }
    rep_ = Spawn({"--rep", endpoint_}, {});
    return true;
  }
  /** As ShmPingPong::Block; false once the echo stopped answering. */
  bool Block(int warm, int n, std::vector<double> *out) {
    const std::vector<char> payload(g_payload != 0 ? g_payload : 16, 'p');
    alive_ = alive_ && TimeRoundTrips(warm, n, out, [&](int) {
      req_.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::none);
      zmq::message_t m;
      return req_.recv(m, zmq::recv_flags::none).has_value();
    });
    if (!alive_) std::fprintf(stderr, "raw ZeroMQ REQ/REP over %s: no echo\n", endpoint_.c_str());
    return alive_;
  }
  void Stop() {
    if (alive_) {
      char stop = 0;
      req_.send(zmq::buffer(&stop, 1), zmq::send_flags::none);  // tells the echo to stop
      zmq::message_t last;
      (void)req_.recv(last, zmq::recv_flags::none);
    } else if (rep_ > 0) {
      kill(rep_, SIGKILL);
    }
    req_.close();
    ctx_.close();
    if (rep_ > 0) WaitExit(rep_);
    // ZeroMQ leaves a bound ipc endpoint's socket file behind: one per run piled up in /tmp.
    if (endpoint_.rfind("ipc://", 0) == 0) std::remove(endpoint_.c_str() + 6);
  }

 private:
  std::string endpoint_;
  zmq::context_t ctx_{1};
  zmq::socket_t req_{ctx_, zmq::socket_type::req};
  pid_t rep_ = -1;
  bool alive_ = true;
};

/**
 * Appends one block of task round trips through the current client connection; false on
 * a wrong answer or a failed wait.
 */
bool TaskBlock(chimaera::demo::Client &c, int warm, int n, std::vector<double> *out) {
  if (g_payload != 0) {
    const std::string payload(g_payload, 'p');
    return TimeRoundTrips(warm, n, out, [&](int) {
      auto f = c.AsyncCustom(chi::PoolQuery::Local(), payload);
      return f.Wait() && f->data_.size() == g_payload && f->data_.view().back() == 'p';
    });
  }
  return TimeRoundTrips(warm, n, out, [&](int i) {
    auto f = c.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, static_cast<chi::u32>(i));
    return f.Wait() && f->result_value_ == static_cast<chi::u32>(i) * 2;
  });
}

/** Times the runtime's threads slept so far (admin Monitor through the current client). */
struct Sleeps {
  u64 workers = 0;  ///< the lanes' workers parked
  u64 network = 0;  ///< the ZeroMQ network worker slept in poll()
  u64 moves = 0;    ///< runtime threads moved off a CPU they shared with a client (shm)
};
Sleeps RuntimeSleeps() {
  Sleeps s;
  auto f = chimaera::admin::Client().AsyncMonitor(chi::PoolQuery::Local());
  if (!f.Wait(10) || f->GetReturnCode() != 0) return s;
  const chimaera::admin::MonitorReport r = f->Decode();
  for (const chi::WorkerStats &w : r.workers_) s.workers += w.parks_;
  for (const chimaera::admin::TransportStats &t : r.transports_) {
    s.network += t.sleeps_;
    s.moves += t.cpu_moves_;
  }
  return s;
}

/** Round trips of a floor and of our tasks, taken in alternating blocks. */
struct Interleaved {
  std::vector<double> floor, ours;
  std::vector<double> block_ratios;  ///< median(ours) / median(floor) of each block pair
  u64 task_round_trips = 0;          ///< tasks sent, warm-ups included
};

/**
 * Measures the floor and our task round trip in `blocks` alternating blocks of
 * round_trips / blocks each, at least kPerSample (200 unrecorded warm-ups before the first
 * of each), so both see the same CPU placement: on a VM the vCPUs move between cores, and a
 * floor taken a second apart from ours can differ from it by 4x.
 */
template <typename Floor>
bool MeasureInterleaved(Floor &floor, chimaera::demo::Client &c, int round_trips, int blocks,
                        Interleaved *out) {
  // At least one timed sample per block: fewer round trips than that timed nothing (0 ns).
  const int n = std::max(round_trips / blocks, kPerSample);
  for (int b = 0; b < blocks; ++b) {
    const int warm = b == 0 ? 200 : 20;
    std::vector<double> f, o;
    // The runtime's worker (after 100 us idle) and the client's receiver park: the floor
    // then runs alone, as it would on a quiet machine (the task block's warm-ups wake them).
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!floor.Block(warm, n, &f)) return false;
    if (!TaskBlock(c, warm, n, &o)) {
      std::fprintf(stderr, "a task round trip failed or answered wrongly\n");
      return false;
    }
    out->task_round_trips += warm + n;
    out->block_ratios.push_back(chi_bench::Median(o) / chi_bench::Median(f));
    out->floor.insert(out->floor.end(), f.begin(), f.end());
    out->ours.insert(out->ours.end(), o.begin(), o.end());
  }
  return true;
}

/**
 * Tasks per second of `clients` client processes streaming concurrently, from the moment
 * all are connected and told to go (process start-up is not counted) to the last one done.
 */
double MultiClientRate(int clients, u64 tasks,
                       const std::vector<std::pair<std::string, std::string>> &env) {
  std::vector<pid_t> pids;
  std::vector<int> outs, gos;
  for (int i = 0; i < clients; ++i) {
    int out[2], in[2];
    if (pipe(out) != 0 || pipe(in) != 0) return 0;
    pids.push_back(Spawn({"--client", std::to_string(tasks)}, env, out[1], in[0]));
    close(out[1]);
    close(in[0]);
    outs.push_back(out[0]);
    gos.push_back(in[1]);
  }
  bool ok = true;
  for (int i = 0; i < clients; ++i) {  // each says "ready" once connected
    char line[8] = {};
    ok = read(outs[i], line, 6) == 6 && std::string(line, 6) == "ready\n" && ok;
  }
  for (int i = 0; i < clients; ++i) {  // all go at once (a failed client's stdin just closes)
    ok = (!ok || write(gos[i], "g", 1) == 1) && ok;
    close(gos[i]);
  }
  u64 first = ~0ull, last = 0;
  for (int i = 0; i < clients; ++i) {
    char buf[128] = {};
    ssize_t n = 0, got = 0;
    while ((n = read(outs[i], buf + got, sizeof(buf) - 1 - got)) > 0) got += n;
    close(outs[i]);
    unsigned long long s = 0, e = 0;
    ok = WaitExit(pids[i]) == 0 && std::sscanf(buf, "%llu %llu", &s, &e) == 2 && ok;
    first = s < first ? s : first;
    last = e > last ? e : last;
  }
  if (!ok || last <= first) return 0;
  return static_cast<double>(tasks) * clients / ((last - first) / 1e9);
}

int Run(int round_trips, u64 tasks, const std::string &modes) {
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
    if (modes.find(mode) == std::string::npos) continue;
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
        : std::string("tcp://127.0.0.1:*");
    Interleaved m;
    bool measured = false;
    const Sleeps sleeps_before = RuntimeSleeps();
    if (mode == "shm") {
      ShmPingPong floor;
      if (floor.Start()) {
        measured = MeasureInterleaved(floor, c, round_trips, kBlocks, &m);
        floor.Stop();
      }
    } else {
      RawReqRep floor(floor_ep);
      measured = floor.Start() && MeasureInterleaved(floor, c, round_trips, kBlocks, &m);
      floor.Stop();
    }
    if (!measured) rc = 1;
    const Sleeps sleeps_after = RuntimeSleeps();
    const std::string bytes = std::to_string(g_payload != 0 ? g_payload : 16) + " B";
    const std::string label = mode + ": task round trip (" +
                              (g_payload != 0 ? "Custom echo " + bytes : "GpuSubmit") + ")";
    const std::string floor_label =
        mode == "shm" ? (g_payload != 0 ? "two-process shm copy ping-pong " + bytes
                                        : std::string("two-process shm ping-pong"))
                      : "raw ZeroMQ REQ/REP " + bytes + " " + mode;
    chi_bench::ReportLatency(label.c_str(), chi_bench::Median(m.ours), floor_label.c_str(),
                             chi_bench::Median(m.floor));
    // The tail: a round trip that waited for a timed nap or park shows here, not in the
    // median (each sample is the mean of kPerSample round trips in a row).
    std::printf("%s: p99 / max of the samples: ours %.0f / %.0f ns, floor %.0f / %.0f ns\n",
                mode.c_str(), chi_bench::Quantile(m.ours, 0.99), chi_bench::Quantile(m.ours, 1),
                chi_bench::Quantile(m.floor, 0.99), chi_bench::Quantile(m.floor, 1));
    std::vector<double> sorted = m.block_ratios;
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) {
      std::printf("%s: ratio per block pair (%d blocks): median %.2fx, range %.2fx .. %.2fx\n",
                  mode.c_str(), kBlocks, chi_bench::Median(sorted), sorted.front(),
                  sorted.back());
    }
    // A lane worker that parks between round trips costs each of them a futex wake-up; the
    // network worker sleeps in poll() as a raw ZeroMQ server does in recv.
    // A move: a runtime thread kept finding the client on its CPU (cpu_share.h).
    std::printf("%s: during the round trips, lane workers parked %llu times, the network "
                "worker slept %llu times, runtime threads moved off the client's CPU %llu "
                "times (%llu task round trips, %d floor blocks)\n",
                mode.c_str(),
                static_cast<unsigned long long>(sleeps_after.workers - sleeps_before.workers),
                static_cast<unsigned long long>(sleeps_after.network - sleeps_before.network),
                static_cast<unsigned long long>(sleeps_after.moves - sleeps_before.moves),
                static_cast<unsigned long long>(m.task_round_trips), kBlocks);
    if (auto *shm = dynamic_cast<chi::ShmReconnectingTransport *>(
            chi::Chimaera::Get().GetTransport())) {
      // Who took the answers off the wire: the caller spinning in Wait, or the receiver.
      std::printf("shm: answers delivered by the waiting caller: %llu of %llu\n",
                  static_cast<unsigned long long>(shm->Current()->HelpedAnswers()),
                  static_cast<unsigned long long>(m.task_round_trips + 1));  // + pool create
    }
    if (tasks == 0) {  // latency only
      chi::CHIMAERA_FINALIZE();
      continue;
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
  if (role == "--pong" && argc > 3) return PongRole(argv[2], std::strtoull(argv[3], nullptr, 10));
  if (role == "--client" && argc > 2) return ClientRole(std::strtoull(argv[2], nullptr, 10));
  const int round_trips = argc > 1 ? std::atoi(argv[1]) : 6000;
  const u64 tasks = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20000;
  const std::string modes = argc > 3 ? argv[3] : "shm,ipc,tcp";
  g_payload = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 0;
  return Run(round_trips > 0 ? round_trips : 6000, tasks, modes);
}
