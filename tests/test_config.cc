// Runtime configuration, parsing YAML text: the embedded default matches config/, every key
// parses, sizes and queue depths are normalised, and every bad value, unknown or duplicate
// key, bad compose entry or YAML syntax error is a kBadConfig error naming its key (and
// source line). Loading from files, the environment and hostfiles is in
// test_config_loading.cc.
#include <doctest/doctest.h>

#include <chi/runtime/config.h>

#include <filesystem>  // locating config/ from this file
#include <fstream>     // reading the YAML file
#include <iterator>    // istreambuf_iterator
#include <string>
#include <utility>     // the (text, expected) pairs
#include <vector>

#include "config_test_support.h"  // Contains

using chi::ComposeEntry;
using chi::ErrorCode;
using chi::PoolId;
using chi::PoolQuery;
using chi::ServerConfig;
using chi::Status;
using config_test::Contains;

namespace {

/** The repository's config/chimaera_default.yaml (CHI_SOURCE_DIR if the build defines it). */
std::filesystem::path DefaultYamlPath() {
#ifdef CHI_SOURCE_DIR
  return std::filesystem::path(CHI_SOURCE_DIR) / "config" / "chimaera_default.yaml";
#else
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "config" /
         "chimaera_default.yaml";
#endif
}

/** Parses text that must fail; checks kBadConfig and that the message holds every needle. */
void ExpectBadConfig(const std::string &yaml, std::vector<std::string> needles) {
  ServerConfig cfg;
  Status st = chi::ParseServerConfig(yaml, &cfg);
  CAPTURE(yaml);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  for (const std::string &needle : needles) {
    CAPTURE(needle);
    CHECK(std::string(st.message()).find(needle) != std::string::npos);
  }
  CHECK(cfg == ServerConfig{});
}

}  // namespace

TEST_CASE("the embedded default config equals config/chimaera_default.yaml byte for byte") {
  const std::filesystem::path path = DefaultYamlPath();
  CAPTURE(path.string());
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(file.empty());
  INFO("edit config/chimaera_default.yaml and paste it into include/chi/runtime/default_config.h");
  CHECK(file == std::string(chi::kDefaultConfigYaml));
}

TEST_CASE("the default config parses to the ServerConfig defaults") {
  ServerConfig cfg;
  cfg.port = 1;  // proves the parse wrote the struct
  Status st = chi::ParseServerConfig(chi::kDefaultConfigYaml, &cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg == ServerConfig{});
  CHECK(cfg.low_latency_workers == 1);
  CHECK(cfg.high_latency_workers == 1);
  CHECK(cfg.queue_depth == 1024);
  CHECK(cfg.lanes_per_worker == 1);
  CHECK(cfg.fiber_stack_bytes == 65536);
  CHECK(cfg.port == 9413);
  CHECK(cfg.hostfile.empty());
  CHECK(cfg.ipc_mode == "shm");
  CHECK(cfg.connect_timeout_sec == 5);
  CHECK(cfg.reconnect_timeout_sec == 10);
  CHECK(cfg.hang_timeout_sec == 10);
  CHECK(cfg.zmq_spin_us == 20);
  CHECK(cfg.zmq_worker_spin_us == 0);
  CHECK(cfg.gpu_blocks == 1);
  CHECK(cfg.gpu_threads_per_block == 32);
  CHECK(cfg.gpu_queue_depth == 256);
  CHECK(cfg.main_segment_bytes == (64ull << 20));
  CHECK(cfg.client_data_bytes == (256ull << 20));
  CHECK(cfg.runtime_data_bytes == (256ull << 20));
  CHECK(cfg.limits.max_output_size == (1ull << 30));
  CHECK(cfg.limits.max_subtask_depth == 256);
  CHECK(cfg.limits.max_hostfile_size == (1ull << 20));
  CHECK(cfg.limits.max_hosts == 65536);
  CHECK(cfg.compose.empty());
}

