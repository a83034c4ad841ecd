// InputArchive: reads what OutputArchive wrote, from bytes that may be corrupt,
// truncated or hostile (another process, another node, a GPU). Used by every
// receive path and by BatchReader for each record.
// Invariant: never reads outside [buf, buf + len) and never allocates more than the
// remaining input can justify; after the first error every read is a no-op.
#pragma once

#include <cstring>      // std::memcpy
#include <string>       // std::string overload (host only)
#include <string_view>  // std::string_view overload (host only, zero-copy)
#include <type_traits>  // dispatch on the argument type
#include <utility>      // std::move
#include <vector>       // std::vector overload (host only)

#include "chi/core/macros.h"                // CHI_CROSS_FUN, CHI_IS_GPU, CHI_LIKELY
#include "chi/core/status.h"                // Status, ErrorCode
#include "chi/core/types.h"                 // u8..u64
#include "chi/serialize/archive_common.h"  // wire traits, ArchiveError

namespace chi {

/**
 * Deserializes values; `ar(a, b, c)` reads into a, then b, then c, accepting the
 * same types as OutputArchive. Failures (ok() turns false, status() explains):
 *  - kTruncated: the input ends inside a value, or a length prefix claims more
 *    bytes than remain (checked before anything is allocated);
 *  - kTooLarge: a length whose byte size does not fit in 64 bits;
 *  - kMalformed: a bool byte other than 0/1, or a type whose IsValid() is false
 *    after decode (such types check themselves, e.g. PoolQuery);
 *  - whatever a serialize() passes to Fail().
 * What a failed read leaves behind: targets are never zeroed. The target of the
 * failing read and of every later read is left UNTOUCHED when it is a scalar, an
 * array of numbers or enums, a string or a vector (those are assigned only once
 * fully decoded). A struct, or an array of bools or structs, keeps the members
 * decoded before the failure: treat the whole object as garbage once !ok().
 */
class InputArchive {
 public:
  /** Lets a serialize() branch on the direction (e.g. to validate after reading). */
  static constexpr bool kIsOutput = false;

  /** An empty archive (every read fails as truncated); BatchReader::Next fills it in. */
  CHI_CROSS_FUN InputArchive() {}

  /**
   * Reads from buf[0, len). `origin` is where buf starts inside the enclosing
   * message; it only shifts the offsets that error messages report.
   */
  CHI_CROSS_FUN InputArchive(const char *buf, u64 len, u64 origin = 0)
      : buf_(buf), len_(len), origin_(origin) {}

  /** Reads each argument in order. Arguments must be modifiable lvalues. */
  template <typename... Args>
  CHI_CROSS_FUN InputArchive &operator()(Args &&...args) {
    static_assert((std::is_lvalue_reference_v<Args> && ...),
                  "chi::InputArchive reads into variables; pass lvalues");
    (ReadOne(args), ...);
    return *this;
  }

  /** Reads len raw bytes with no length prefix; on failure data is untouched. */
  CHI_CROSS_FUN void Bytes(void *data, u64 len) { Read(data, len, "raw bytes"); }

  /** The bytes this archive reads from (e.g. to relay a record without decoding it). */
  CHI_CROSS_FUN const char *Data() const { return buf_; }
  /** Total bytes this archive may read. */
  CHI_CROSS_FUN u64 Size() const { return len_; }
  /** Bytes not yet read (a failed read consumes nothing). */
  CHI_CROSS_FUN u64 Remaining() const { return len_ - pos_; }
  /** Bytes read so far. */
  CHI_CROSS_FUN u64 Position() const { return pos_; }
  /** True until a read fails. */
  CHI_CROSS_FUN bool ok() const { return err_.ok(); }
  /** The first failure's code (kOk when none); usable on the device. */
  CHI_CROSS_FUN ErrorCode code() const { return err_.code_; }
  /** The first failure, e.g. "reading string bytes at offset 12: needs 1073741824 bytes, 88 remain". */
  CHI_CROSS_FUN Status status() const { return err_.ToStatus(false); }

  /**
   * Marks the archive failed from a serialize() that finds its decoded value
   * unacceptable (e.g. ErrorCode::kMalformed, "method id out of range").
   */
  CHI_CROSS_FUN void Fail(ErrorCode code, const char *reason) {
    err_.SetReason(code, "value", reason, origin_ + pos_);
  }

 private:
  /** Bounds-checked copy out of the buffer; dst is untouched unless all len bytes fit. */
  CHI_CROSS_FUN CHI_INLINE bool Read(void *dst, u64 len, const char *item) {
    if (CHI_LIKELY(err_.ok() && len <= len_ - pos_)) {
      if (len != 0) std::memcpy(dst, buf_ + pos_, len);
      pos_ += len;
      return true;
    }
    err_.SetSize(ErrorCode::kTruncated, item, origin_ + pos_, len, len_ - pos_);
    return false;
  }

  /**
   * Reads a u64 count of elements that each occupy at least min_bytes and checks
   * that the rest of the input can hold them: the guard that keeps a forged
   * length from turning into a huge allocation or a long loop.
   */
  CHI_CROSS_FUN bool ReadLength(u64 *n, u64 min_bytes, const char *item) {
    const u64 at = pos_;
    u64 count = 0;
    if (!Read(&count, sizeof(count), item)) return false;
    const u64 left = len_ - pos_;
    if (count > ~0ull / min_bytes) {
      err_.SetSize(ErrorCode::kTooLarge, item, origin_ + at, ~0ull, left);
      pos_ = at;  // a rejected read consumes nothing
      return false;
    }
    if (count * min_bytes > left) {
      err_.SetSize(ErrorCode::kTruncated, item, origin_ + at, count * min_bytes, left);
      pos_ = at;
      return false;
    }
    *n = count;
    return true;
  }

