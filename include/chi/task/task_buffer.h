// An owning byte buffer for task payloads (echo data, large outputs).
// Tasks cross address spaces only as archive bytes, so the buffer owns plain
// heap memory (device malloc inside kernels); serialization is length + bytes.
#pragma once

#include <cstdlib>  // malloc/free (also valid in device code)
#include <cstring>  // memcpy
#include <string_view>  // view()
#include <utility>  // std::exchange

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/status.h"  // ErrorCode for decode failures
#include "chi/core/types.h"   // u64
#if !CHI_IS_GPU
#include "chi/memory/large_block_cache.h"  // large payloads keep their pages between tasks
#endif

namespace chi {

/** Move-only-by-default byte array with deep copies when asked. */
class TaskBuffer {
 public:
  /** Largest payload accepted when decoding (1 GiB): bigger lengths are malformed. */
  static constexpr u64 kMaxDecodeBytes = 1ull << 30;

  TaskBuffer() = default;
  /** A zero-filled buffer of `size` bytes. */
  explicit TaskBuffer(u64 size) { Resize(size); }
  /** A copy of `size` bytes at `data`. */
  TaskBuffer(const void *data, u64 size) { Assign(data, size); }
  /** Deep copy (used when a task is replicated for Broadcast/Range). */
  TaskBuffer(const TaskBuffer &o) { Assign(o.data_, o.size_); }
  TaskBuffer &operator=(const TaskBuffer &o) {
    if (this != &o) Assign(o.data_, o.size_);
    return *this;
  }
  TaskBuffer(TaskBuffer &&o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  TaskBuffer &operator=(TaskBuffer &&o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~TaskBuffer() { Reset(); }

  /** Reallocates to `size` zeroed bytes; false when memory is exhausted. */
  CHI_CROSS_FUN bool Resize(u64 size) {
    if (!Allocate(size)) return false;
    if (size != 0) memset(data_, 0, size);
    return true;
  }
  /** Replaces the contents with a copy of [data, data + size). */
  CHI_CROSS_FUN bool Assign(const void *data, u64 size) {
    if (!Allocate(size)) return false;
    if (size != 0) memcpy(data_, data, size);
    return true;
  }
  /** Frees the bytes. */
  CHI_CROSS_FUN void Reset() {
    if (data_ != nullptr) FreeBytes(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

  CHI_CROSS_FUN char *data() { return data_; }
  CHI_CROSS_FUN const char *data() const { return data_; }
  CHI_CROSS_FUN u64 size() const { return size_; }
  CHI_CROSS_FUN bool empty() const { return size_ == 0; }
  std::string_view view() const { return std::string_view(data_, size_); }

  /** Length then bytes. Decoding checks the length against the input left. */
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    if constexpr (Ar::kIsOutput) {
      ar(size_);
      ar.Bytes(data_, size_);
    } else {
      u64 n = 0;
      ar(n);
      if (!ar.ok()) return;
      if (n > kMaxDecodeBytes || n > ar.Remaining()) {
        ar.Fail(ErrorCode::kTruncated, "task buffer length exceeds the bytes left");
        return;
      }
      if (!Allocate(n)) {  // not zeroed: the bytes are read over it at once
        ar.Fail(ErrorCode::kOutOfMemory, "task buffer allocation failed");
        return;
      }
      ar.Bytes(data_, n);
    }
  }

 private:
  /** Replaces the bytes with `size` uninitialized ones; false (and empty) when out of memory. */
  CHI_CROSS_FUN bool Allocate(u64 size) {
    Reset();
    if (size == 0) return true;
    data_ = static_cast<char *>(AllocateBytes(size));
    if (data_ == nullptr) return false;
    size_ = size;
    return true;
  }

  /** `size` bytes: large ones from the host's LargeBlockCache, the rest from malloc. */
  CHI_CROSS_FUN static void *AllocateBytes(u64 size) {
#if CHI_IS_GPU
    return malloc(size);
#else
    return size >= LargeBlockCache::kMinBytes ? LargeBlockCache::Instance().Allocate(size)
                                              : malloc(size);
#endif
  }
  /** Frees what AllocateBytes(size) returned. */
  CHI_CROSS_FUN static void FreeBytes(char *data, u64 size) {
#if CHI_IS_GPU
    (void)size;
    free(data);
#else
    if (size >= LargeBlockCache::kMinBytes) {
      LargeBlockCache::Instance().Free(data);
    } else {
      free(data);
    }
#endif
  }

  char *data_ = nullptr;
  u64 size_ = 0;
};

}  // namespace chi