TEST_CASE("an empty document or empty sections keep every default") {
  for (const char *yaml :
       {"", "# only a comment\n", "workers:\ngpu:\nshm:\nmemory:\nlimits:\ncompose:\n"}) {
    CAPTURE(yaml);
    ServerConfig cfg;
    cfg.port = 1;
    Status st = chi::ParseServerConfig(yaml, &cfg);
    REQUIRE_MESSAGE(st.ok(), st.message());
    CHECK(cfg == ServerConfig{});
  }
}

TEST_CASE("a config that sets every key parses to those values") {
  const char *yaml = R"(
workers:
  low_latency: 4
  high_latency: 2
queue_depth: 4096
lanes_per_worker: 3
fiber_stack_size: 128k
networking:
  port: 10000
  hostfile: /etc/chi/hosts
  ipc_mode: tcp
  connect_timeout_s: 2.5
  reconnect_timeout_s: 30
  zmq_spin_us: 0
  zmq_worker_spin_us: 50
gpu:
  blocks: 8
  threads_per_block: 256
  queue_depth: 512
shm:
  client_slots: 128
  main_size: 1g
  client_data_size: 512MiB
  runtime_data_size: 1048576
memory:
  warm_message_bytes: 0
  warm_payload_bytes: 256m
limits:
  max_output_size: 64m
  max_subtask_depth: 32
  max_hostfile_size: 4k
  max_hosts: 100
compose:
  - mod_name: chimaera_demo
    pool_name: demo_pool
    pool_id: "200.0"
    pool_query: local
    num_containers: 4
  - mod_name: kv_store
    pool_name: kv
    pool_id: 300.7
    pool_query: range:0:2
)";
  ServerConfig cfg;
  Status st = chi::ParseServerConfig(yaml, &cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.low_latency_workers == 4);
  CHECK(cfg.high_latency_workers == 2);
  CHECK(cfg.queue_depth == 4096);
  CHECK(cfg.lanes_per_worker == 3);
  CHECK(cfg.fiber_stack_bytes == 128 * 1024);
  CHECK(cfg.port == 10000);
  CHECK(cfg.hostfile == "/etc/chi/hosts");
  CHECK(cfg.ipc_mode == "tcp");
  CHECK(cfg.connect_timeout_sec == 2.5);
  CHECK(cfg.reconnect_timeout_sec == 30);
  CHECK(cfg.zmq_spin_us == 0);
  CHECK(cfg.zmq_worker_spin_us == 50);
  CHECK(cfg.gpu_blocks == 8);
  CHECK(cfg.gpu_threads_per_block == 256);
  CHECK(cfg.gpu_queue_depth == 512);
  CHECK(cfg.shm_client_slots == 128);
  CHECK(cfg.main_segment_bytes == (1ull << 30));
  CHECK(cfg.client_data_bytes == (512ull << 20));
  CHECK(cfg.runtime_data_bytes == (1ull << 20));
  CHECK(cfg.warm_message_bytes == 0);
  CHECK(cfg.warm_payload_bytes == (256ull << 20));
  CHECK(cfg.limits.max_output_size == (64ull << 20));
  CHECK(cfg.limits.max_subtask_depth == 32);
  CHECK(cfg.limits.max_hostfile_size == 4096);
  CHECK(cfg.limits.max_hosts == 100);
  REQUIRE(cfg.compose.size() == 2);
  CHECK(cfg.compose[0] == ComposeEntry{"chimaera_demo", "demo_pool", PoolId(200, 0),
                                       PoolQuery::Local(), 4});
  CHECK(cfg.compose[1] == ComposeEntry{"kv_store", "kv", PoolId(300, 7), PoolQuery::Range(0, 2),
                                       1});
}

