// Runtime configuration: ServerConfig, read from YAML (yaml-cpp) by
// ParseServerConfig, and LoadServerConfig (CHI_SERVER_CONF or the embedded
// default, then the CHI_* environment overrides); also the hostfile reader. Used once at
// start-up by Chimaera::Init. Invariant: every failure is a kBadConfig Status
// naming the key (or variable, or file); no exception escapes these functions.
#pragma once

#include <yaml-cpp/yaml.h>  // YAML::Load, YAML::Node, YAML::Exception

#include <algorithm>    // std::find, std::any_of
#include <array>        // known-key lists
#include <bit>          // std::bit_ceil for queue_depth
#include <cerrno>       // errno of a failed fopen
#include <cstdio>       // fopen, fread for config and host files
#include <cstdlib>      // getenv
#include <cstring>      // strerror
#include <exception>    // std::exception caught at the API boundary
#include <set>          // duplicate-key detection
#include <string>       // messages, names
#include <string_view>  // YAML text and sources
#include <vector>       // compose entries, hosts

#include "chi/core/ids.h"                 // PoolId, kAdminPoolId
#include "chi/core/parse.h"               // detail::ParseUnsigned
#include "chi/core/pool_query.h"          // PoolQuery
#include "chi/core/status.h"              // Status, ErrorCode::kBadConfig
#include "chi/core/types.h"               // u32, u64
#include "chi/runtime/default_config.h"  // kDefaultConfigYaml
#include "chi/runtime/runtime_limits.h"  // RuntimeLimits: the limits section

namespace chi {

/** One pool the runtime creates at start (a `compose:` entry). */
struct ComposeEntry {
  std::string mod_name;   ///< module implementing the pool
  std::string pool_name;  ///< unique among the entries
  PoolId pool_id;         ///< unique among the entries; never null or the admin pool
  PoolQuery pool_query;   ///< where the pool is created (default: local)
  u32 num_containers = 1;

  bool operator==(const ComposeEntry &) const = default;
};

/** Everything the runtime reads from its YAML configuration; defaults = the default file. */
struct ServerConfig {
  // workers
  u32 low_latency_workers = 1;    ///< yaml: workers.low_latency (>= 1)
  u32 high_latency_workers = 1;   ///< yaml: workers.high_latency (total workers <= 256)
  u32 queue_depth = 1024;         ///< yaml: queue_depth, per lane, a power of two
  u32 lanes_per_worker = 1;       ///< yaml: lanes_per_worker
  u64 fiber_stack_bytes = 65536;  ///< yaml: fiber_stack_size
  // networking
  u32 port = 9413;               ///< yaml: networking.port; env CHI_PORT overrides
  std::string hostfile;          ///< yaml: networking.hostfile ("" = single node)
  std::string ipc_mode = "shm";  ///< yaml: networking.ipc_mode; env CHI_IPC_MODE overrides
  double connect_timeout_sec = 5;     ///< networking.connect_timeout_s; CHI_CONNECT_TIMEOUT
  double reconnect_timeout_sec = 10;  ///< networking.reconnect_timeout_s; CHI_RECONNECT_TIMEOUT
  double hang_timeout_sec = 10;       ///< networking.hang_timeout_s (0: never); CHI_HANG_TIMEOUT
  u32 zmq_spin_us = 20;               ///< networking.zmq_spin_us; CHI_ZMQ_SPIN_US overrides
  u32 zmq_worker_spin_us = 0;         ///< networking.zmq_worker_spin_us (the runtime's)
  // gpu
  u32 gpu_blocks = 1;              ///< yaml: gpu.blocks
  u32 gpu_threads_per_block = 32;  ///< yaml: gpu.threads_per_block
  u32 gpu_queue_depth = 256;       ///< yaml: gpu.queue_depth
  // shared-memory segments of a standalone runtime
  u64 main_segment_bytes = 64ull << 20;   ///< yaml: shm.main_size
  u64 client_data_bytes = 256ull << 20;   ///< yaml: shm.client_data_size
  u64 runtime_data_bytes = 256ull << 20;  ///< yaml: shm.runtime_data_size
  u32 shm_client_slots = 32;              ///< yaml: shm.client_slots
  // memory every process keeps between large messages
  u64 warm_message_bytes = 128ull << 20;  ///< yaml: memory.warm_message_bytes
  u64 warm_payload_bytes = 64ull << 20;   ///< yaml: memory.warm_payload_bytes
  // bounds on what requests may cost the runtime
  RuntimeLimits limits;                   ///< yaml: limits (each key: see RuntimeLimits)
  std::vector<ComposeEntry> compose;      ///< yaml: compose

