// libFuzzer harness for the runtime's YAML configuration, ParseServerConfig (config.h): the
// input is the file's text. A configuration that parses keeps every limit the parser
// documents, and written back as YAML (every key, sizes as FormatSize writes them, queries as
// ToString does) it parses to the same configuration. A refusal is kBadConfig with a
// message naming the source, and leaves the caller's configuration alone. Nothing throws.
#include <charconv>     // to_chars: seconds written exactly, without an exponent
#include <cmath>        // isnan
#include <cstdint>      // uint8_t
#include <cstdio>       // snprintf of escapes
#include <string>       // the YAML written back
#include <string_view>  // the input text

#include "chi/runtime/config.h"  // ParseServerConfig, ServerConfig, the limits
#include "fuzz_check.h"          // FuzzCheck

using chi::ServerConfig;
using chi::Status;
using chi::u64;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;

namespace {

constexpr std::string_view kSource = "<fuzz>";

/** A double-quoted YAML scalar holding exactly the bytes of s. */
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", u);
      out += esc;
    } else {
      out += c;  // bytes from 0x80 up travel as they are: YAML reads them back unchanged
    }
  }
  return out + "\"";
}

/** Seconds as the shortest decimal that reads back as the same double (no exponent). */
std::string Seconds(double v) {
  char buf[400];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  FuzzCheck(ec == std::errc(), "a parsed timeout can be written");
  return std::string(buf, end);
}

/** The configuration as YAML naming every key. */
std::string WriteYaml(const ServerConfig &c) {
  using std::to_string;
  std::string y;
  y += "workers:\n  low_latency: " + to_string(c.low_latency_workers) +
       "\n  high_latency: " + to_string(c.high_latency_workers) + "\n";
  y += "queue_depth: " + to_string(c.queue_depth) + "\n";
  y += "lanes_per_worker: " + to_string(c.lanes_per_worker) + "\n";
  y += "fiber_stack_size: " + chi::detail::FormatSize(c.fiber_stack_bytes) + "\n";
  y += "networking:\n  port: " + to_string(c.port) + "\n  hostfile: " + Quote(c.hostfile) +
       "\n  ipc_mode: " + Quote(c.ipc_mode) +
       "\n  connect_timeout_s: " + Seconds(c.connect_timeout_sec) +
       "\n  reconnect_timeout_s: " + Seconds(c.reconnect_timeout_sec) +
       "\n  hang_timeout_s: " + Seconds(c.hang_timeout_sec) +
       "\n  zmq_spin_us: " + to_string(c.zmq_spin_us) +
       "\n  zmq_worker_spin_us: " + to_string(c.zmq_worker_spin_us) + "\n";
  y += "gpu:\n  blocks: " + to_string(c.gpu_blocks) +
       "\n  threads_per_block: " + to_string(c.gpu_threads_per_block) +
       "\n  queue_depth: " + to_string(c.gpu_queue_depth) + "\n";
  y += "shm:\n  main_size: " + chi::detail::FormatSize(c.main_segment_bytes) +
       "\n  client_data_size: " + chi::detail::FormatSize(c.client_data_bytes) +
       "\n  runtime_data_size: " + chi::detail::FormatSize(c.runtime_data_bytes) +
       "\n  client_slots: " + to_string(c.shm_client_slots) + "\n";
  y += "memory:\n  warm_message_bytes: " + chi::detail::FormatSize(c.warm_message_bytes) +
       "\n  warm_payload_bytes: " + chi::detail::FormatSize(c.warm_payload_bytes) + "\n";
  y += c.compose.empty() ? "compose: []\n" : "compose:\n";
  for (const chi::ComposeEntry &e : c.compose) {
    y += "  - mod_name: " + Quote(e.mod_name) + "\n    pool_name: " + Quote(e.pool_name) +
         "\n    pool_id: " + Quote(e.pool_id.ToString()) +
         "\n    pool_query: " + Quote(e.pool_query.ToString()) +
         "\n    num_containers: " + to_string(e.num_containers) + "\n";
  }
  return y;
}

/** True when lo <= v <= hi. */
bool In(u64 v, u64 lo, u64 hi) { return v >= lo && v <= hi; }

/** A timeout the parser took: a number of seconds in [0, kMaxTimeoutSec]. */
bool GoodTimeout(double s) { return !std::isnan(s) && s >= 0 && s <= chi::kMaxTimeoutSec; }