TEST_CASE("a compose entry without pool_query is created locally") {
  ServerConfig cfg;
  Status st = chi::ParseServerConfig(
      "compose:\n  - {mod_name: m, pool_name: p, pool_id: '5.1'}\n", &cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  REQUIRE(cfg.compose.size() == 1);
  CHECK(cfg.compose[0].pool_query == PoolQuery::Local());
  CHECK(cfg.compose[0].num_containers == 1);
}

TEST_CASE("queue_depth is rounded up to a power of two") {
  const std::vector<std::pair<std::string, chi::u32>> cases = {
      {"2", 2}, {"3", 4}, {"1000", 1024}, {"1024", 1024}, {"1025", 2048}, {"1048576", 1048576}};
  for (const auto &c : cases) {
    const std::string &text = c.first;
    const auto expect = c.second;
    CAPTURE(text);
    ServerConfig cfg;
    Status st = chi::ParseServerConfig("queue_depth: " + text, &cfg);
    REQUIRE_MESSAGE(st.ok(), st.message());
    CHECK(cfg.queue_depth == expect);
  }
}

TEST_CASE("sizes accept byte counts and k, m, g suffixes in either case") {
  const std::vector<std::pair<std::string, chi::u64>> cases = {
      {"65536", 65536},    {"64k", 64ull << 10}, {"64K", 64ull << 10}, {"64kb", 64ull << 10},
      {"64KiB", 64ull << 10}, {"1m", 1ull << 20},  {"16M", 16ull << 20}, {"16384b", 16384}};
  for (const auto &c : cases) {
    const std::string &text = c.first;
    const auto expect = c.second;
    CAPTURE(text);
    ServerConfig cfg;
    Status st = chi::ParseServerConfig("fiber_stack_size: " + text, &cfg);
    REQUIRE_MESSAGE(st.ok(), st.message());
    CHECK(cfg.fiber_stack_bytes == expect);
  }
  ServerConfig cfg;
  REQUIRE(chi::ParseServerConfig("shm: {main_size: 2g, client_data_size: 1t}", &cfg).ok());
  CHECK(cfg.main_segment_bytes == (2ull << 30));
  CHECK(cfg.client_data_bytes == (1ull << 40));
}

TEST_CASE("a value of the wrong type is an error naming its key") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"workers:\n  low_latency: abc\n",
       "workers.low_latency: expected an unsigned integer, got 'abc'"},
      {"workers:\n  high_latency: [1, 2]\n",
       "workers.high_latency: expected an unsigned integer, got a list"},
      {"workers: 4\n", "workers: expected a mapping, got '4'"},
      {"queue_depth: -8\n", "queue_depth: expected an unsigned integer, got '-8'"},
      {"queue_depth: 1.5\n", "queue_depth: expected an unsigned integer"},
      {"lanes_per_worker: {a: 1}\n",
       "lanes_per_worker: expected an unsigned integer, got a mapping"},
      {"fiber_stack_size: lots\n", "fiber_stack_size: expected a size"},
      {"fiber_stack_size: 64q\n", "fiber_stack_size: expected a size"},
      {"fiber_stack_size: 99999999999999999999k\n", "fiber_stack_size: expected a size"},
      {"networking:\n  port: http\n", "networking.port: expected an unsigned integer, got 'http'"},
      {"networking:\n  port:\n", "networking.port: expected an unsigned integer, got nothing"},
      {"networking:\n  hostfile: [a]\n", "networking.hostfile: expected a string, got a list"},
      {"networking:\n  ipc_mode: udp\n",
       "networking.ipc_mode: expected one of shm|ipc|tcp, got 'udp'"},
      {"networking:\n  ipc_mode:\n", "networking.ipc_mode: expected a non-empty string"},
      {"networking: [1]\n", "networking: expected a mapping, got a list"},
      {"gpu:\n  blocks: many\n", "gpu.blocks: expected an unsigned integer, got 'many'"},
      {"gpu:\n  threads_per_block: true\n", "gpu.threads_per_block: expected an unsigned integer"},
      {"gpu:\n  queue_depth: 0x10\n", "gpu.queue_depth: expected an unsigned integer"},
      {"shm:\n  main_size: big\n", "shm.main_size: expected a size"},
      {"shm:\n  client_data_size: [1]\n", "shm.client_data_size: expected a size"},
      {"shm:\n  runtime_data_size: -1m\n", "shm.runtime_data_size: expected a size"},
      {"shm:\n  client_slots: many\n", "shm.client_slots: expected an unsigned integer"},
      {"memory:\n  warm_message_bytes: lots\n", "memory.warm_message_bytes: expected a size"},
      {"memory:\n  warm_payload_bytes: -64m\n", "memory.warm_payload_bytes: expected a size"},
      {"memory: 64m\n", "memory: expected a mapping, got '64m'"},
      {"limits:\n  max_output_size: lots\n", "limits.max_output_size: expected a size"},
      {"limits:\n  max_subtask_depth: deep\n",
       "limits.max_subtask_depth: expected an unsigned integer, got 'deep'"},
      {"limits:\n  max_hostfile_size: [1]\n", "limits.max_hostfile_size: expected a size"},
      {"limits:\n  max_hosts: -1\n", "limits.max_hosts: expected an unsigned integer"},
      {"limits: 5\n", "limits: expected a mapping, got '5'"},
      {"compose: {a: 1}\n", "compose: expected a list, got a mapping"},
      {"compose:\n  - just_a_name\n", "compose[0]: expected a mapping, got 'just_a_name'"},
      {"compose:\n  - {mod_name: [x], pool_name: p, pool_id: '2.0'}\n",
       "compose[0].mod_name: expected a non-empty string"},
      {"compose:\n  - {mod_name: m, pool_name: p, pool_id: '2.0', num_containers: x}\n",
       "compose[0].num_containers: expected an unsigned integer"},
      {"- 1\n- 2\n", "the top level: expected a mapping, got a list"},
      {"just text\n", "the top level: expected a mapping, got 'just text'"},
  };
  for (const auto &[yaml, needle] : cases) ExpectBadConfig(yaml, {needle});
}

