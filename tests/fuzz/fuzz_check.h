// What every libFuzzer harness in tests/fuzz shares: FuzzCheck, which stops the run at a
// broken property with a line naming it (libFuzzer then keeps the input as a crash), the
// check that a refusal carries a code and a message, and FuzzBytes, which splits the
// fuzzer's bytes into the selectors and the payload a harness feeds its decoder.
#pragma once

#include <cstdint>      // uint8_t
#include <cstdio>       // fprintf to stderr
#include <cstring>      // memcpy, strlen
#include <string_view>  // the rest of the input as text

#include "chi/core/status.h"  // Status, ErrorCode

namespace chi::fuzz {

/** Stops the run with "fuzz property failed: <what>" when `ok` is false. */
inline void FuzzCheck(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property failed: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

/** A refusal must say that it failed and why: a non-zero code and a non-empty message. */
inline void FuzzCheckRefusal(const Status &st, const char *what) {
  if (st.ok() || st.message()[0] == '\0') {
    std::fprintf(stderr, "refusal: code %u, message '%s'\n", static_cast<unsigned>(st.code()),
                 st.message());
  }
  FuzzCheck(!st.ok(), what);
  FuzzCheck(st.message()[0] != '\0', what);
}

/** Reads selectors off the front of the fuzzer's input; missing bytes read as zero. */
class FuzzBytes {
 public:
  FuzzBytes(const uint8_t *data, size_t size) : data_(data), size_(size) {}

  /** The next byte (0 once the input is used up). */
  uint8_t TakeByte() {
    uint8_t b = 0;
    Take(&b, 1);
    return b;
  }
  /** The next 4 bytes, little-endian (missing ones are zero). */
  uint32_t TakeU32() {
    uint32_t v = 0;
    Take(&v, sizeof(v));
    return v;
  }
  /** The next 8 bytes, little-endian (missing ones are zero). */
  uint64_t TakeU64() {
    uint64_t v = 0;
    Take(&v, sizeof(v));
    return v;
  }
  /** What is left after the selectors taken so far. */
  const char *RestData() const { return reinterpret_cast<const char *>(data_); }
  /** How many bytes are left. */
  size_t RestSize() const { return size_; }
  /** What is left, as text. */
  std::string_view RestText() const { return std::string_view(RestData(), size_); }

 private:
  /** Copies up to n bytes into out and consumes them. */
  void Take(void *out, size_t n) {
    const size_t k = n < size_ ? n : size_;
    if (k != 0) std::memcpy(out, data_, k);
    data_ += k;
    size_ -= k;
  }

  const uint8_t *data_;
  size_t size_;
};

}  // namespace chi::fuzz