  bool operator==(const ServerConfig &) const = default;
};

// ---- Limits enforced by the parser (the default YAML file states them too) ----
inline constexpr u32 kMaxWorkers = 256;                 ///< low_latency + high_latency
inline constexpr u64 kMinQueueDepth = 2;                ///< queue_depth
inline constexpr u64 kMaxQueueDepth = 1ull << 20;       ///< queue_depth, gpu.queue_depth
inline constexpr u64 kMaxLanesPerWorker = 64;           ///< lanes_per_worker
inline constexpr u64 kMinFiberStack = 16ull << 10;      ///< fiber_stack_size
inline constexpr u64 kMaxFiberStack = 16ull << 20;      ///< fiber_stack_size
inline constexpr u64 kMaxGpuBlocks = 65535;             ///< gpu.blocks
inline constexpr u64 kMaxGpuThreadsPerBlock = 1024;     ///< gpu.threads_per_block (CUDA's limit)
inline constexpr u64 kMinShmSegment = 64ull << 10;      ///< each shm.*_size
inline constexpr u64 kMaxShmSegment = 1ull << 40;       ///< each shm.*_size
inline constexpr u64 kMaxShmClientSlots = 1024;         ///< shm.client_slots
inline constexpr u64 kMaxWarmBytes = 1ull << 40;        ///< each memory.warm_*_bytes
inline constexpr u64 kMaxContainers = 65536;            ///< compose[i].num_containers
inline constexpr u64 kMaxConfigFileBytes = 4ull << 20;  ///< larger config files are refused
inline constexpr double kMaxTimeoutSec = 86400;         ///< networking.*_timeout_s
inline constexpr u64 kMaxZmqSpinUs = 1000000;  ///< networking.zmq_spin_us, zmq_worker_spin_us
inline constexpr u64 kMinOutputBound = 4ull << 10;      ///< limits.max_output_size
inline constexpr u64 kMaxOutputBound = 1ull << 40;      ///< limits.max_output_size
inline constexpr u64 kMaxDepthBound = 65536;            ///< limits.max_subtask_depth (>= 1)
inline constexpr u64 kMaxHostfileBound = 64ull << 20;   ///< limits.max_hostfile_size (>= 1)
inline constexpr u64 kMaxHostsBound = 1ull << 20;       ///< limits.max_hosts (>= 1)

/** A client timeout in seconds: its networking key, the variable that overrides it, its field. */
struct TimeoutKey {
  std::string_view key;
  const char *env;
  double ServerConfig::*field;
};
/** Every client timeout (ReadNetworking and LoadServerConfig both read them from here). */
inline constexpr std::array<TimeoutKey, 3> kTimeoutKeys = {{
    {"connect_timeout_s", "CHI_CONNECT_TIMEOUT", &ServerConfig::connect_timeout_sec},
    {"reconnect_timeout_s", "CHI_RECONNECT_TIMEOUT", &ServerConfig::reconnect_timeout_sec},
    {"hang_timeout_s", "CHI_HANG_TIMEOUT", &ServerConfig::hang_timeout_sec},
}};

namespace detail {

/** Builds the kBadConfig Status "source:line: text", shortening the source to fit. */
inline Status ConfigError(std::string_view source, int line, const std::string &text) {
  auto compose = [&](std::string_view src) {
    std::string s(src);
    if (line >= 0) s += ":" + std::to_string(line + 1);
    return s + ": " + text;
  };
  std::string msg = compose(source);
  if (msg.size() >= Status::kMaxMessage) {
    // Status keeps a fixed-size message: the key and the problem matter more than the directory.
    auto slash = source.rfind('/');
    if (slash != std::string_view::npos) msg = compose(source.substr(slash + 1));
  }
  return Status::Error(ErrorCode::kBadConfig, msg.c_str());
}

/** "'abc'", "a mapping", "a list" or "nothing": what a node holds, for messages. */
inline std::string DescribeNode(const YAML::Node &n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: {
      std::string s = n.Scalar();
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return "'" + s + "'";
    }
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    default: return "nothing";
  }
}

/** Parses "65536", "64k", "1m", "2g", "1t" (also "64kb", "64KiB"; any case) into bytes. */
inline bool ParseSize(std::string_view s, u64 *out) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  u64 value = 0;
  if (!ParseUnsigned(s.substr(0, digits), ~0ull, &value)) return false;
  std::string unit;
  for (char c : s.substr(digits)) unit += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
  u32 shift = 0;
  if (!unit.empty() && unit != "b") {
    const size_t power = std::string_view("kmgt").find(unit[0]);
    const std::string_view rest = std::string_view(unit).substr(1);
    if (power == std::string_view::npos || !(rest.empty() || rest == "b" || rest == "ib")) {
      return false;
    }
    shift = static_cast<u32>(10 * (power + 1));
  }
  if (value > (~0ull >> shift)) return false;
  *out = value << shift;
  return true;
}