TEST_CASE("an out-of-range value is an error naming its key and the range") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"workers:\n  low_latency: 0\n", "workers.low_latency: 0 is out of range 1..256"},
      {"workers:\n  high_latency: 257\n", "workers.high_latency: 257 is out of range 0..256"},
      {"workers:\n  low_latency: 200\n  high_latency: 57\n",
       "workers: low_latency + high_latency = 257"},
      {"queue_depth: 1\n", "queue_depth: 1 is out of range 2..1048576"},
      {"queue_depth: 1048577\n", "queue_depth: 1048577 is out of range"},
      {"lanes_per_worker: 0\n", "lanes_per_worker: 0 is out of range 1..64"},
      {"lanes_per_worker: 65\n", "lanes_per_worker: 65 is out of range"},
      {"fiber_stack_size: 8k\n", "fiber_stack_size: 8k is out of range 16k..16m"},
      {"fiber_stack_size: 17m\n", "fiber_stack_size: 17m is out of range"},
      {"networking:\n  port: 0\n", "networking.port: 0 is out of range 1..65535"},
      {"networking:\n  port: 65536\n", "networking.port: 65536 is out of range"},
      {"gpu:\n  blocks: 0\n", "gpu.blocks: 0 is out of range"},
      {"gpu:\n  threads_per_block: 0\n", "gpu.threads_per_block: 0 is out of range"},
      {"gpu:\n  threads_per_block: 2048\n", "gpu.threads_per_block: 2048 is out of range 1..1024"},
      {"gpu:\n  queue_depth: 0\n", "gpu.queue_depth: 0 is out of range"},
      {"shm:\n  main_size: 4k\n", "shm.main_size: 4k is out of range 64k..1t"},
      {"shm:\n  runtime_data_size: 2t\n", "shm.runtime_data_size: 2t is out of range"},
      {"shm:\n  client_slots: 0\n", "shm.client_slots: 0 is out of range 1..1024"},
      {"shm:\n  client_slots: 1025\n", "shm.client_slots: 1025 is out of range"},
      {"memory:\n  warm_message_bytes: 2t\n",
       "memory.warm_message_bytes: 2t is out of range 0..1t"},
      {"memory:\n  warm_payload_bytes: 1025g\n", "memory.warm_payload_bytes: 1025g is out of range"},
      {"limits:\n  max_output_size: 1k\n", "limits.max_output_size: 1k is out of range 4k..1t"},
      {"limits:\n  max_output_size: 2t\n", "limits.max_output_size: 2t is out of range"},
      {"limits:\n  max_subtask_depth: 0\n",
       "limits.max_subtask_depth: 0 is out of range 1..65536"},
      {"limits:\n  max_subtask_depth: 65537\n", "limits.max_subtask_depth: 65537 is out of range"},
      {"limits:\n  max_hostfile_size: 0\n",
       "limits.max_hostfile_size: 0 is out of range 1..64m"},
      {"limits:\n  max_hostfile_size: 65m\n", "limits.max_hostfile_size: 65m is out of range"},
      {"limits:\n  max_hosts: 0\n", "limits.max_hosts: 0 is out of range 1..1048576"},
      {"limits:\n  max_hosts: 1048577\n", "limits.max_hosts: 1048577 is out of range"},
      {"compose:\n  - {mod_name: m, pool_name: p, pool_id: '2.0', num_containers: 0}\n",
       "compose[0].num_containers: 0 is out of range"},
  };
  for (const auto &[yaml, needle] : cases) ExpectBadConfig(yaml, {needle});
}

