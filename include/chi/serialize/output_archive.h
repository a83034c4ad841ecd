// OutputArchive: writes values in chi's one binary format, into a fixed buffer
// (host or device: ring-buffer slots, pinned memory, GPU scratch) or, on the host,
// onto the end of a growing std::vector<char> (ZeroMQ messages).
// Invariant: a fixed buffer is never written past its capacity; overflow sets an error.
#pragma once

#include <cstring>      // std::memcpy
#include <string>       // std::string overload (host only)
#include <string_view>  // std::string_view overload (host only)
#include <type_traits>  // dispatch on the argument type
#include <vector>       // growing-buffer mode and std::vector overload (host only)

#include "chi/core/macros.h"                // CHI_CROSS_FUN, CHI_IS_GPU, CHI_LIKELY
#include "chi/core/status.h"                // Status, ErrorCode
#include "chi/core/types.h"                 // u8..u64
#include "chi/serialize/archive_common.h"  // wire traits, ArchiveError

namespace chi {

/**
 * Serializes values; `ar(a, b, c)` writes a, then b, then c. Each argument may be
 * an arithmetic type, an enum (written as its underlying type), a fixed-size C
 * array (its elements, no length), a type with `serialize(ar)`, or on the host a
 * std::string, std::string_view or std::vector<T> (u64 length, then elements).
 * No virtual calls and no allocation in fixed-buffer mode: a task of scalar
 * fields costs one bounds check and one memcpy per field.
 * After the first error every write is a no-op; Size() stays where the error hit.
 */
class OutputArchive {
 public:
  /** Lets a serialize() branch on the direction (e.g. to validate after reading). */
  static constexpr bool kIsOutput = true;

  /** Writes into buf[0, capacity); usable on the device. */
  CHI_CROSS_FUN OutputArchive(char *buf, u64 capacity) : buf_(buf), capacity_(capacity) {}

  /**
   * Host only: appends to `grow` (keeping what it already holds), growing it as
   * needed; Size() counts only the bytes this archive wrote. The vector holds
   * exactly the written bytes after every call; do not resize it meanwhile.
   */
  explicit OutputArchive(std::vector<char> &grow)
      : buf_(grow.data() + grow.size()), grow_(&grow), base_(grow.size()) {}

  OutputArchive(const OutputArchive &) = delete;
  OutputArchive &operator=(const OutputArchive &) = delete;

  /** Writes each argument in order (see the class comment for what is accepted). */
  template <typename... Args>
  CHI_CROSS_FUN OutputArchive &operator()(Args &&...args) {
    (WriteOne(args), ...);
    return *this;
  }

  /** Writes len raw bytes with no length prefix (the reader must know len). */
  CHI_CROSS_FUN void Bytes(const void *data, u64 len) { Write(data, len, "raw bytes"); }

  /** Bytes written so far. */
  CHI_CROSS_FUN u64 Size() const { return size_; }
  /** The written bytes (valid until the next write in growing mode). */
  CHI_CROSS_FUN char *Data() const { return buf_; }
  /** True until a write fails. */
  CHI_CROSS_FUN bool ok() const { return err_.ok(); }
  /** The first failure's code (kOk when none); usable on the device. */
  CHI_CROSS_FUN ErrorCode code() const { return err_.code_; }
  /** The first failure, e.g. "writing u64 at offset 60: needs 8 bytes, 4 left in the buffer". */
  CHI_CROSS_FUN Status status() const { return err_.ToStatus(true); }

  /** The first failure as plain data (how BatchWriter keeps a dropped record's cause). */
  CHI_CROSS_FUN const detail::ArchiveError &ErrorRecord() const { return err_; }

  /** Marks the archive failed from a serialize() that refuses its own value. */
  CHI_CROSS_FUN void Fail(ErrorCode code, const char *reason) {
    err_.SetReason(code, "value", reason, size_);
  }

  /**
   * Overwrites bytes already written at [offset, offset + len): how a length or
   * count is filled in once it is known. A range outside Size() is an error.
   */
  CHI_CROSS_FUN void PatchBytes(u64 offset, const void *data, u64 len) {
    if (offset > size_ || len > size_ - offset) {
      err_.SetReason(ErrorCode::kInvalidArgument, "patch", "range lies beyond the bytes written",
                     offset);
      return;
    }
    if (len != 0) std::memcpy(buf_ + offset, data, len);
  }

  /**
   * Drops every byte after the first `size` and clears any error: how a batch
   * undoes a record that did not fit. A size beyond Size() is ignored.
   */
  CHI_CROSS_FUN void Rewind(u64 size) {
    if (size > size_) return;
    size_ = size;
    err_ = detail::ArchiveError();
#if !CHI_IS_GPU
    if (grow_ != nullptr) {
      grow_->resize(base_ + size);
      buf_ = grow_->data() + base_;
      capacity_ = size;
    }
#endif
  }

