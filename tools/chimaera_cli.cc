// chimaera: the runtime's command line.
//   chimaera runtime start [--log FILE]   start a runtime in the background
//   chimaera runtime stop                 stop it (drains tasks, removes segments)
//   chimaera runtime status               is one serving CHI_PORT?
//   chimaera monitor [--every SEC] [--count N]   admin Monitor statistics
#include <cstdio>   // usage text
#include <cstdlib>  // strtod, strtol
#include <string>   // arguments

#include "runtime_control.h"  // the commands

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: chimaera runtime start [--log FILE] | runtime stop | runtime status\n"
               "       chimaera monitor [--every SECONDS] [--count N]\n"
               "The port is CHI_PORT (or networking.port of CHI_SERVER_CONF).\n");
  return 2;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "runtime" && argc >= 3) {
    const std::string sub = argv[2];
    if (sub == "start") {
      std::string log = "/tmp/chimaera_runtime_" + std::to_string(getuid()) + "_" +
                        std::to_string(chi_tools::ConfiguredPort()) + ".log";
      for (int i = 3; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--log") log = argv[i + 1];
      }
      return chi_tools::StartRuntimeDetached(log, 30);
    }
    if (sub == "stop") return chi_tools::StopRuntime(30);
    if (sub == "status") return chi_tools::Status();
    return Usage();
  }
  if (cmd == "monitor") {
    double every = 0;
    long count = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string opt = argv[i];
      if (opt == "--every") {
        every = std::strtod(argv[i + 1], nullptr);
        count = 0;
      } else if (opt == "--count") {
        count = std::strtol(argv[i + 1], nullptr, 10);
      } else {
        return Usage();
      }
    }
    return chi_tools::Monitor(every, count);
  }
  return Usage();
}