TEST_CASE("an unknown key is an error naming it, at the top level and nested") {
  ExpectBadConfig("workrs:\n  low_latency: 2\n",
                  {"unknown key 'workrs'", "known: workers, queue_depth, lanes_per_worker"});
  ExpectBadConfig("workers:\n  lowlatency: 2\n", {"unknown key 'workers.lowlatency'",
                                                   "known in workers: low_latency, high_latency"});
  ExpectBadConfig("networking:\n  prot: 1\n", {"unknown key 'networking.prot'", "port"});
  ExpectBadConfig("gpu:\n  warps: 1\n", {"unknown key 'gpu.warps'", "threads_per_block"});
  ExpectBadConfig("shm:\n  data_size: 1m\n", {"unknown key 'shm.data_size'", "main_size"});
  ExpectBadConfig("memory:\n  warm_bytes: 1m\n",
                  {"unknown key 'memory.warm_bytes'", "warm_message_bytes, warm_payload_bytes"});
  ExpectBadConfig("limits:\n  max_depth: 8\n",
                  {"unknown key 'limits.max_depth'", "known in limits: max_output_size, "
                                                      "max_subtask_depth, max_hostfile_size, "
                                                      "max_hosts"});
  ExpectBadConfig("limit:\n  max_hosts: 8\n", {"unknown key 'limit'", "memory, limits, compose"});
  ExpectBadConfig("compose:\n  - {mod_name: m, pool_name: p, pool_id: '2.0', pool_qery: local}\n",
                  {"unknown key 'compose[0].pool_qery'", "pool_query"});
}

TEST_CASE("a key given twice is an error naming it") {
  ExpectBadConfig("queue_depth: 8\nqueue_depth: 16\n", {"duplicate key 'queue_depth'"});
  ExpectBadConfig("gpu:\n  blocks: 1\n  blocks: 2\n", {"duplicate key 'gpu.blocks'"});
}

