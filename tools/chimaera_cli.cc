// chimaera: the runtime's command line.
//   chimaera runtime start [--log FILE] [--with-demo]   start a runtime in the background
//   chimaera runtime stop                 stop it (drains tasks, removes segments)
//   chimaera runtime status               is one serving CHI_PORT?
//   chimaera runtime clean [--min-age SEC]  remove dead runtimes' segments and ipc socket
//                                         files on every port (at least SEC old; 60)
//   chimaera monitor [--every SEC] [--count N]   admin Monitor statistics: once; N reports;
//                                         every SEC until killed; or N reports SEC apart
// A bad command line (unknown option, missing or bad value) says why and exits 2.
#include <climits>  // LONG_MAX bounds --count
#include <cstdio>   // usage text
#include <string>   // arguments

#include "runtime_control.h"  // the commands

namespace {

/** Longest --every interval accepted (a day), as config.h bounds its timeouts. */
constexpr double kMaxEverySec = 86400;
/** Shortest --every interval: a millisecond (Monitor sleeps in whole milliseconds). */
constexpr double kMinEverySec = 0.001;
/**
 * Youngest leftovers `runtime clean` may remove: a runtime starting this moment has young
 * segments whose headers may not be written yet, and a second is far longer than that.
 */
constexpr chi::u64 kMinCleanAgeSec = 1;
/** Oldest --min-age accepted (a day). */
constexpr chi::u64 kMaxCleanAgeSec = 86400;

/** Prints the usage text; returns the usage exit code 2. */
int Usage() {
  std::fprintf(stderr,
               "usage: chimaera runtime start [--log FILE] [--with-demo]\n"
               "       chimaera runtime stop | runtime status\n"
               "       chimaera runtime clean [--min-age SECONDS]\n"
               "       chimaera monitor [--every SECONDS] [--count N]\n"
               "The port is CHI_PORT (or networking.port of CHI_SERVER_CONF).\n");
  return 2;
}

/** Says what is wrong with the command line, then the usage; returns 2. */
int UsageError(const std::string &what) {
  std::fprintf(stderr, "chimaera: %s\n", what.c_str());
  return Usage();
}

/**
 * The value of the option at argv[*i], advancing *i past it; nullptr when it is missing
 * (last argument, empty, or another option), so `--every --count 3` is not read as a value.
 */
const char *OptionValue(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) return nullptr;
  const std::string value = argv[*i + 1];
  if (value.empty() || value.rfind("--", 0) == 0) return nullptr;
  return argv[++*i];
}

/**
 * `runtime start [--log FILE] [--with-demo]`: the log defaults to one per user and port
 * under /tmp; --with-demo serves the demo (test) module.
 */
int StartCommand(int argc, char **argv) {
  std::string log = "/tmp/chimaera_runtime_" + std::to_string(getuid()) + "_" +
                    std::to_string(chi_tools::ConfiguredPort()) + ".log";
  bool with_demo = false;
  for (int i = 3; i < argc; ++i) {
    const std::string opt = argv[i];
    if (opt == "--with-demo") {
      with_demo = true;
      continue;
    }
    if (opt != "--log") return UsageError("unknown option '" + opt + "' for runtime start");
    const char *value = OptionValue(argc, argv, &i);
    if (value == nullptr) return UsageError("--log needs a FILE");
    log = value;
  }
  return chi_tools::StartRuntimeDetached(log, 30, with_demo);
}

/** `runtime clean [--min-age SEC]`: SEC whole seconds from 1 to a day (default 60). */
int CleanCommand(int argc, char **argv) {
  chi::u64 min_age = chi::kStaleSweepMinAgeS;
  for (int i = 3; i < argc; ++i) {
    const std::string opt = argv[i];
    if (opt != "--min-age") return UsageError("unknown option '" + opt + "' for runtime clean");
    const char *value = OptionValue(argc, argv, &i);
    if (value == nullptr) return UsageError("--min-age needs a value");
    if (!chi::detail::ParseUnsigned(value, kMaxCleanAgeSec, &min_age) ||
        min_age < kMinCleanAgeSec) {
      return UsageError("bad --min-age value '" + std::string(value) +
                        "': expected whole seconds from 1 to 86400");
    }
  }
  return chi_tools::Clean(min_age);
}

/**
 * `monitor [--every SEC] [--count N]`, in any order: neither prints one report, --count N
 * prints N, --every SEC repeats until killed, and both print N reports SEC apart.
 */
int MonitorCommand(int argc, char **argv) {
  double every = 0;
  long count = 0;  // 0: no --count given
  for (int i = 2; i < argc; ++i) {
    const std::string opt = argv[i];
    if (opt != "--every" && opt != "--count") {
      return UsageError("unknown option '" + opt + "' for monitor");
    }
    const char *value = OptionValue(argc, argv, &i);
    if (value == nullptr) return UsageError(opt + " needs a value");
    if (opt == "--every") {
      if (!chi::detail::ParseSeconds(value, kMaxEverySec, &every) || every < kMinEverySec) {
        return UsageError("bad --every value '" + std::string(value) +
                          "': expected seconds from 0.001 to 86400, such as 1 or 0.5");
      }
    } else {
      chi::u64 n = 0;
      if (!chi::detail::ParseUnsigned(value, LONG_MAX, &n) || n == 0) {
        return UsageError("bad --count value '" + std::string(value) +
                          "': expected a whole number >= 1");
      }
      count = static_cast<long>(n);
    }
  }
  if (count == 0 && every == 0) count = 1;  // neither option: one report
  return chi_tools::Monitor(every, count);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "monitor") return MonitorCommand(argc, argv);
  if (cmd != "runtime") return UsageError("unknown command '" + cmd + "'");
  if (argc < 3) return UsageError("runtime needs start, stop, status or clean");
  const std::string sub = argv[2];
  if (sub == "start") return StartCommand(argc, argv);
  if (sub == "clean") return CleanCommand(argc, argv);
  if (sub != "stop" && sub != "status") return UsageError("unknown command 'runtime " + sub + "'");
  if (argc > 3) {
    return UsageError("unexpected argument '" + std::string(argv[3]) + "' for runtime " + sub);
  }
  return sub == "stop" ? chi_tools::StopRuntime(30) : chi_tools::Status();
}
