// A string stored inline in a fixed array: names inside tasks (module, pool),
// which may live in shared or GPU memory and so cannot hold a std::string.
#pragma once

#include <string>       // ToString
#include <string_view>  // construction from text

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/status.h"  // ErrorCode for decode failures
#include "chi/core/types.h"   // u32

namespace chi {

/** Up to N-1 characters plus a terminating NUL, trivially copyable. */
template <u32 N>
class FixedString {
 public:
  static constexpr u32 kCapacity = N - 1;

  /**
   * Empty. Only the terminator is written: `data_[N] = {}` made nvcc copy N bytes from a
   * zero-filled global, one byte load and store each, into every task built on a GPU.
   */
  CHI_CROSS_FUN constexpr FixedString() { data_[0] = '\0'; }
  /** Copies at most kCapacity characters; Fits() says whether s was whole. */
  FixedString(std::string_view s) { Assign(s.data(), static_cast<u32>(s.size())); }
  FixedString(const char *s) : FixedString(std::string_view(s)) {}

  /** Copies len bytes (clipped to kCapacity). */
  CHI_CROSS_FUN void Assign(const char *s, u32 len) {
    truncated_ = len > kCapacity;
    size_ = truncated_ ? kCapacity : len;
    for (u32 i = 0; i < size_; ++i) data_[i] = s[i];
    data_[size_] = '\0';
  }

  CHI_CROSS_FUN const char *c_str() const { return data_; }
  CHI_CROSS_FUN u32 size() const { return size_; }
  CHI_CROSS_FUN bool empty() const { return size_ == 0; }
  /** False when the assigned text was longer than the capacity and was clipped. */
  CHI_CROSS_FUN bool Fits() const { return !truncated_; }
  std::string_view view() const { return std::string_view(data_, size_); }
  std::string ToString() const { return std::string(data_, size_); }
  bool operator==(std::string_view s) const { return view() == s; }

  /** Length then bytes; a decoded length above the capacity is malformed input. */
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    u32 size = size_;
    ar(size);
    SerializeText(ar, size);
  }

  /**
   * The bytes alone, for a caller that carries the length `size` itself (writing, it is
   * size()); a decoded length above the capacity is malformed input.
   */
  template <typename Ar>
  CHI_CROSS_FUN void SerializeText(Ar &ar, u32 size) {
    if constexpr (Ar::kIsOutput) {
      ar.Bytes(data_, size_);
    } else {
      if (!ar.ok()) return;
      if (size > kCapacity) {  // only reachable while decoding bad bytes
        size_ = 0;
        ar.Fail(ErrorCode::kMalformed, "fixed string longer than its capacity");
        data_[0] = '\0';
        return;
      }
      ar.Bytes(data_, size);
      if (!ar.ok()) return;
      size_ = size;
      truncated_ = false;
      data_[size_] = '\0';
    }
  }

 private:
  u32 size_ = 0;
  bool truncated_ = false;
  char data_[N];  ///< data_[size_] is NUL; the bytes after it are unspecified
};

}  // namespace chi