/** A size written the way the YAML file writes it: "64k" when a whole number of KiB. */
inline std::string FormatSize(u64 bytes) {
  const char *units = "kmgt";
  int u = -1;
  while (u < 3 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + (u < 0 ? std::string() : std::string(1, units[u]));
}

/** Parses a plain decimal number of seconds ("5", "0.25") in [0, hi]. */
inline bool ParseSeconds(const std::string &s, double hi, double *out) {
  if (s.empty() || s.find_first_not_of("0123456789.") != std::string::npos) return false;
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !(v >= 0 && v <= hi)) return false;
  *out = v;
  return true;
}

/** True for the transports a pure client may use (networking.ipc_mode, CHI_IPC_MODE). */
inline bool IsIpcMode(std::string_view m) { return m == "shm" || m == "ipc" || m == "tcp"; }

/** Walks a parsed YAML tree into a ServerConfig; the first problem found is the result. */
class ConfigReader {
 public:
  explicit ConfigReader(std::string_view source) : source_(source) {}

  /** Fills *cfg (which starts at its defaults) from the document root. */
  Status Read(const YAML::Node &root, ServerConfig *cfg) {
    static constexpr std::array<std::string_view, 10> kTop = {
        "workers", "queue_depth", "lanes_per_worker", "fiber_stack_size", "networking",
        "gpu", "shm", "memory", "limits", "compose"};
    Status st = ForEachKey(root, "", kTop, [&](std::string_view key, const YAML::Node &v,
                                               const std::string &path) {
      if (key == "workers") return ReadWorkers(v, path, cfg);
      if (key == "queue_depth") {
        u64 depth = 0;
        Status s = ReadUnsigned(v, path, kMinQueueDepth, kMaxQueueDepth, &depth);
        if (s.ok()) cfg->queue_depth = static_cast<u32>(std::bit_ceil(depth));
        return s;
      }
      if (key == "lanes_per_worker") {
        return ReadU32(v, path, 1, kMaxLanesPerWorker, &cfg->lanes_per_worker);
      }
      if (key == "fiber_stack_size") {
        return ReadSize(v, path, kMinFiberStack, kMaxFiberStack, &cfg->fiber_stack_bytes);
      }
      if (key == "networking") return ReadNetworking(v, path, cfg);
      if (key == "gpu") return ReadGpu(v, path, cfg);
      if (key == "shm") return ReadShm(v, path, cfg);
      if (key == "memory") return ReadMemory(v, path, cfg);
      if (key == "limits") return ReadLimits(v, path, &cfg->limits);
      return ReadCompose(v, path, &cfg->compose);
    });
    if (!st.ok()) return st;
    if (cfg->low_latency_workers + cfg->high_latency_workers > kMaxWorkers) {
      return Fail(root["workers"], "workers: low_latency + high_latency = " +
                                       std::to_string(cfg->low_latency_workers +
                                                      cfg->high_latency_workers) +
                                       " is more than " + std::to_string(kMaxWorkers));
    }
    return Status::Ok();
  }

