// libFuzzer harness for hostfiles, ParseHostfileText (hostfile.h): the input is the file's
// text, up to kMaxInputBytes (a short line can already name a million hosts). Every host
// that comes out is a plain name: non-empty, no whitespace, '#', '[' or ']'; the hosts
// written one per line parse to the same list. A refusal is kBadConfig with a message
// naming the source, and leaves the caller's list alone.
#include <cstdint>      // uint8_t
#include <string>       // host names, the list written back
#include <string_view>  // the input text
#include <vector>       // the hosts

#include "chi/runtime/hostfile.h"  // ParseHostfileText
#include "fuzz_check.h"            // FuzzCheck

using chi::Status;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;

namespace {

constexpr std::string_view kSource = "<fuzz>";
/** Longer inputs are skipped: the expansion, not the text, is what costs. */
constexpr size_t kMaxInputBytes = 4096;
/** The most hosts ExpandHostPattern hands out ("more than 1048576 hosts"). */
constexpr size_t kMaxHosts = 1u << 20;

/** ParseHostfileText, which must not throw whatever the text. */
Status Parse(std::string_view text, std::vector<std::string> *hosts) {
  try {
    return chi::ParseHostfileText(text, hosts, kSource);
  } catch (...) {
    FuzzCheck(false, "ParseHostfileText threw");
  }
  return Status::Ok();
}

/** A host name as the runtime dials it: non-empty, no whitespace, comment or bracket. */
bool PlainHost(const std::string &h) {
  return !h.empty() && h.find_first_of(" \t\r\n\v\f#[]") == std::string::npos;
}

}  // namespace

/** The input is the hostfile's text. */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  const std::vector<std::string> untouched = {"untouched"};
  std::vector<std::string> hosts = untouched;
  const Status st = Parse(text, &hosts);
  if (!st.ok()) {
    FuzzCheckRefusal(st, "a refused hostfile has a code and a message");
    FuzzCheck(st.code() == chi::ErrorCode::kBadConfig, "a refused hostfile is kBadConfig");
    FuzzCheck(std::string_view(st.message()).starts_with(kSource),
              "a refusal's message names the source");
    FuzzCheck(hosts == untouched, "a refusal leaves the caller's hosts alone");
    return 0;
  }
  FuzzCheck(hosts.size() <= kMaxHosts, "a hostfile names at most 2^20 hosts");
  std::string written;
  for (const std::string &h : hosts) {
    FuzzCheck(PlainHost(h), "every host is non-empty, without whitespace, '#', '[' or ']'");
    written += h;
    written += '\n';
  }
  std::vector<std::string> back;
  FuzzCheck(Parse(written, &back).ok(), "the hosts written one per line parse");
  FuzzCheck(back == hosts, "the hosts written one per line parse to the same hosts");
  return 0;
}
