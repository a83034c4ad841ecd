// Named POSIX shared memory (shm_open + ftruncate + mmap), shared by the runtime and its
// clients. Names are per user ("/chi_<uid>_<name>", mode 0600). Invariant: every call
// either succeeds completely or leaves nothing behind here (nothing mapped, no fd open).
#pragma once

#include <fcntl.h>     // O_CREAT, O_EXCL, O_RDWR
#include <sys/mman.h>  // shm_open, shm_unlink, mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // ftruncate, close, getuid

#include <cerrno>       // errno
#include <cstdio>       // snprintf
#include <cstring>      // strerror
#include <string>       // std::string for the OS name
#include <string_view>  // names

#include "chi/core/status.h"     // Status, ErrorCode
#include "chi/core/types.h"      // u64
#include "chi/memory/backend.h"  // MemoryBackend, BackendHeader

namespace chi {

/** Where shm_open's names appear as files (glibc on Linux). */
inline constexpr const char *kShmDir = "/dev/shm";

/** A region of named POSIX shared memory, created by one process and attached by others. */
class PosixShmBackend : public MemoryBackend {
 public:
  PosixShmBackend() = default;
  /** Unmaps (never unlinks: other processes may still use the segment). */
  ~PosixShmBackend() { Detach(); }

  /** The OS-level name of segment `name` for this user: "/chi_<uid>_<name>". */
  static std::string OsName(std::string_view name) {
    return "/chi_" + std::to_string(getuid()) + "_" + std::string(name);
  }

  /** The file that holds segment `name` (under kShmDir). */
  static std::string FilePath(std::string_view name) { return kShmDir + OsName(name); }