 private:
  /** Bounds-checked copy into the buffer; the fast path is one compare and a memcpy. */
  CHI_CROSS_FUN CHI_INLINE void Write(const void *src, u64 len, const char *item) {
    if (CHI_LIKELY(err_.ok() && len <= capacity_ - size_)) {
      if (len != 0) std::memcpy(buf_ + size_, src, len);
      size_ += len;
      return;
    }
    WriteSlow(src, len, item);
  }

  /** Grows the vector (host, growing mode) or records the overflow. */
  CHI_CROSS_FUN void WriteSlow(const void *src, u64 len, const char *item) {
    if (!err_.ok()) return;
#if !CHI_IS_GPU
    if (grow_ != nullptr) {
      const char *p = static_cast<const char *>(src);
      grow_->insert(grow_->end(), p, p + len);
      buf_ = grow_->data() + base_;
      size_ += len;
      capacity_ = size_;
      return;
    }
#endif
    err_.SetSize(ErrorCode::kTooLarge, item, size_, len, capacity_ - size_);
  }

  /** Writes a u64 length prefix. */
  CHI_CROSS_FUN void WriteLength(u64 n, const char *item) { Write(&n, sizeof(n), item); }

  /** Writes one argument, chosen by its type. */
  template <typename T>
  CHI_CROSS_FUN CHI_HOST_INLINE void WriteOne(const T &v) {
    using U = std::remove_cv_t<T>;
    static_assert(!std::is_pointer_v<U>,
                  "chi::OutputArchive: pointers do not cross address spaces; serialize the "
                  "pointed-to data (or an offset) instead");
    if constexpr (std::is_same_v<U, bool>) {
      const u8 b = v ? 1 : 0;
      Write(&b, 1, "bool");
    } else if constexpr (std::is_arithmetic_v<U>) {
      Write(&v, sizeof(U), detail::WireName<U>());
    } else if constexpr (std::is_enum_v<U>) {
      static_assert(detail::FixedEnum<U>,
                    "chi archives need enums with a fixed underlying type (enum class E : u32)");
      const auto raw = static_cast<std::underlying_type_t<U>>(v);
      WriteOne(raw);
    } else if constexpr (std::is_array_v<U>) {
      if constexpr (detail::BulkScalar<std::remove_all_extents_t<U>>) {
        Write(&v, sizeof(U), "array");
      } else {
        for (u64 i = 0; i < std::extent_v<U>; ++i) WriteOne(v[i]);
      }
    } else if constexpr (detail::HasSerialize<U, OutputArchive>) {
      // serialize() is one member for both directions, hence non-const; writing
      // only reads the fields, so calling it through a const reference is safe.
      const_cast<U &>(v).serialize(*this);
    } else if constexpr (detail::kIsStdString<U> || detail::kIsStdStringView<U> ||
                         detail::kIsStdVector<U>) {
#if CHI_IS_GPU
      Fail(ErrorCode::kUnsupported, "std::string and std::vector are host-only");
#else
      WriteHostContainer(v);
#endif
    } else {
      static_assert(detail::kAlwaysFalse<U>,
                    "chi::OutputArchive: give this type a `template <typename Ar> void "
                    "serialize(Ar &ar)` member, or use an arithmetic, enum or C array field");
    }
  }

#if !CHI_IS_GPU
  /** Host only: a string (u64 length + bytes) or a vector (u64 count + elements). */
  template <typename T>
  void WriteHostContainer(const T &v) {
    if constexpr (detail::kIsStdString<T> || detail::kIsStdStringView<T>) {
      WriteLength(v.size(), "string length");
      Write(v.data(), v.size(), "string bytes");
    } else {
      using E = typename T::value_type;
      static_assert(!std::is_empty_v<E>,
                    "chi archives refuse vectors of empty classes: their length cannot be "
                    "checked against the input when reading");
      WriteLength(v.size(), "vector length");
      if constexpr (detail::BulkScalar<E>) {
        Write(v.data(), v.size() * sizeof(E), "vector elements");
      } else {
        for (const auto &e : v) WriteOne(static_cast<const E &>(e));
      }
    }
  }
#endif

  char *buf_ = nullptr;
  u64 capacity_ = 0;
  u64 size_ = 0;
  std::vector<char> *grow_ = nullptr;  ///< set in growing mode (host only)
  u64 base_ = 0;                       ///< bytes the vector held before this archive
  detail::ArchiveError err_;
};

}  // namespace chi