 private:
  /** A kBadConfig Status for the problem `text`, located at node `at`. */
  Status Fail(const YAML::Node &at, const std::string &text) const {
    int line = at.IsDefined() ? at.Mark().line : -1;
    return ConfigError(source_, line, text);
  }

  /**
   * Calls fn(key, value, "parent.key") for each entry of a mapping (null counts as
   * empty), after rejecting non-mappings, non-scalar keys, duplicates and unknown keys.
   */
  template <size_t N, typename Fn>
  Status ForEachKey(const YAML::Node &map, const std::string &path,
                    const std::array<std::string_view, N> &known, Fn &&fn) const {
    if (map.IsNull()) return Status::Ok();
    const std::string where = path.empty() ? std::string("the top level") : path;
    if (!map.IsMap()) return Fail(map, where + ": expected a mapping, got " + DescribeNode(map));
    std::set<std::string> seen;
    for (const auto &kv : map) {
      const YAML::Node &k = kv.first;
      if (!k.IsScalar()) return Fail(k, where + ": expected a key name, got " + DescribeNode(k));
      const std::string &key = k.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (std::string_view name : known) list += (list.empty() ? "" : ", ") + std::string(name);
        return Fail(k, "unknown key '" + key_path + "' (known" +
                           (path.empty() ? std::string() : " in " + path) + ": " + list + ")");
      }
      if (!seen.insert(key).second) return Fail(k, "duplicate key '" + key_path + "'");
      if (Status st = fn(key, kv.second, key_path); !st.ok()) return st;
    }
    return Status::Ok();
  }

  /** Reads a plain unsigned integer in [lo, hi]. */
  Status ReadUnsigned(const YAML::Node &n, const std::string &path, u64 lo, u64 hi,
                      u64 *out) const {
    u64 v = 0;
    if (!n.IsScalar() || !ParseUnsigned(n.Scalar(), ~0ull, &v)) {
      return Fail(n, path + ": expected an unsigned integer, got " + DescribeNode(n));
    }
    if (v < lo || v > hi) {
      return Fail(n, path + ": " + std::to_string(v) + " is out of range " + std::to_string(lo) +
                         ".." + std::to_string(hi));
    }
    *out = v;
    return Status::Ok();
  }

  /** ReadUnsigned into a u32 field (hi always fits in u32). */
  Status ReadU32(const YAML::Node &n, const std::string &path, u64 lo, u64 hi, u32 *out) const {
    u64 v = 0;
    Status st = ReadUnsigned(n, path, lo, hi, &v);
    if (st.ok()) *out = static_cast<u32>(v);
    return st;
  }

  /** Reads a byte size ("65536", "64k", "1m") in [lo, hi]. */
  Status ReadSize(const YAML::Node &n, const std::string &path, u64 lo, u64 hi, u64 *out) const {
    u64 v = 0;
    if (!n.IsScalar() || !ParseSize(n.Scalar(), &v)) {
      return Fail(n, path + ": expected a size such as 65536, 64k or 1m, got " + DescribeNode(n));
    }
    if (v < lo || v > hi) {
      return Fail(n, path + ": " + n.Scalar() + " is out of range " + FormatSize(lo) + ".." +
                         FormatSize(hi));
    }
    *out = v;
    return Status::Ok();
  }

  /** Reads a scalar string; null reads as "" when allow_empty. */
  Status ReadString(const YAML::Node &n, const std::string &path, bool allow_empty,
                    std::string *out) const {
    if (allow_empty && n.IsNull()) {
      out->clear();
      return Status::Ok();
    }
    if (!n.IsScalar() || (!allow_empty && n.Scalar().empty())) {
      return Fail(n, path + ": expected a " + (allow_empty ? "" : "non-empty ") +
                         "string, got " + DescribeNode(n));
    }
    *out = n.Scalar();
    return Status::Ok();
  }

  /** workers: low_latency (>= 1) and high_latency (>= 0). */
  Status ReadWorkers(const YAML::Node &n, const std::string &path, ServerConfig *cfg) const {
    static constexpr std::array<std::string_view, 2> kKeys = {"low_latency", "high_latency"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      if (key == "low_latency") return ReadU32(v, p, 1, kMaxWorkers, &cfg->low_latency_workers);
      return ReadU32(v, p, 0, kMaxWorkers, &cfg->high_latency_workers);
    });
  }

  /** networking: port, hostfile, ipc_mode, the client's timeouts and the ZeroMQ spins. */
  Status ReadNetworking(const YAML::Node &n, const std::string &path, ServerConfig *cfg) const {
    static constexpr std::array<std::string_view, 8> kKeys = {
        "port", "hostfile", "ipc_mode", "connect_timeout_s", "reconnect_timeout_s",
        "hang_timeout_s", "zmq_spin_us", "zmq_worker_spin_us"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      if (key == "port") return ReadU32(v, p, 1, 65535, &cfg->port);
      if (key == "hostfile") return ReadString(v, p, true, &cfg->hostfile);
      if (key == "zmq_spin_us") return ReadU32(v, p, 0, kMaxZmqSpinUs, &cfg->zmq_spin_us);
      if (key == "zmq_worker_spin_us") {
        return ReadU32(v, p, 0, kMaxZmqSpinUs, &cfg->zmq_worker_spin_us);
      }
      for (const TimeoutKey &t : kTimeoutKeys) {
        if (key != t.key) continue;
        if (v.IsScalar() && ParseSeconds(v.Scalar(), kMaxTimeoutSec, &(cfg->*t.field))) {
          return Status::Ok();
        }
        return Fail(v, p + ": expected seconds 0.." + std::to_string(
                               static_cast<u64>(kMaxTimeoutSec)) + ", got " + DescribeNode(v));
      }
      std::string mode;
      if (Status st = ReadString(v, p, false, &mode); !st.ok()) return st;
      if (!IsIpcMode(mode)) {
        return Fail(v, p + ": expected one of shm|ipc|tcp, got " + DescribeNode(v));
      }
      cfg->ipc_mode = mode;
      return Status::Ok();
    });
  }

  /** gpu: the orchestrator kernel's launch shape and queue depth. */
  Status ReadGpu(const YAML::Node &n, const std::string &path, ServerConfig *cfg) const {
    static constexpr std::array<std::string_view, 3> kKeys = {"blocks", "threads_per_block",
                                                              "queue_depth"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      if (key == "blocks") return ReadU32(v, p, 1, kMaxGpuBlocks, &cfg->gpu_blocks);
      if (key == "threads_per_block") {
        return ReadU32(v, p, 1, kMaxGpuThreadsPerBlock, &cfg->gpu_threads_per_block);
      }
      return ReadU32(v, p, 1, kMaxQueueDepth, &cfg->gpu_queue_depth);
    });
  }

  /** shm: the three segment sizes of a standalone runtime. */
  Status ReadShm(const YAML::Node &n, const std::string &path, ServerConfig *cfg) const {
    static constexpr std::array<std::string_view, 4> kKeys = {"main_size", "client_data_size",
                                                              "runtime_data_size", "client_slots"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      if (key == "client_slots") {
        return ReadU32(v, p, 1, kMaxShmClientSlots, &cfg->shm_client_slots);
      }
      u64 *field = key == "main_size"          ? &cfg->main_segment_bytes
                   : key == "client_data_size" ? &cfg->client_data_bytes
                                               : &cfg->runtime_data_bytes;
      return ReadSize(v, p, kMinShmSegment, kMaxShmSegment, field);
    });
  }

  /** Reads the `memory:` section: the warm budgets every process keeps. */
  Status ReadMemory(const YAML::Node &n, const std::string &path, ServerConfig *cfg) const {
    static constexpr std::array<std::string_view, 2> kKeys = {"warm_message_bytes",
                                                              "warm_payload_bytes"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      u64 *field = key == "warm_message_bytes" ? &cfg->warm_message_bytes
                                               : &cfg->warm_payload_bytes;
      return ReadSize(v, p, 0, kMaxWarmBytes, field);
    });
  }

  /** Reads the `limits:` section: the bounds on what requests may cost the runtime. */
  Status ReadLimits(const YAML::Node &n, const std::string &path, RuntimeLimits *lim) const {
    static constexpr std::array<std::string_view, 4> kKeys = {
        "max_output_size", "max_subtask_depth", "max_hostfile_size", "max_hosts"};
    return ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                          const std::string &p) {
      if (key == "max_output_size") {
        return ReadSize(v, p, kMinOutputBound, kMaxOutputBound, &lim->max_output_size);
      }
      if (key == "max_subtask_depth") {
        return ReadU32(v, p, 1, kMaxDepthBound, &lim->max_subtask_depth);
      }
      if (key == "max_hostfile_size") {
        return ReadSize(v, p, 1, kMaxHostfileBound, &lim->max_hostfile_size);
      }
      return ReadU32(v, p, 1, kMaxHostsBound, &lim->max_hosts);
    });
  }

  /** Reads the `compose:` list; names and ids must be unique across entries. */
  Status ReadCompose(const YAML::Node &n, const std::string &path,
                     std::vector<ComposeEntry> *out) const {
    out->clear();
    if (n.IsNull()) return Status::Ok();
    if (!n.IsSequence()) return Fail(n, path + ": expected a list, got " + DescribeNode(n));
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node &item = n[i];
      const std::string item_path = path + "[" + std::to_string(i) + "]";
      ComposeEntry e;
      if (Status st = ReadComposeEntry(item, item_path, &e); !st.ok()) return st;
      for (size_t j = 0; j < out->size(); ++j) {
        const ComposeEntry &prev = (*out)[j];
        const std::string prev_path = path + "[" + std::to_string(j) + "]";
        if (prev.pool_name == e.pool_name) {
          return Fail(item, item_path + ".pool_name '" + e.pool_name + "' is also " + prev_path +
                                ".pool_name");
        }
        if (prev.pool_id == e.pool_id) {
          return Fail(item, item_path + ".pool_id " + e.pool_id.ToString() + " is also " +
                                prev_path + ".pool_id (pool '" + prev.pool_name + "')");
        }
      }
      out->push_back(std::move(e));
    }
    return Status::Ok();
  }

  /** One compose entry; mod_name, pool_name and pool_id are required. */
  Status ReadComposeEntry(const YAML::Node &n, const std::string &path, ComposeEntry *e) const {
    static constexpr std::array<std::string_view, 5> kKeys = {
        "mod_name", "pool_name", "pool_id", "pool_query", "num_containers"};
    if (!n.IsMap()) return Fail(n, path + ": expected a mapping, got " + DescribeNode(n));
    bool has_query = false;
    Status st = ForEachKey(n, path, kKeys, [&](std::string_view key, const YAML::Node &v,
                                               const std::string &p) {
      if (key == "mod_name") return ReadString(v, p, false, &e->mod_name);
      if (key == "pool_name") return ReadString(v, p, false, &e->pool_name);
      if (key == "num_containers") return ReadU32(v, p, 1, kMaxContainers, &e->num_containers);
      std::string text;
      if (Status s = ReadString(v, p, false, &text); !s.ok()) return s;
      if (key == "pool_id") {
        if (!PoolId::Parse(text, &e->pool_id).ok()) {
          return Fail(v, p + ": expected major.minor (e.g. 200.0), got " + DescribeNode(v));
        }
        if (e->pool_id.IsNull() || e->pool_id == kAdminPoolId) {
          return Fail(v, p + ": " + text + " is reserved (0.0 is null, 1.0 is the admin pool)");
        }
        return Status::Ok();
      }
      has_query = true;
      if (!PoolQuery::Parse(text, &e->pool_query).ok() || e->pool_query.IsNull()) {
        return Fail(v, p + ": expected local, dynamic, broadcast, direct_id:N, range:O:C, "
                           "physical:N, ..., got " + DescribeNode(v));
      }
      return Status::Ok();
    });
    if (!st.ok()) return st;
    for (const char *required : {"mod_name", "pool_name", "pool_id"}) {
      if (!n[required]) return Fail(n, path + "." + required + ": missing (required)");
    }
    if (!has_query) e->pool_query = PoolQuery::Local();
    return Status::Ok();
  }

  std::string source_;
};