TEST_CASE("compose entries need mod_name, pool_name and a usable pool_id") {
  ExpectBadConfig("compose:\n  - {pool_name: p, pool_id: '2.0'}\n",
                  {"compose[0].mod_name: missing"});
  ExpectBadConfig("compose:\n  - {mod_name: m, pool_id: '2.0'}\n",
                  {"compose[0].pool_name: missing"});
  ExpectBadConfig("compose:\n  - {mod_name: m, pool_name: p}\n", {"compose[0].pool_id: missing"});
  ExpectBadConfig("compose:\n  - {mod_name: '', pool_name: p, pool_id: '2.0'}\n",
                  {"compose[0].mod_name: expected a non-empty string, got ''"});
  for (const char *bad : {"200", "abc", "1.2.3", "-1.0", "4294967296.0"}) {
    ExpectBadConfig(std::string("compose:\n  - {mod_name: m, pool_name: p, pool_id: '") + bad +
                        "'}\n",
                    {"compose[0].pool_id: expected major.minor", bad});
  }
  ExpectBadConfig("compose:\n  - {mod_name: m, pool_name: p, pool_id: '0.0'}\n",
                  {"compose[0].pool_id: 0.0 is reserved"});
  ExpectBadConfig("compose:\n  - {mod_name: m, pool_name: p, pool_id: '1.0'}\n",
                  {"compose[0].pool_id: 1.0 is reserved", "admin"});
}

TEST_CASE("a compose entry with a bad pool_query is an error naming it") {
  for (const char *bad : {"locl", "direct_id:x", "range:1", "range:0:0", "null"}) {
    ExpectBadConfig(std::string("compose:\n  - {mod_name: m, pool_name: p, pool_id: '2.0', "
                                "pool_query: '") + bad + "'}\n",
                    {"compose[0].pool_query: expected local", std::string("got '") + bad + "'"});
  }
}

TEST_CASE("two compose entries with the same pool_name or pool_id are an error naming both") {
  ExpectBadConfig(
      "compose:\n"
      "  - {mod_name: a, pool_name: kv, pool_id: '200.0'}\n"
      "  - {mod_name: b, pool_name: other, pool_id: '201.0'}\n"
      "  - {mod_name: c, pool_name: kv, pool_id: '202.0'}\n",
      {"compose[2].pool_name 'kv' is also compose[0].pool_name"});
  ExpectBadConfig(
      "compose:\n"
      "  - {mod_name: a, pool_name: first, pool_id: '200.0'}\n"
      "  - {mod_name: b, pool_name: second, pool_id: 200.0}\n",
      {"compose[1].pool_id 200.0 is also compose[0].pool_id", "'first'"});
}

TEST_CASE("a YAML syntax error is reported with its line and column") {
  ServerConfig cfg;
  Status st = chi::ParseServerConfig("workers:\n  low_latency: 1\n  high_latency: [1, 2\n", &cfg,
                                     "broken.yaml");
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  CHECK(Contains(st, "broken.yaml:"));
  CHECK(Contains(st, "YAML syntax error"));
  st = chi::ParseServerConfig("a: 1\nb: 2\n  c: 3\n", &cfg, "indent.yaml");
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(Contains(st, "indent.yaml:3:"));
  CHECK(cfg == ServerConfig{});
}

TEST_CASE("an error names the source and the line of the bad value") {
  ServerConfig cfg;
  Status st = chi::ParseServerConfig("workers:\n  high_latency: 1\n  low_latency: abc\n", &cfg,
                                     "site.yaml");
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(std::string(st.message()) ==
        "site.yaml:3: workers.low_latency: expected an unsigned integer, got 'abc'");
}

TEST_CASE("a failed parse leaves the previous config untouched") {
  ServerConfig cfg;
  REQUIRE(chi::ParseServerConfig("queue_depth: 64\n", &cfg).ok());
  REQUIRE_FALSE(chi::ParseServerConfig("queue_depth: 128\nlanes_per_worker: 0\n", &cfg).ok());
  CHECK(cfg.queue_depth == 64);
  CHECK(cfg.lanes_per_worker == 1);
}