/** Every limit config.h documents for a configuration ParseServerConfig returned. */
void CheckLimits(const ServerConfig &c) {
  FuzzCheck(In(c.low_latency_workers, 1, chi::kMaxWorkers) &&
                c.high_latency_workers <= chi::kMaxWorkers &&
                c.low_latency_workers + c.high_latency_workers <= chi::kMaxWorkers,
            "workers: low_latency >= 1 and low + high <= kMaxWorkers");
  FuzzCheck(In(c.queue_depth, chi::kMinQueueDepth, chi::kMaxQueueDepth) &&
                (c.queue_depth & (c.queue_depth - 1)) == 0,
            "queue_depth is a power of two in [kMinQueueDepth, kMaxQueueDepth]");
  FuzzCheck(In(c.lanes_per_worker, 1, chi::kMaxLanesPerWorker), "lanes_per_worker in range");
  FuzzCheck(In(c.fiber_stack_bytes, chi::kMinFiberStack, chi::kMaxFiberStack),
            "fiber_stack_size in [kMinFiberStack, kMaxFiberStack]");
  FuzzCheck(In(c.port, 1, 65535), "networking.port in 1..65535");
  FuzzCheck(chi::detail::IsIpcMode(c.ipc_mode), "networking.ipc_mode is shm, ipc or tcp");
  FuzzCheck(GoodTimeout(c.connect_timeout_sec) && GoodTimeout(c.reconnect_timeout_sec) &&
                GoodTimeout(c.hang_timeout_sec),
            "networking timeouts in [0, kMaxTimeoutSec]");
  FuzzCheck(c.zmq_spin_us <= chi::kMaxZmqSpinUs && c.zmq_worker_spin_us <= chi::kMaxZmqSpinUs,
            "networking zmq spins <= kMaxZmqSpinUs");
  FuzzCheck(In(c.gpu_blocks, 1, chi::kMaxGpuBlocks) &&
                In(c.gpu_threads_per_block, 1, chi::kMaxGpuThreadsPerBlock) &&
                In(c.gpu_queue_depth, 1, chi::kMaxQueueDepth),
            "gpu blocks, threads_per_block and queue_depth in range");
  for (u64 bytes : {c.main_segment_bytes, c.client_data_bytes, c.runtime_data_bytes}) {
    FuzzCheck(In(bytes, chi::kMinShmSegment, chi::kMaxShmSegment),
              "shm sizes in [kMinShmSegment, kMaxShmSegment]");
  }
  FuzzCheck(In(c.shm_client_slots, 1, chi::kMaxShmClientSlots), "shm.client_slots in range");
  FuzzCheck(c.warm_message_bytes <= chi::kMaxWarmBytes &&
                c.warm_payload_bytes <= chi::kMaxWarmBytes,
            "memory warm budgets <= kMaxWarmBytes");
  for (size_t i = 0; i < c.compose.size(); ++i) {
    const chi::ComposeEntry &e = c.compose[i];
    FuzzCheck(!e.mod_name.empty() && !e.pool_name.empty(), "compose names are non-empty");
    FuzzCheck(!e.pool_id.IsNull() && e.pool_id != chi::kAdminPoolId,
              "compose pool ids are neither null nor the admin pool");
    FuzzCheck(e.pool_query.IsValid() && !e.pool_query.IsNull(), "compose queries are valid");
    FuzzCheck(In(e.num_containers, 1, chi::kMaxContainers), "compose num_containers in range");
    for (size_t j = 0; j < i; ++j) {
      FuzzCheck(c.compose[j].pool_name != e.pool_name && c.compose[j].pool_id != e.pool_id,
                "compose names and ids are unique");
    }
  }
}

/** ParseServerConfig, which must not throw whatever the text. */
Status Parse(std::string_view text, ServerConfig *out) {
  try {
    return chi::ParseServerConfig(text, out, kSource);
  } catch (...) {
    FuzzCheck(false, "ParseServerConfig threw");
  }
  return Status::Ok();
}

/** A configuration no parse returns, to see that a refusal leaves the caller's alone. */
ServerConfig Untouched() {
  ServerConfig c;
  c.port = 1;
  c.hostfile = "untouched";
  c.compose.push_back(chi::ComposeEntry{"m", "p", chi::PoolId(7, 7), chi::PoolQuery::Local(), 3});
  return c;
}

}  // namespace

/** The input is the YAML text. */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  static const ServerConfig kUntouched = Untouched();
  ServerConfig cfg = kUntouched;
  const Status st = Parse(text, &cfg);
  if (!st.ok()) {
    FuzzCheckRefusal(st, "a refused configuration has a code and a message");
    FuzzCheck(st.code() == chi::ErrorCode::kBadConfig, "a refused configuration is kBadConfig");
    FuzzCheck(std::string_view(st.message()).starts_with(kSource),
              "a refusal's message names the source");
    FuzzCheck(cfg == kUntouched, "a refusal leaves the caller's configuration alone");
    return 0;
  }
  CheckLimits(cfg);
  const std::string written = WriteYaml(cfg);
  ServerConfig back;
  const Status again = Parse(written, &back);
  if (!again.ok()) {
    std::fprintf(stderr, "written back:\n%s\n=> %s\n", written.c_str(), again.message());
  }
  FuzzCheck(again.ok(), "a parsed configuration written back as YAML parses");
  FuzzCheck(back == cfg, "a parsed configuration written back parses to the same configuration");
  return 0;
}
