// Room in the shm filesystem for segments already made. tmpfs gives a segment a page only
// when the page is first written, so a segment larger than the free space is created and
// mapped without complaint, and whichever process first writes a page that no longer fits
// dies of SIGBUS: a client or the runtime, in the middle of a message. A runtime measures
// at start what its message-carrying segments may still take and refuses to serve when
// that exceeds what is free (Chimaera::CheckShmRoom), instead of crashing later. The
// measure holds for that moment only: other processes may fill /dev/shm afterwards.
#pragma once

#include <sys/stat.h>     // stat: a segment's size and the pages backing it
#include <sys/statvfs.h>  // statvfs: what the filesystem has free

#include <cerrno>   // errno
#include <cstring>  // strerror
#include <limits>   // an unlimited tmpfs
#include <string>   // names and paths
#include <vector>   // the segments measured

#include "chi/core/status.h"               // Status, ErrorCode
#include "chi/core/types.h"                // u64
#include "chi/memory/posix_shm_backend.h"  // PosixShmBackend::FilePath, kShmDir

namespace chi {

/** What a set of segments may still take from the shm filesystem, and what it has free. */
struct ShmRoom {
  u64 unbacked = 0;  ///< bytes of the segments that no page backs yet
  u64 free = 0;      ///< bytes the filesystem can still hand out (max: no limit)

  /** True when every page of the segments can be backed. */
  bool Fits() const { return unbacked <= free; }
};

/**
 * Measures the room for the segments named `names` (PosixShmBackend names). kNotFound
 * for a segment that does not exist, kIo when the filesystem cannot be read.
 */
inline Status MeasureShmRoom(const std::vector<std::string> &names, ShmRoom *out) {
  ShmRoom room;
  for (const std::string &name : names) {
    const std::string path = PosixShmBackend::FilePath(name);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      const int err = errno;
      return Status::Errorf(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                            "cannot measure segment '%s' (%s): %s", name.c_str(), path.c_str(),
                            std::strerror(err));
    }
    const u64 size = static_cast<u64>(st.st_size);
    const u64 backed = static_cast<u64>(st.st_blocks) * 512;  // st_blocks counts 512-byte units
    room.unbacked += size > backed ? size - backed : 0;
  }
  struct statvfs vfs {};
  if (statvfs(kShmDir, &vfs) != 0) {
    const int err = errno;
    return Status::Errorf(ErrorCode::kIo, "cannot read the free space of %s: %s", kShmDir,
                          std::strerror(err));
  }
  // A tmpfs mounted with size=0 has no limit and reports no blocks at all.
  room.free = vfs.f_blocks == 0 ? std::numeric_limits<u64>::max()
                                : static_cast<u64>(vfs.f_bavail) * vfs.f_frsize;
  *out = room;
  return Status::Ok();
}

}  // namespace chi