/**
 * Reads a whole (small) file of at most max_bytes; the error names `what` and the path, and
 * for a file that is too large the bound, as `bound_key` when the config sets it (reading
 * stops just past max_bytes: a huge file costs no more than that).
 */
inline Status ReadSmallFile(const std::string &path, const char *what, std::string *out,
                            u64 max_bytes = kMaxConfigFileBytes,
                            const char *bound_key = nullptr) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    int err = errno;
    return Status::Errorf(ErrorCode::kBadConfig, "%s: cannot open '%s': %s", what, path.c_str(),
                          std::strerror(err));
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() <= max_bytes) {
    text.append(buf, n);
  }
  const int err = std::ferror(f) ? (errno != 0 ? errno : EIO) : 0;
  std::fclose(f);
  if (err != 0) {
    return Status::Errorf(ErrorCode::kBadConfig, "%s: cannot read '%s': %s", what, path.c_str(),
                          std::strerror(err));
  }
  if (text.size() > max_bytes && bound_key != nullptr) {
    // The bound before the path: a long path may be cut short, the bound must not be.
    return Status::Errorf(ErrorCode::kBadConfig, "%s: larger than %s = %llu bytes: '%s'", what,
                          bound_key, static_cast<unsigned long long>(max_bytes), path.c_str());
  }
  if (text.size() > max_bytes) {
    return Status::Errorf(ErrorCode::kBadConfig, "%s: '%s' is larger than %llu bytes", what,
                          path.c_str(), static_cast<unsigned long long>(max_bytes));
  }
  *out = std::move(text);
  return Status::Ok();
}

}  // namespace detail