  /** Reads one argument, chosen by its type. */
  template <typename T>
  CHI_CROSS_FUN CHI_HOST_INLINE void ReadOne(T &v) {
    static_assert(!std::is_const_v<T>, "chi::InputArchive cannot read into a const value");
    static_assert(!std::is_pointer_v<T>,
                  "chi::InputArchive: pointers do not cross address spaces");
    if constexpr (std::is_same_v<T, bool>) {
      ReadBool(&v);
    } else if constexpr (std::is_arithmetic_v<T>) {
      ReadScalar(&v, detail::WireName<T>());
    } else if constexpr (std::is_enum_v<T>) {
      static_assert(detail::FixedEnum<T>,
                    "chi archives need enums with a fixed underlying type (enum class E : u32)");
      using Raw = std::underlying_type_t<T>;
      if constexpr (std::is_same_v<Raw, bool>) {
        bool b = false;
        if (ReadBool(&b)) v = static_cast<T>(b);
      } else {
        // A fixed underlying type makes every bit pattern a valid enum value.
        ReadScalar(&v, "enum");
      }
    } else if constexpr (std::is_array_v<T>) {
      if constexpr (detail::BulkScalar<std::remove_all_extents_t<T>>) {
        Read(&v, sizeof(T), "array");
      } else {
        for (u64 i = 0; i < std::extent_v<T>; ++i) ReadOne(v[i]);
      }
    } else if constexpr (detail::HasSerialize<T, InputArchive>) {
      [[maybe_unused]] const u64 start = pos_;
      v.serialize(*this);
      if constexpr (detail::HasIsValid<T>) {
        if (err_.ok() && !v.IsValid()) {
          err_.SetReason(ErrorCode::kMalformed, "value", "IsValid() is false after decode",
                         origin_ + start);
        }
      }
    } else if constexpr (detail::kIsStdString<T> || detail::kIsStdStringView<T> ||
                         detail::kIsStdVector<T>) {
#if CHI_IS_GPU
      Fail(ErrorCode::kUnsupported, "std::string and std::vector are host-only");
#else
      ReadHostContainer(v);
#endif
    } else {
      static_assert(detail::kAlwaysFalse<T>,
                    "chi::InputArchive: give this type a `template <typename Ar> void "
                    "serialize(Ar &ar)` member, or use an arithmetic, enum or C array field");
    }
  }

  /**
   * Reads one number or enum through a local, then stores it whole: copied straight into
   * the target from an unaligned offset, it became one byte store per byte (on a GPU, each
   * a separate write to the task's memory, and the next read of it a round trip).
   */
  template <typename T>
  CHI_CROSS_FUN CHI_INLINE void ReadScalar(T *v, const char *item) {
    T tmp;
    if (Read(&tmp, sizeof(T), item)) *v = tmp;
  }

  /** Reads a bool, rejecting bytes other than 0 and 1 (any other is not a bool). */
  CHI_CROSS_FUN bool ReadBool(bool *out) {
    u8 b = 0;
    if (!Read(&b, 1, "bool")) return false;
    if (b > 1) {
      err_.SetReason(ErrorCode::kMalformed, "bool", "byte is neither 0 nor 1", origin_ + pos_ - 1);
      return false;
    }
    *out = b == 1;
    return true;
  }

#if !CHI_IS_GPU
  /**
   * Host only: a string, a string_view (pointing INTO the input buffer: valid only
   * while that buffer lives) or a vector. Assigned to v only once fully decoded.
   */
  template <typename T>
  void ReadHostContainer(T &v) {
    if constexpr (detail::kIsStdString<T> || detail::kIsStdStringView<T>) {
      u64 n = 0;
      if (!ReadLength(&n, 1, "string length")) return;
      v = T(buf_ + pos_, n);
      pos_ += n;
    } else {
      using E = typename T::value_type;
      static_assert(!std::is_empty_v<E>,
                    "chi archives refuse vectors of empty classes: their length cannot be "
                    "checked against the input when reading");
      u64 n = 0;
      if (!ReadLength(&n, detail::MinWireBytes<E>(), "vector length")) return;
      if constexpr (detail::BulkScalar<E>) {
        v.resize(n);
        if (n != 0) std::memcpy(v.data(), buf_ + pos_, n * sizeof(E));
        pos_ += n * sizeof(E);
      } else {
        // Elements of varying size: decode into a fresh vector and hand it over
        // only when all are good. Reserve no more bytes than the input has left;
        // beyond that the vector grows only as elements actually decode.
        const u64 fit = (len_ - pos_) / sizeof(E);
        T tmp;
        tmp.reserve(n < fit ? n : fit);
        for (u64 i = 0; i < n && err_.ok(); ++i) {
          if constexpr (std::is_same_v<E, bool>) {
            bool b = false;
            ReadBool(&b);
            tmp.push_back(b);
          } else {
            tmp.emplace_back();
            ReadOne(tmp.back());
          }
        }
        if (err_.ok()) v = std::move(tmp);
      }
    }
  }
#endif

  const char *buf_ = nullptr;
  u64 len_ = 0;
  u64 pos_ = 0;
  u64 origin_ = 0;  ///< offset of buf_ in the enclosing message (error messages only)
  detail::ArchiveError err_;
};

}  // namespace chi
