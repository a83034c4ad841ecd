// Runtime configuration, loading it from outside the program: LoadServerConfig with and
// without the CHI_SERVER_CONF file (missing, unreadable, bad values, long paths), the CHI_*
// environment overrides and their bad values, and hostfiles (ranges, comments, malformed
// lines). Parsing YAML text is in test_config.cc.
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv, unsetenv

#include <chi/runtime/config.h>
#include <chi/runtime/hostfile.h>

#include <array>       // the saved variable names
#include <filesystem>  // a directory for the long config path
#include <fstream>     // writing the long-path config file
#include <optional>    // saved environment values
#include <string>
#include <utility>     // the (line, message) pairs
#include <vector>

#include "config_test_support.h"  // Contains
#include "temp_file.h"            // TempFile

using chi::ErrorCode;
using chi::PoolId;
using chi::ServerConfig;
using chi::Status;
using config_test::Contains;

namespace {

/** Sets or clears the CHI_* variables for one test case and restores them after. */
class EnvGuard {
 public:
  EnvGuard() {
    for (const char *name : kNames) {
      const char *v = std::getenv(name);
      saved_.push_back(v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (size_t i = 0; i < kNames.size(); ++i) {
      if (saved_[i]) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }
  void Set(const char *name, const std::string &value) { setenv(name, value.c_str(), 1); }

 private:
  static constexpr std::array<const char *, 7> kNames = {
      "CHI_SERVER_CONF",     "CHI_PORT",         "CHI_IPC_MODE", "CHI_CONNECT_TIMEOUT",
      "CHI_RECONNECT_TIMEOUT", "CHI_HANG_TIMEOUT", "CHI_ZMQ_SPIN_US"};
  std::vector<std::optional<std::string>> saved_;
};

using chi_test::TempFile;

}  // namespace

TEST_CASE("LoadServerConfig uses the embedded default when CHI_SERVER_CONF is unset or empty") {
  EnvGuard env;
  ServerConfig cfg;
  cfg.port = 1;
  Status st = chi::LoadServerConfig(&cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg == ServerConfig{});
  env.Set("CHI_SERVER_CONF", "");
  cfg.port = 1;
  REQUIRE(chi::LoadServerConfig(&cfg).ok());
  CHECK(cfg == ServerConfig{});
}

TEST_CASE("LoadServerConfig reads the file named by CHI_SERVER_CONF") {
  EnvGuard env;
  TempFile file("queue_depth: 64\nnetworking:\n  port: 7777\n  ipc_mode: ipc\n"
                "compose:\n  - {mod_name: m, pool_name: p, pool_id: '9.1'}\n");
  env.Set("CHI_SERVER_CONF", file.path());
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.queue_depth == 64);
  CHECK(cfg.port == 7777);
  CHECK(cfg.ipc_mode == "ipc");
  CHECK(cfg.low_latency_workers == 1);  // not in the file: keeps the default
  REQUIRE(cfg.compose.size() == 1);
  CHECK(cfg.compose[0].pool_id == PoolId(9, 1));
}

TEST_CASE("LoadServerConfig reads the limits section of the CHI_SERVER_CONF file") {
  EnvGuard env;
  TempFile file("limits:\n  max_output_size: 8m\n  max_subtask_depth: 12\n"
                "  max_hostfile_size: 2k\n  max_hosts: 9\n");
  env.Set("CHI_SERVER_CONF", file.path());
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.limits.max_output_size == (8ull << 20));
  CHECK(cfg.limits.max_subtask_depth == 12);
  CHECK(cfg.limits.max_hostfile_size == 2048);
  CHECK(cfg.limits.max_hosts == 9);
  TempFile bad("limits:\n  max_output_size: 8m\n  max_subtask_depth: 0\n");
  env.Set("CHI_SERVER_CONF", bad.path());
  st = chi::LoadServerConfig(&cfg);
  const std::string msg = st.message();
  CAPTURE(msg);
  REQUIRE_FALSE(st.ok());
  CHECK(Contains(st, bad.path() + ":3: limits.max_subtask_depth: 0 is out of range 1..65536"));
  CHECK(cfg.limits.max_subtask_depth == 12);  // a failed load changes nothing
}

TEST_CASE("a missing or unreadable CHI_SERVER_CONF file is an error naming the path") {
  EnvGuard env;
  const std::string missing = "/tmp/chi_cfg_does_not_exist_" + std::to_string(getpid()) + ".yaml";
  env.Set("CHI_SERVER_CONF", missing);
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  CHECK(Contains(st, "CHI_SERVER_CONF"));
  CHECK(Contains(st, missing));
  CHECK(cfg == ServerConfig{});
  env.Set("CHI_SERVER_CONF", "/tmp");
  st = chi::LoadServerConfig(&cfg);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(Contains(st, "'/tmp'"));
}

TEST_CASE("a bad value in the CHI_SERVER_CONF file names the file, line and key") {
  EnvGuard env;
  TempFile file("gpu:\n  blocks: 1\n  threads_per_block: lots\n");
  env.Set("CHI_SERVER_CONF", file.path());
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  CHECK(Contains(st, file.path() + ":3: gpu.threads_per_block"));
}

TEST_CASE("a long config path is shortened so the key still fits in the message") {
  EnvGuard env;
  const std::string dir = "/tmp/chi_cfg_" + std::string(120, 'd') + "_" + std::to_string(getpid());
  REQUIRE(std::filesystem::create_directory(dir));
  const std::string path = dir + "/long.yaml";
  { std::ofstream(path) << "networking:\n  ipc_mode: carrier-pigeon\n"; }
  env.Set("CHI_SERVER_CONF", path);
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  std::filesystem::remove_all(dir);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(Contains(st, "long.yaml:2: networking.ipc_mode: expected one of shm|ipc|tcp"));
}

TEST_CASE("CHI_PORT and CHI_IPC_MODE override the configured values") {
  EnvGuard env;
  TempFile file("networking:\n  port: 7000\n  ipc_mode: shm\n");
  env.Set("CHI_SERVER_CONF", file.path());
  env.Set("CHI_PORT", "12345");
  env.Set("CHI_IPC_MODE", "tcp");
  ServerConfig cfg;
  Status st = chi::LoadServerConfig(&cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.port == 12345);
  CHECK(cfg.ipc_mode == "tcp");
  unsetenv("CHI_SERVER_CONF");
  env.Set("CHI_IPC_MODE", "ipc");
  REQUIRE(chi::LoadServerConfig(&cfg).ok());
  CHECK(cfg.port == 12345);
  CHECK(cfg.ipc_mode == "ipc");
}

TEST_CASE("a bad CHI_PORT or CHI_IPC_MODE is an error naming the variable") {
  for (const char *bad : {"0", "65536", "http", "-1", "80x"}) {
    EnvGuard env;
    env.Set("CHI_PORT", bad);
    ServerConfig cfg;
    Status st = chi::LoadServerConfig(&cfg);
    CAPTURE(st.message());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == ErrorCode::kBadConfig);
    CHECK(Contains(st, "CHI_PORT"));
    CHECK(Contains(st, std::string("'") + bad + "'"));
    CHECK(cfg == ServerConfig{});
  }
  for (const char *bad : {"udp", "SHM", "shm "}) {
    EnvGuard env;
    env.Set("CHI_IPC_MODE", bad);
    ServerConfig cfg;
    Status st = chi::LoadServerConfig(&cfg);
    CAPTURE(st.message());
    REQUIRE_FALSE(st.ok());
    CHECK(Contains(st, "CHI_IPC_MODE: expected one of shm|ipc|tcp"));
  }
}