TEST_CASE("the client timeouts and the ZeroMQ spin are read in seconds and microseconds") {
  ServerConfig cfg;
  Status st = chi::ParseServerConfig(
      "networking:\n  connect_timeout_s: 0.25\n  reconnect_timeout_s: 0\n  hang_timeout_s: 2.5\n"
      "  zmq_spin_us: 1000000\n",
      &cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.connect_timeout_sec == 0.25);
  CHECK(cfg.reconnect_timeout_sec == 0);
  CHECK(cfg.hang_timeout_sec == 2.5);
  CHECK(cfg.zmq_spin_us == 1000000);
}

TEST_CASE("a bad client timeout or ZeroMQ spin is an error naming its key") {
  for (const char *bad : {"-1", "abc", "1e3", "5s", "86401", "[1]", "\"\""}) {
    CAPTURE(bad);
    ExpectBadConfig(std::string("networking:\n  connect_timeout_s: ") + bad + "\n",
                    {"networking.connect_timeout_s", "seconds"});
    ExpectBadConfig(std::string("networking:\n  reconnect_timeout_s: ") + bad + "\n",
                    {"networking.reconnect_timeout_s", "seconds"});
    ExpectBadConfig(std::string("networking:\n  hang_timeout_s: ") + bad + "\n",
                    {"networking.hang_timeout_s", "seconds"});
  }
  ExpectBadConfig("networking:\n  zmq_spin_us: 1000001\n",
                  {"networking.zmq_spin_us", "out of range 0..1000000"});
  ExpectBadConfig("networking:\n  zmq_spin_us: 2.5\n",
                  {"networking.zmq_spin_us", "unsigned integer"});
  ExpectBadConfig("networking:\n  zmq_worker_spin_us: 1000001\n",
                  {"networking.zmq_worker_spin_us", "out of range 0..1000000"});
  ExpectBadConfig("networking:\n  zmq_worker_spin_us: -3\n",
                  {"networking.zmq_worker_spin_us", "unsigned integer"});
}

TEST_CASE("each limits key parses on its own, keeps the others' defaults, and takes its bounds") {
  const chi::RuntimeLimits defaults;
  ServerConfig cfg;
  REQUIRE(chi::ParseServerConfig("limits:\n  max_output_size: 4k\n", &cfg).ok());
  CHECK(cfg.limits.max_output_size == 4096);
  CHECK(cfg.limits.max_subtask_depth == defaults.max_subtask_depth);
  REQUIRE(chi::ParseServerConfig("limits:\n  max_output_size: 1t\n", &cfg).ok());
  CHECK(cfg.limits.max_output_size == (1ull << 40));
  REQUIRE(chi::ParseServerConfig("limits:\n  max_subtask_depth: 1\n", &cfg).ok());
  CHECK(cfg.limits.max_subtask_depth == 1);
  CHECK(cfg.limits.max_output_size == defaults.max_output_size);
  REQUIRE(chi::ParseServerConfig("limits:\n  max_subtask_depth: 65536\n", &cfg).ok());
  CHECK(cfg.limits.max_subtask_depth == 65536);
  REQUIRE(chi::ParseServerConfig("limits:\n  max_hostfile_size: 1\n", &cfg).ok());
  CHECK(cfg.limits.max_hostfile_size == 1);
  CHECK(cfg.limits.max_hosts == defaults.max_hosts);
  REQUIRE(chi::ParseServerConfig("limits:\n  max_hostfile_size: 64m\n", &cfg).ok());
  CHECK(cfg.limits.max_hostfile_size == (64ull << 20));
  REQUIRE(chi::ParseServerConfig("limits:\n  max_hosts: 1\n", &cfg).ok());
  CHECK(cfg.limits.max_hosts == 1);
  CHECK(cfg.limits.max_hostfile_size == defaults.max_hostfile_size);
  REQUIRE(chi::ParseServerConfig("limits:\n  max_hosts: 1048576\n", &cfg).ok());
  CHECK(cfg.limits.max_hosts == 1048576);
  ExpectBadConfig("limits:\n  max_hosts: 4\n  max_hosts: 5\n",
                  {"duplicate key 'limits.max_hosts'"});
}
