// Hostfiles: the node list of a multi-node runtime (networking.hostfile), one host per
// line, '#' comments, and bracket ranges ("node[01-04]", "rack[1-2]-gpu[0,3]") expanded in
// order. Split out of config.h, which reads the file's path; errors name file and line.
#pragma once

#include <string>       // host names
#include <string_view>  // patterns
#include <vector>       // the host list

#include "chi/runtime/config.h"  // detail::ConfigError, detail::ReadSmallFile

namespace chi {

namespace detail {

/**
 * Appends the hosts named by one hostfile pattern: "node[01-04,7]-ib" gives
 * node01-ib .. node04-ib and node7-ib; a range keeps the width of its first
 * number (zero padding). Returns false with *why set on a malformed pattern.
 */
inline bool ExpandHostPattern(std::string_view pattern, const std::string &prefix,
                              std::vector<std::string> *out, std::string *why) {
  constexpr size_t kMaxHosts = 1u << 20;
  auto fail = [why](std::string reason) {
    *why = std::move(reason);
    return false;
  };
  const size_t open = pattern.find('[');
  const size_t stray = pattern.find(']');
  if (open == std::string_view::npos) {
    if (stray != std::string_view::npos) return fail("']' without '['");
    if (out->size() >= kMaxHosts) return fail("more than 1048576 hosts");
    out->push_back(prefix + std::string(pattern));
    return true;
  }
  if (stray < open) return fail("']' without '['");
  const size_t close = pattern.find(']', open);
  if (close == std::string_view::npos) return fail("'[' without ']'");
  const std::string head = prefix + std::string(pattern.substr(0, open));
  const std::string_view rest = pattern.substr(close + 1);
  std::string_view items = pattern.substr(open + 1, close - open - 1);
  while (true) {
    const size_t comma = items.find(',');
    const std::string_view item = items.substr(0, comma);
    const size_t dash = item.find('-');
    const std::string_view lo_text = item.substr(0, dash);
    const std::string_view hi_text =
        dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    u64 lo = 0, hi = 0;
    if (!ParseUnsigned(lo_text, 0xffffffffull, &lo) ||
        !ParseUnsigned(hi_text, 0xffffffffull, &hi) || hi < lo) {
      return fail("bad range '" + std::string(item) + "' (expected N or LO-HI, LO <= HI)");
    }
    for (u64 v = lo; v <= hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < lo_text.size()) num.insert(0, lo_text.size() - num.size(), '0');
      if (!ExpandHostPattern(rest, head + num, out, why)) return false;
    }
    if (comma == std::string_view::npos) break;
    items = items.substr(comma + 1);
  }
  return true;
}

}  // namespace detail

/**
 * Reads the hosts of a hostfile given as text: one host per line, blank lines and
 * '#' comments skipped, ranges such as "node[01-04]" expanded. Replaces *hosts on success.
 */
inline Status ParseHostfileText(std::string_view text, std::vector<std::string> *hosts,
                                std::string_view source_name = "<string>") {
  try {
    std::vector<std::string> found;
    size_t line_no = 0;
    while (!text.empty()) {
      const size_t nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
      ++line_no;
      line = line.substr(0, line.find('#'));
      const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
      while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
      while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
      if (line.empty()) continue;
      std::string why;
      if (std::any_of(line.begin(), line.end(), is_space)) {
        why = "expected one host per line, got '" + std::string(line) + "'";
      } else if (detail::ExpandHostPattern(line, "", &found, &why)) {
        continue;
      }
      return detail::ConfigError(source_name, static_cast<int>(line_no) - 1, why);
    }
    *hosts = std::move(found);
    return Status::Ok();
  } catch (const std::exception &e) {
    return detail::ConfigError(source_name, -1, std::string("cannot read hosts: ") + e.what());
  } catch (...) {
    return detail::ConfigError(source_name, -1, "cannot read hosts: unknown exception");
  }
}

/** Reads a hostfile (see ParseHostfileText); a missing or unreadable file names the path. */
inline Status ParseHostfile(const std::string &path, std::vector<std::string> *hosts) {
  try {
    std::string text;
    if (Status st = detail::ReadSmallFile(path, "hostfile", &text); !st.ok()) return st;
    return ParseHostfileText(text, hosts, path);
  } catch (const std::exception &e) {
    return detail::ConfigError(path, -1, std::string("cannot read hostfile: ") + e.what());
  } catch (...) {
    return detail::ConfigError(path, -1, "cannot read hostfile: unknown exception");
  }
}

}  // namespace chi