TEST_CASE("CHI_CONNECT_TIMEOUT, CHI_RECONNECT_TIMEOUT, CHI_HANG_TIMEOUT and CHI_ZMQ_SPIN_US override their keys") {
  EnvGuard env;
  TempFile file(
      "networking:\n  connect_timeout_s: 1\n  reconnect_timeout_s: 2\n  hang_timeout_s: 4\n"
      "  zmq_spin_us: 3\n");
  env.Set("CHI_SERVER_CONF", file.path());
  ServerConfig cfg;
  REQUIRE(chi::LoadServerConfig(&cfg).ok());
  CHECK(cfg.connect_timeout_sec == 1);
  CHECK(cfg.reconnect_timeout_sec == 2);
  CHECK(cfg.hang_timeout_sec == 4);
  CHECK(cfg.zmq_spin_us == 3);
  env.Set("CHI_CONNECT_TIMEOUT", "0.3");
  env.Set("CHI_RECONNECT_TIMEOUT", "20");
  env.Set("CHI_HANG_TIMEOUT", "0");
  env.Set("CHI_ZMQ_SPIN_US", "50");
  Status st = chi::LoadServerConfig(&cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.connect_timeout_sec == 0.3);
  CHECK(cfg.reconnect_timeout_sec == 20);
  CHECK(cfg.hang_timeout_sec == 0);
  CHECK(cfg.zmq_spin_us == 50);
}

