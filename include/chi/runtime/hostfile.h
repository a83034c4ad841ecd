// Hostfiles: the node list of a multi-node runtime (networking.hostfile), one host per
// line, '#' comments, and bracket ranges ("node[01-04]", "rack[1-2]-gpu[0,3]") expanded in
// order. Split out of config.h, which reads the file's path; errors name file and line.
// A hostfile is untrusted input: limits.max_hostfile_size bounds the file's bytes and those
// of its host names once expanded, limits.max_hosts the hosts. Each line's hosts and bytes
// are counted from its ranges before any is made, so the work done and the memory taken
// stay proportional to those bounds, however short the line.
#pragma once

#include <algorithm>    // any_of, find_if over a line
#include <cstdio>       // snprintf of a bad byte
#include <string>       // host names
#include <string_view>  // patterns
#include <vector>       // the host list

#include "chi/runtime/config.h"          // detail::ConfigError, detail::ReadSmallFile
#include "chi/runtime/runtime_limits.h"  // RuntimeLimits: max_hostfile_size, max_hosts

namespace chi {

namespace detail {

/** One item of a bracket: the numbers lo..hi, each written at least `width` digits wide. */
struct HostRange {
  u64 lo = 0;
  u64 hi = 0;
  u64 width = 0;  ///< the digits of lo as written (zero padding)
};

/** A hostfile line split at its brackets: texts[0] groups[0] texts[1] ... texts[n]. */
struct HostPattern {
  std::vector<std::string_view> texts;           ///< one more than groups
  std::vector<std::vector<HostRange>> groups;    ///< a bracket's items, in order
};

/** a + b, or ~0 when that overflows (counts compared against bounds only). */
inline u64 SaturatingAdd(u64 a, u64 b) {
  u64 r = 0;
  return __builtin_add_overflow(a, b, &r) ? ~0ull : r;
}

/** a * b, or ~0 when that overflows. */
inline u64 SaturatingMul(u64 a, u64 b) {
  u64 r = 0;
  return __builtin_mul_overflow(a, b, &r) ? ~0ull : r;
}

/**
 * Splits a hostfile pattern ("node[01-04,7]-ib") into texts and bracket groups, checking
 * every bracket from the left. Returns false with *why set on the first malformed one.
 */
inline bool ParseHostPattern(std::string_view pattern, HostPattern *out, std::string *why) {
  auto fail = [why](std::string reason) {
    *why = std::move(reason);
    return false;
  };
  out->texts.clear();
  out->groups.clear();
  for (;;) {
    const size_t open = pattern.find('[');
    const size_t stray = pattern.find(']');
    if (open == std::string_view::npos) {
      if (stray != std::string_view::npos) return fail("']' without '['");
      out->texts.push_back(pattern);
      return true;
    }
    if (stray < open) return fail("']' without '['");
    const size_t close = pattern.find(']', open);
    if (close == std::string_view::npos) return fail("'[' without ']'");
    out->texts.push_back(pattern.substr(0, open));
    std::vector<HostRange> &group = out->groups.emplace_back();
    std::string_view items = pattern.substr(open + 1, close - open - 1);
    for (;;) {
      const size_t comma = items.find(',');
      const std::string_view item = items.substr(0, comma);
      const size_t dash = item.find('-');
      const std::string_view lo_text = item.substr(0, dash);
      const std::string_view hi_text =
          dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
      HostRange r;
      if (!ParseUnsigned(lo_text, 0xffffffffull, &r.lo) ||
          !ParseUnsigned(hi_text, 0xffffffffull, &r.hi) || r.hi < r.lo) {
        return fail("bad range '" + std::string(item) + "' (expected N or LO-HI, LO <= HI)");
      }
      r.width = lo_text.size();
      group.push_back(r);
      if (comma == std::string_view::npos) break;
      items = items.substr(comma + 1);
    }
    pattern = pattern.substr(close + 1);
  }
}

/** Decimal digits of v (1 for 0). */
inline u64 DecimalDigits(u64 v) {
  u64 d = 1;
  while (v >= 10) {
    v /= 10;
    ++d;
  }
  return d;
}

/** Bytes the numbers of one range take once written: each at least r.width digits. */
inline u64 RangeTextBytes(const HostRange &r) {
  u64 total = 0;
  u64 first = 0;  // the smallest number of d digits
  for (u64 d = 1; d <= 10 && first <= r.hi; ++d) {
    const u64 last = first == 0 ? 9 : first * 10 - 1;  // the largest number of d digits
    const u64 lo = r.lo > first ? r.lo : first;
    const u64 hi = r.hi < last ? r.hi : last;
    if (lo <= hi) {
      total = SaturatingAdd(total, SaturatingMul(hi - lo + 1, d > r.width ? d : r.width));
    }
    first = first == 0 ? 10 : first * 10;
  }
  return total;
}

/**
 * What a pattern expands to, counted without expanding it: *hosts hosts that take *bytes
 * written one per line (each name and its newline), the form limits.max_hostfile_size
 * bounds. Either saturates at ~0 past what a u64 holds.
 */
inline void CountHostPattern(const HostPattern &p, u64 *hosts, u64 *bytes) {
  u64 count = 1;
  u64 text = 0;  // the bytes every name has outside the brackets
  for (std::string_view t : p.texts) text += t.size();
  std::vector<u64> sizes;
  std::vector<u64> digits;
  for (const std::vector<HostRange> &group : p.groups) {
    u64 n = 0, d = 0;
    for (const HostRange &r : group) {
      n = SaturatingAdd(n, r.hi - r.lo + 1);
      d = SaturatingAdd(d, RangeTextBytes(r));
    }
    sizes.push_back(n);
    digits.push_back(d);
    count = SaturatingMul(count, n);
  }
  *hosts = count;
  if (count == ~0ull) {
    *bytes = ~0ull;
    return;
  }
  // Every host writes the texts; group g's numbers are each written count / size_g times.
  u64 total = SaturatingMul(count, text);
  for (size_t g = 0; g < sizes.size(); ++g) {
    total = SaturatingAdd(total, SaturatingMul(digits[g], count / sizes[g]));
  }
  *bytes = SaturatingAdd(total, count);  // a newline after each host
}

/** Appends every host of a pattern, the last bracket varying fastest. */
inline void ExpandHostPattern(const HostPattern &p, std::vector<std::string> *out) {
  const size_t n = p.groups.size();
  std::vector<size_t> item(n, 0);  // per group: the item, and the number within it
  std::vector<u64> value(n);
  for (size_t g = 0; g < n; ++g) value[g] = p.groups[g][0].lo;
  std::string name;
  for (;;) {
    name.assign(p.texts[0]);
    for (size_t g = 0; g < n; ++g) {
      const std::string num = std::to_string(value[g]);
      const u64 width = p.groups[g][item[g]].width;
      if (num.size() < width) name.append(width - num.size(), '0');
      name += num;
      name += p.texts[g + 1];
    }
    out->push_back(name);
    size_t g = n;
    while (g > 0) {  // the next combination, as an odometer turns
      --g;
      if (value[g] < p.groups[g][item[g]].hi) {
        ++value[g];
        break;
      }
      if (item[g] + 1 < p.groups[g].size()) {
        value[g] = p.groups[g][++item[g]].lo;
        break;
      }
      item[g] = 0;
      value[g] = p.groups[g][0].lo;
      if (g == 0) return;
    }
    if (n == 0) return;
  }
}

}  // namespace detail

/**
 * Reads the hosts of a hostfile given as text: one host per line, blank lines and
 * '#' comments skipped, ranges such as "node[01-04]" expanded. Replaces *hosts on success.
 * Text past limits.max_hostfile_size is refused unread; a line whose expansion would take
 * the hosts past limits.max_hosts, or their lines past limits.max_hostfile_size bytes, is
 * refused before it is expanded.
 */
inline Status ParseHostfileText(std::string_view text, std::vector<std::string> *hosts,
                                std::string_view source_name = "<string>",
                                const RuntimeLimits &limits = RuntimeLimits()) {
  try {
    if (text.size() > limits.max_hostfile_size) {
      return detail::ConfigError(source_name, -1,
                                 std::to_string(text.size()) + " bytes, more than "
                                 "limits.max_hostfile_size = " +
                                     std::to_string(limits.max_hostfile_size));
    }
    std::vector<std::string> found;
    u64 bytes = 0;  // of the hosts found so far, written one per line
    detail::HostPattern pattern;
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
      // Control bytes (a vertical tab, a NUL, ...) are no part of a host name or address.
      const auto is_control = [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) == 0x7f;
      };
      if (std::any_of(line.begin(), line.end(), is_space)) {
        why = "expected one host per line, got '" + std::string(line) + "'";
      } else if (const auto bad = std::find_if(line.begin(), line.end(), is_control);
                 bad != line.end()) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(*bad));
        why = std::string("a host name may not hold the control byte ") + hex;
      } else if (detail::ParseHostPattern(line, &pattern, &why)) {
        u64 more_hosts = 0, more_bytes = 0;
        detail::CountHostPattern(pattern, &more_hosts, &more_bytes);
        const auto count = [](u64 n) {
          return n == ~0ull ? std::string("2^64 - 1 or more") : std::to_string(n);
        };
        if (more_hosts > limits.max_hosts - found.size()) {
          why = "more hosts than limits.max_hosts = " + std::to_string(limits.max_hosts) +
                ": this line would add " + count(more_hosts) + " to the " +
                std::to_string(found.size()) + " before it (not expanded)";
        } else if (more_bytes > limits.max_hostfile_size - bytes) {
          why = "host lines past limits.max_hostfile_size = " +
                std::to_string(limits.max_hostfile_size) + " bytes: this line would add " +
                count(more_bytes) + " to the " + std::to_string(bytes) +
                " before it (not expanded)";
        } else {
          detail::ExpandHostPattern(pattern, &found);
          bytes += more_bytes;
          continue;
        }
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

/**
 * Reads a hostfile (see ParseHostfileText); a missing or unreadable file names the path,
 * and one larger than limits.max_hostfile_size is refused after reading just past it.
 */
inline Status ParseHostfile(const std::string &path, std::vector<std::string> *hosts,
                            const RuntimeLimits &limits = RuntimeLimits()) {
  try {
    std::string text;
    if (Status st = detail::ReadSmallFile(path, "hostfile", &text, limits.max_hostfile_size,
                                          "limits.max_hostfile_size");
        !st.ok()) {
      return st;
    }
    return ParseHostfileText(text, hosts, path, limits);
  } catch (const std::exception &e) {
    return detail::ConfigError(path, -1, std::string("cannot read hostfile: ") + e.what());
  } catch (...) {
    return detail::ConfigError(path, -1, "cannot read hostfile: unknown exception");
  }
}

}  // namespace chi
