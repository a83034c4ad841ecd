// What OutputArchive and InputArchive share: which types go on the wire and how,
// and the error record both keep. The wire form is the in-memory little-endian
// bytes of each scalar, with no padding and no alignment; lengths are u64.
// Invariant: an ArchiveError keeps the FIRST failure only; later ones are ignored.
#pragma once

#include <bit>          // std::endian: the wire is the in-memory byte order
#include <concepts>     // std::convertible_to
#include <string>       // std::string detection (host-only overloads)
#include <string_view>  // std::string_view detection (host-only overloads)
#include <type_traits>  // type classification for the dispatch
#include <vector>       // std::vector detection (host-only overloads)

#include "chi/core/macros.h"  // CHI_CROSS_FUN, CHI_IS_GPU
#include "chi/core/status.h"  // Status, ErrorCode
#include "chi/core/types.h"   // u8..u64

// BatchWriter::Append is __host__ __device__ but host code hands it host lambdas,
// which nvcc would flag at every such instantiation; this turns that check off
// for Append alone (device code can only build device-callable lambdas).
// serialize() members need no such help: mark them CHI_CROSS_FUN even when the
// type holds a std::string (that field then fails with kUnsupported on the device).
#if CHI_GPU_CUDA
#define CHI_SERIALIZE_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define CHI_SERIALIZE_HD_TEMPLATE
#endif

namespace chi {

static_assert(std::endian::native == std::endian::little,
              "chi archives copy scalars as in memory; the wire format is little-endian");

/** Bytes of the length prefix in front of every string and vector. */
inline constexpr u64 kLengthPrefixBytes = sizeof(u64);

namespace detail {

/** An enum whose underlying type is fixed, so every value of that type is a valid enum. */
template <typename T>
concept FixedEnum = std::is_enum_v<T> && requires { T{std::underlying_type_t<T>{}}; };

/** A scalar whose every bit pattern is a valid value: copied in bulk in both directions. */
template <typename T>
concept BulkScalar = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) ||
                     (FixedEnum<T> && !std::is_same_v<std::underlying_type_t<T>, bool>);

/** A type that opts in with `template <typename Ar> void serialize(Ar &ar)`. */
template <typename T, typename Ar>
concept HasSerialize = requires(T &t, Ar &ar) { t.serialize(ar); };

/** A type that can check itself after decode (e.g. PoolQuery::IsValid). */
template <typename T>
concept HasIsValid = requires(const T &t) {
  { t.IsValid() } -> std::convertible_to<bool>;
};

/** True for std::vector (host-only overloads; detection itself is fine on the device). */
template <typename T>
inline constexpr bool kIsStdVector = false;
template <typename T, typename A>
inline constexpr bool kIsStdVector<std::vector<T, A>> = true;

/** True for std::string (length-prefixed text); kIsStdStringView likewise. */
template <typename T>
inline constexpr bool kIsStdString = std::is_same_v<T, std::string>;
template <typename T>
inline constexpr bool kIsStdStringView = std::is_same_v<T, std::string_view>;

/** Lets a static_assert in a discarded `if constexpr` branch depend on T. */
template <typename T>
inline constexpr bool kAlwaysFalse = false;

/** Short name of a scalar type for error messages ("u32", "f64", "bool"). */
template <typename T>
CHI_CROSS_FUN constexpr const char *WireName() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_enum_v<T>) {
    return "enum";
  } else if constexpr (std::is_floating_point_v<T>) {
    return sizeof(T) == 4 ? "f32" : sizeof(T) == 8 ? "f64" : "long double";
  } else if constexpr (std::is_signed_v<T>) {
    return sizeof(T) == 1 ? "i8" : sizeof(T) == 2 ? "i16" : sizeof(T) == 4 ? "i32" : "i64";
  } else {
    return sizeof(T) == 1 ? "u8" : sizeof(T) == 2 ? "u16" : sizeof(T) == 4 ? "u32" : "u64";
  }
}

/**
 * The fewest bytes one value of T can occupy on the wire. Used to reject a length
 * prefix that the remaining input cannot possibly hold before anything is allocated.
 * Types with serialize(ar) count one byte (an element that writes nothing at all
 * cannot be bounded, so vectors of empty classes are refused at compile time).
 */
template <typename T>
CHI_CROSS_FUN constexpr u64 MinWireBytes() {
  if constexpr (std::is_same_v<T, bool> || std::is_enum_v<T> || std::is_arithmetic_v<T>) {
    return sizeof(T);
  } else if constexpr (std::is_array_v<T>) {
    return std::extent_v<T> * MinWireBytes<std::remove_extent_t<T>>();
  } else if constexpr (kIsStdString<T> || kIsStdVector<T>) {
    return kLengthPrefixBytes;
  } else {
    return 1;
  }
}

/**
 * The first failure an archive met: what it was handling, where, and the sizes
 * involved. Plain data (static strings only) so recording it is cheap on the
 * device; the human-readable Status is built only when someone asks.
 */
struct ArchiveError {
  ErrorCode code_ = ErrorCode::kOk;
  const char *item_ = nullptr;    ///< what was being read or written ("u32", "string length")
  const char *reason_ = nullptr;  ///< why it is wrong, when it is not a size problem
  u64 offset_ = 0;                ///< where the item starts, counted from the message start
  u64 need_ = 0;                  ///< bytes the item needed (size problems only)
  u64 have_ = 0;                  ///< bytes that were left (size problems only)

  /** True while nothing has failed. */
  CHI_CROSS_FUN bool ok() const { return code_ == ErrorCode::kOk; }

  /** Records a size problem unless an earlier failure is already recorded. */
  CHI_CROSS_FUN void SetSize(ErrorCode code, const char *item, u64 offset, u64 need, u64 have) {
    if (code_ != ErrorCode::kOk) return;
    code_ = code;
    item_ = item;
    reason_ = nullptr;
    offset_ = offset;
    need_ = need;
    have_ = have;
  }

  /** Records a content problem unless an earlier failure is already recorded. */
  CHI_CROSS_FUN void SetReason(ErrorCode code, const char *item, const char *reason, u64 offset) {
    if (code_ != ErrorCode::kOk) return;
    code_ = code;
    item_ = item;
    reason_ = reason;
    offset_ = offset;
    need_ = 0;
    have_ = 0;
  }

  /**
   * The failure as a Status. On the host the message reads like
   * "reading string bytes at offset 12: needs 1073741824 bytes, 88 remain";
   * device code gets the reason or item text alone (no formatting there).
   */
  CHI_CROSS_FUN Status ToStatus(bool writing) const {
    if (ok()) return Status::Ok();
#if CHI_IS_GPU
    return Status::Error(code_, reason_ != nullptr ? reason_ : item_);
#else
    const char *verb = writing ? "writing" : "reading";
    const char *item = item_ != nullptr ? item_ : "value";
    const auto off = static_cast<unsigned long long>(offset_);
    if (reason_ != nullptr) {
      return Status::Errorf(code_, "%s %s at offset %llu: %s", verb, item, off, reason_);
    }
    return Status::Errorf(code_, "%s %s at offset %llu: needs %llu bytes, %llu %s", verb, item,
                          off, static_cast<unsigned long long>(need_),
                          static_cast<unsigned long long>(have_),
                          writing ? "left in the buffer" : "remain");
#endif
  }
};

}  // namespace detail
}  // namespace chi