TEST_CASE("a bad CHI_CONNECT_TIMEOUT, CHI_RECONNECT_TIMEOUT, CHI_HANG_TIMEOUT or CHI_ZMQ_SPIN_US names it") {
  for (const char *name : {"CHI_CONNECT_TIMEOUT", "CHI_RECONNECT_TIMEOUT", "CHI_HANG_TIMEOUT",
                           "CHI_ZMQ_SPIN_US"}) {
    for (const char *bad : {"-1", "soon", "99999999"}) {
      EnvGuard env;
      env.Set(name, bad);
      ServerConfig cfg;
      Status st = chi::LoadServerConfig(&cfg);
      CAPTURE(name);
      CAPTURE(st.message());
      REQUIRE_FALSE(st.ok());
      CHECK(st.code() == ErrorCode::kBadConfig);
      CHECK(Contains(st, name));
      CHECK(Contains(st, std::string("'") + bad + "'"));
      CHECK(cfg == ServerConfig{});
    }
  }
}

TEST_CASE("a hostfile skips blank lines and comments and expands ranges") {
  TempFile file(
      "# cluster nodes\n"
      "\n"
      "head-node\n"
      "   \t\n"
      "node[01-03]   # the compute nodes\n"
      "gpu[8-10]-ib\r\n"
      "rack[1-2]n[0,5]\n"
      "last\n");
  std::vector<std::string> hosts = {"stale"};
  Status st = chi::ParseHostfile(file.path(), &hosts);
  REQUIRE_MESSAGE(st.ok(), st.message());
  const std::vector<std::string> expect = {
      "head-node", "node01",  "node02",  "node03",  "gpu8-ib", "gpu9-ib", "gpu10-ib",
      "rack1n0",   "rack1n5", "rack2n0", "rack2n5", "last"};
  CHECK(hosts == expect);
}

TEST_CASE("an empty hostfile gives no hosts") {
  TempFile file("# nothing here\n\n");
  std::vector<std::string> hosts = {"stale"};
  REQUIRE(chi::ParseHostfile(file.path(), &hosts).ok());
  CHECK(hosts.empty());
}

TEST_CASE("a missing hostfile is an error naming it") {
  const std::string missing = "/tmp/chi_hosts_missing_" + std::to_string(getpid());
  std::vector<std::string> hosts = {"kept"};
  Status st = chi::ParseHostfile(missing, &hosts);
  CAPTURE(st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == ErrorCode::kBadConfig);
  CHECK(Contains(st, "hostfile"));
  CHECK(Contains(st, missing));
  CHECK(hosts == std::vector<std::string>{"kept"});
}

TEST_CASE("a malformed hostfile line is an error naming the file and line") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"node[1-]\n", "bad range '1-'"},
      {"node[3-1]\n", "bad range '3-1'"},
      {"node[a-b]\n", "bad range 'a-b'"},
      {"node[1-2\n", "'[' without ']'"},
      {"node1]\n", "']' without '['"},
      {"node[]\n", "bad range ''"},
      {"host1 host2\n", "expected one host per line"},
  };
  for (const auto &c : cases) {
    const std::string &line = c.first;
    const std::string &needle = c.second;
    TempFile file("ok-host\n# comment\n" + line);
    std::vector<std::string> hosts;
    Status st = chi::ParseHostfile(file.path(), &hosts);
    CAPTURE(line);
    CAPTURE(st.message());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == ErrorCode::kBadConfig);
    CHECK(Contains(st, file.path() + ":3: "));
    CHECK(Contains(st, needle));
  }
}

TEST_CASE("ParseHostfileText reads hosts from memory like ParseHostfile") {
  std::vector<std::string> hosts;
  Status st = chi::ParseHostfileText("a\nb[09-11]\n", &hosts);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(hosts == std::vector<std::string>{"a", "b09", "b10", "b11"});
}

TEST_CASE("a host name with a control byte is refused, naming the line and the byte") {
  for (const std::string &text : {std::string("a\nb\vc\n"), std::string("a\nb") + '\0' + "c\n",
                                  std::string("a\nb\x7f\n")}) {
    std::vector<std::string> hosts{"kept"};
    const Status st = chi::ParseHostfileText(text, &hosts, "hosts.txt");
    CAPTURE(st.message());
    CHECK(st.code() == ErrorCode::kBadConfig);
    CHECK(Contains(st, "hosts.txt:2: "));
    CHECK(Contains(st, "control byte 0x"));
    CHECK(hosts == std::vector<std::string>{"kept"});
  }
}