/**
 * Parses YAML text into *out (which is replaced only on success; keys left out keep
 * the ServerConfig defaults). Errors are kBadConfig and read "source:line: key.path:
 * problem", e.g. "workers.low_latency: expected an unsigned integer, got 'abc'".
 */
inline Status ParseServerConfig(std::string_view yaml_text, ServerConfig *out,
                                std::string_view source_name = "<string>") {
  try {
    YAML::Node root = YAML::Load(std::string(yaml_text));
    ServerConfig cfg;
    if (Status st = detail::ConfigReader(source_name).Read(root, &cfg); !st.ok()) return st;
    *out = std::move(cfg);
    return Status::Ok();
  } catch (const YAML::Exception &e) {
    // Syntax errors: yaml-cpp's mark is 0-based; people count lines and columns from 1.
    std::string where = std::string(source_name);
    if (!e.mark.is_null()) {
      where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    }
    return detail::ConfigError(where, -1, "YAML syntax error: " + e.msg);
  } catch (const std::exception &e) {
    return detail::ConfigError(source_name, -1, std::string("cannot parse: ") + e.what());
  } catch (...) {
    return detail::ConfigError(source_name, -1, "cannot parse: unknown exception");
  }
}

/**
 * The configuration the runtime uses: the file named by CHI_SERVER_CONF (an error
 * names the path when it cannot be read), else the embedded default; then CHI_PORT,
 * CHI_IPC_MODE, CHI_CONNECT_TIMEOUT, CHI_RECONNECT_TIMEOUT, CHI_HANG_TIMEOUT (seconds) and
 * CHI_ZMQ_SPIN_US
 * override their keys (a bad value is an error naming the variable). Empty variables
 * count as unset. *out is replaced only on success.
 */