  /**
   * Creates segment `name` with at least `data_size` usable bytes and maps it.
   * An existing segment of that name is an error (kAlreadyExists) unless mode is kReplace.
   */
  Status Create(std::string_view name, u64 data_size,
                CreateMode mode = CreateMode::kExclusive) {
    if (Status st = CheckName(name); !st.ok()) return st;
    if (IsAttached()) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot create segment '%s': this handle is attached to '%s'",
                            std::string(name).c_str(), Name());
    }
    if (data_size == 0 || data_size > kMaxDataSize) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "segment '%s': size %llu is outside 1..%llu bytes",
                            std::string(name).c_str(), static_cast<unsigned long long>(data_size),
                            static_cast<unsigned long long>(kMaxDataSize));
    }
    const std::string os_name = OsName(name);
    if (mode == CreateMode::kReplace) shm_unlink(os_name.c_str());
    int fd = shm_open(os_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      int err = errno;
      return Status::Errorf(err == EEXIST ? ErrorCode::kAlreadyExists : ErrorCode::kIo,
                            "cannot create segment '%s' (%s): %s%s", std::string(name).c_str(),
                            os_name.c_str(), std::strerror(err),
                            err == EEXIST ? " (Destroy it or pass CreateMode::kReplace)" : "");
    }
    const u64 size = RegionSize(data_size);
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      return FailCreate(fd, os_name, name, "ftruncate");
    }
    void *base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return FailCreate(fd, os_name, name, "mmap");
    close(fd);  // the mapping keeps the segment alive; no fd is held
    WriteHeader(static_cast<BackendHeader *>(base), BackendKind::kPosixShm, size);
    SetRegion(static_cast<char *>(base), size, name);
    return Status::Ok();
  }

  /**
   * Maps an existing segment. Errors: kNotFound (missing or not yet initialised),
   * kVersionMismatch (not a chi segment, or another layout version), kSizeMismatch
   * (the file size differs from the size its header records).
   */
  Status Attach(std::string_view name) {
    if (Status st = CheckName(name); !st.ok()) return st;
    if (IsAttached()) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot attach segment '%s': this handle is attached to '%s'",
                            std::string(name).c_str(), Name());
    }
    const std::string os_name = OsName(name);
    const std::string nm(name);
    int fd = shm_open(os_name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      int err = errno;
      return Status::Errorf(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                            "cannot attach segment '%s' (%s): %s", nm.c_str(), os_name.c_str(),
                            err == ENOENT ? "it does not exist" : std::strerror(err));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int err = errno;
      close(fd);
      return Status::Errorf(ErrorCode::kIo, "cannot stat segment '%s' (%s): %s", nm.c_str(),
                            os_name.c_str(), std::strerror(err));
    }
    const u64 file_size = static_cast<u64>(st.st_size);
    if (file_size == 0) {
      close(fd);
      return Status::Errorf(ErrorCode::kNotFound,
                            "segment '%s' (%s) exists but is empty (still being created?)",
                            nm.c_str(), os_name.c_str());
    }
    if (file_size < kBackendDataOffset) {
      close(fd);
      return Status::Errorf(ErrorCode::kSizeMismatch,
                            "segment '%s' (%s) is %llu bytes, smaller than a chi header",
                            nm.c_str(), os_name.c_str(),
                            static_cast<unsigned long long>(file_size));
    }
    void *base = mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_err = errno;
    close(fd);  // not needed once mapped (or when mapping failed)
    if (base == MAP_FAILED) {
      return Status::Errorf(ErrorCode::kIo, "cannot map segment '%s' (%s): %s", nm.c_str(),
                            os_name.c_str(), std::strerror(map_err));
    }
    Status check = CheckHeader(static_cast<BackendHeader *>(base), file_size, nm, os_name);
    if (!check.ok()) {
      munmap(base, file_size);
      return check;
    }
    SetRegion(static_cast<char *>(base), file_size, name);
    return Status::Ok();
  }

  /** Unmaps the segment here (and forgets allocators registered inside it). Idempotent. */
  void Detach() {
    if (!IsAttached()) return;
    char *base = Base();
    u64 size = Size();
    ClearRegion();
    munmap(base, size);
  }

  /** Unmaps and removes the segment's name; attached processes keep their mappings. */
  Status Destroy() {
    if (!IsAttached()) {
      return Status::Error(ErrorCode::kInvalidArgument, "Destroy: no segment is attached");
    }
    std::string name(Name());
    Detach();
    return DestroyByName(name);
  }

  /** Removes segment `name` without attaching it (e.g. a stale one left by a crash). */
  static Status DestroyByName(std::string_view name) {
    if (Status st = CheckName(name); !st.ok()) return st;
    const std::string os_name = OsName(name);
    if (shm_unlink(os_name.c_str()) != 0) {
      int err = errno;
      return Status::Errorf(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                            "cannot remove segment '%s' (%s): %s", std::string(name).c_str(),
                            os_name.c_str(), std::strerror(err));
    }
    return Status::Ok();
  }

 private:
  /** Largest data size accepted (keeps size arithmetic far from overflow). */
  static constexpr u64 kMaxDataSize = 1ull << 46;

  /** Names are 1..kMaxSegmentName characters of [A-Za-z0-9._-]. */
  static Status CheckName(std::string_view name) {
    bool ok = !name.empty() && name.size() <= kMaxSegmentName;
    for (char c : name) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-');
    }
    if (ok) return Status::Ok();
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "bad segment name '%.64s': use 1..%u of [A-Za-z0-9._-]",
                          std::string(name).c_str(), kMaxSegmentName);
  }

  /** Undoes a half-made Create: closes the fd and removes the name. */
  static Status FailCreate(int fd, const std::string &os_name, std::string_view name,
                           const char *what) {
    int err = errno;
    close(fd);
    shm_unlink(os_name.c_str());
    return Status::Errorf(ErrorCode::kIo, "cannot create segment '%s' (%s): %s failed: %s",
                          std::string(name).c_str(), os_name.c_str(), what, std::strerror(err));
  }

  /** Validates a mapped header against the file it came from. */
  static Status CheckHeader(BackendHeader *h, u64 file_size, const std::string &name,
                            const std::string &os_name) {
    u64 magic = h->magic_.Load(MemOrder::kAcquire);  // pairs with WriteHeader's release
    if (magic == 0) {
      return Status::Errorf(ErrorCode::kNotFound,
                            "segment '%s' (%s) has no header yet (still being created?)",
                            name.c_str(), os_name.c_str());
    }
    if (magic != kBackendMagic) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "segment '%s' (%s) is not a chi segment (bad magic)", name.c_str(),
                            os_name.c_str());
    }
    if (h->version_ != kBackendVersion || h->data_offset_ != kBackendDataOffset) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "segment '%s' (%s) has layout version %u; this build expects %u",
                            name.c_str(), os_name.c_str(), h->version_, kBackendVersion);
    }
    if (h->size_ != file_size) {
      return Status::Errorf(ErrorCode::kSizeMismatch,
                            "segment '%s' (%s): header records %llu bytes but the file has %llu",
                            name.c_str(), os_name.c_str(),
                            static_cast<unsigned long long>(h->size_),
                            static_cast<unsigned long long>(file_size));
    }
    return Status::Ok();
  }
};

}  // namespace chi
