// Who is on the other end of a shared-memory connection, and is it still there: the
// primitive of the process reaper (ShmServer checks its clients, clients check the
// runtime). Invariant: a pid alone is never trusted, since pids are reused; an identity
// pairs it with the process's start time, and a zombie counts as dead.
#pragma once

#include <fcntl.h>   // open
#include <signal.h>  // kill(pid, 0)
#include <stdlib.h>  // strtoul of the status file's Uid line
#include <unistd.h>  // read, close, getpid

#include <cerrno>  // ESRCH
#include <cstdio>   // snprintf for the /proc path
#include <cstring>  // strstr in the status file

#include "chi/core/caller.h"  // Caller::kNoUid
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** A process as the reaper knows it: pid plus start time (clock ticks since boot). */
struct ProcessIdentity {
  u32 pid = 0;
  u64 start_ticks = 0;  ///< 0 when /proc could not tell
};

namespace detail {

/** What /proc/<pid>/stat says about a process. */
struct ProcStat {
  bool found = false;   ///< the file exists and parsed
  char state = '?';     ///< R, S, D, Z, X, ...
  u64 start_ticks = 0;  ///< field 22, starttime
};

/**
 * Reads the /proc stat file at `path` (a process's or a thread's) and calls
 * on_field(k, text) for its fields 3 up to `last`, text pointing at the field's first
 * character (fields end at a space). The command name (field 2) may hold spaces and
 * parentheses, so fields are counted from the last ')'. False when the file cannot be
 * read or names no command. Host only; a slow path.
 */
template <typename OnField>
bool ForEachStatField(const char *path, int last, OnField on_field) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char *p = nullptr;
  for (ssize_t i = n - 1; i >= 0; --i) {
    if (buf[i] == ')') {
      p = buf + i + 1;
      break;
    }
  }
  if (p == nullptr) return false;
  for (int field = 3; field <= last && *p != '\0'; ++field) {
    while (*p == ' ') ++p;
    on_field(field, p);
    while (*p != ' ' && *p != '\0') ++p;
  }
  return true;
}

/** The unsigned decimal number a stat field (ForEachStatField's `text`) starts with. */
inline u64 StatNumber(const char *text) {
  u64 v = 0;
  while (*text >= '0' && *text <= '9') v = v * 10 + static_cast<u64>(*text++ - '0');
  return v;
}

/** Reads state and start time of `pid` from /proc (host only; a slow path). */
inline ProcStat ReadProcStat(u32 pid) {
  ProcStat out;
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%u/stat", pid);
  ForEachStatField(path, 22, [&](int field, const char *text) {
    if (field == 3) out.state = *text;
    if (field != 22) return;
    out.start_ticks = StatNumber(text);
    out.found = true;
  });
  return out;
}

}  // namespace detail

/**
 * The effective user id of process `pid` from /proc/<pid>/status (the kernel's word, not
 * the process's), or Caller::kNoUid when the process or the file is gone.
 */
inline u32 ProcessUid(u32 pid) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%u/status", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Caller::kNoUid;
  char buf[2048];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return Caller::kNoUid;
  buf[n] = '\0';
  const char *line = std::strstr(buf, "\nUid:");
  if (line == nullptr) return Caller::kNoUid;
  char *end = nullptr;
  (void)strtoul(line + 5, &end, 10);  // the real uid; the effective one follows
  const unsigned long effective = strtoul(end, &end, 10);
  return end != nullptr && effective <= 0xfffffffful ? static_cast<u32>(effective)
                                                      : Caller::kNoUid;
}

/** The identity of process `pid` now (start_ticks 0 when /proc is unavailable). */
inline ProcessIdentity IdentityOf(u32 pid) {
  detail::ProcStat st = detail::ReadProcStat(pid);
  return ProcessIdentity{pid, st.found ? st.start_ticks : 0};
}

/** This process's identity. */
inline ProcessIdentity SelfIdentity() { return IdentityOf(static_cast<u32>(getpid())); }

/**
 * True while the process `who` names still runs: the pid exists, is not a zombie, and
 * (when both start times are known) started when `who` says. Without /proc it falls
 * back to kill(pid, 0).
 */
inline bool IsProcessAlive(const ProcessIdentity &who) {
  if (who.pid == 0) return false;
  detail::ProcStat st = detail::ReadProcStat(who.pid);
  if (st.found) {
    if (st.state == 'Z' || st.state == 'X') return false;
    return who.start_ticks == 0 || st.start_ticks == who.start_ticks;
  }
  return !(kill(static_cast<pid_t>(who.pid), 0) != 0 && errno == ESRCH);
}

}  // namespace chi