inline Status LoadServerConfig(ServerConfig *out) {
  try {
    ServerConfig cfg;
    const char *conf = std::getenv("CHI_SERVER_CONF");
    if (conf != nullptr && conf[0] != '\0') {
      std::string text;
      if (Status st = detail::ReadSmallFile(conf, "CHI_SERVER_CONF", &text); !st.ok()) return st;
      if (Status st = ParseServerConfig(text, &cfg, conf); !st.ok()) return st;
    } else if (Status st = ParseServerConfig(kDefaultConfigYaml, &cfg, "<default config>");
               !st.ok()) {
      return st;
    }
    if (const char *port = std::getenv("CHI_PORT"); port != nullptr && port[0] != '\0') {
      u64 v = 0;
      if (!detail::ParseUnsigned(port, 65535, &v) || v == 0) {
        return Status::Errorf(ErrorCode::kBadConfig,
                              "CHI_PORT: expected a port number 1..65535, got '%.40s'", port);
      }
      cfg.port = static_cast<u32>(v);
    }
    if (const char *mode = std::getenv("CHI_IPC_MODE"); mode != nullptr && mode[0] != '\0') {
      if (!detail::IsIpcMode(mode)) {
        return Status::Errorf(ErrorCode::kBadConfig,
                              "CHI_IPC_MODE: expected one of shm|ipc|tcp, got '%.40s'", mode);
      }
      cfg.ipc_mode = mode;
    }
    // The client's timeouts (seconds) and the ZeroMQ spin (whole microseconds).
    for (const TimeoutKey &t : kTimeoutKeys) {
      const char *v = std::getenv(t.env);
      if (v == nullptr || v[0] == '\0') continue;
      if (!detail::ParseSeconds(v, kMaxTimeoutSec, &(cfg.*t.field))) {
        return Status::Errorf(ErrorCode::kBadConfig, "%s: expected seconds 0..86400, got '%.40s'",
                              t.env, v);
      }
    }
    if (const char *v = std::getenv("CHI_ZMQ_SPIN_US"); v != nullptr && v[0] != '\0') {
      u64 us = 0;
      if (!detail::ParseUnsigned(v, kMaxZmqSpinUs, &us)) {
        return Status::Errorf(ErrorCode::kBadConfig,
                              "CHI_ZMQ_SPIN_US: expected microseconds 0..1000000, got '%.40s'", v);
      }
      cfg.zmq_spin_us = static_cast<u32>(us);
    }
    *out = std::move(cfg);
    return Status::Ok();
  } catch (const std::exception &e) {
    return Status::Errorf(ErrorCode::kBadConfig, "loading the configuration: %.100s", e.what());
  } catch (...) {
    return Status::Error(ErrorCode::kBadConfig, "loading the configuration: unknown exception");
  }
}

}  // namespace chi
