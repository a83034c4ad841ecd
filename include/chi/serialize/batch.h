// Batches: many records (tasks) in one buffer with a count (seed 004), the unit a
// ring-buffer slot, a ZeroMQ message or a GPU mailbox carries.
// Layout: a 24-byte header {u32 magic 'CHIB', u32 version, u32 count, u32 flags = 0,
// u64 payload bytes}, then per record {u64 length, bytes}.
// Invariant: each record is read through its own bounded InputArchive, so a bad
// record can never read into the next one or past the batch.
#pragma once

#include <cstring>  // std::memcpy of record lengths
#include <vector>   // growing-buffer mode (host only)

#include "chi/core/macros.h"                // CHI_CROSS_FUN
#include "chi/core/status.h"                // Status, ErrorCode
#include "chi/core/types.h"                 // u32, u64
#include "chi/serialize/archive_common.h"  // ArchiveError
#include "chi/serialize/input_archive.h"   // InputArchive for each record
#include "chi/serialize/output_archive.h"  // OutputArchive underneath the writer

namespace chi {

inline constexpr u32 kBatchMagic = 0x42494843;  ///< "CHIB" in memory order
inline constexpr u32 kBatchVersion = 1;
inline constexpr u64 kBatchHeaderBytes = 24;
inline constexpr u64 kBatchRecordPrefixBytes = sizeof(u64);

namespace detail {
/** Header field offsets, patched by the writer as records are added. */
inline constexpr u64 kBatchCountOffset = 8;
inline constexpr u64 kBatchPayloadOffset = 16;
}  // namespace detail

/**
 * Writes records into one buffer. The header is rewritten after every record, so
 * Data()/Size() is a complete, valid batch at any moment between records.
 * A record that does not fit (or whose serialize fails) is dropped whole: the
 * batch keeps the records before it, EndRecord()/Append() return false and
 * status() says why. That is the cue to send this batch and retry the record in
 * a fresh one; nothing is silently lost.
 *
 *   chi::BatchWriter w(buf, sizeof(buf));
 *   if (!w.Append([&](chi::OutputArchive &ar) { task.SerializeIn(ar); })) { flush; retry; }
 */
class BatchWriter {
 public:
  /** Writes into buf[0, capacity); usable on the device. */
  CHI_CROSS_FUN BatchWriter(char *buf, u64 capacity) : ar_(buf, capacity) { WriteHeader(); }

  /** Host only: appends one batch to the end of `grow`. */
  explicit BatchWriter(std::vector<char> &grow) : ar_(grow) { WriteHeader(); }

  BatchWriter(const BatchWriter &) = delete;
  BatchWriter &operator=(const BatchWriter &) = delete;

  /**
   * Starts a record and returns the archive to serialize it into. Call EndRecord()
   * when done; starting a second record first drops the open one.
   */
  CHI_CROSS_FUN OutputArchive &BeginRecord() {
    if (!header_ok_) {  // the archive keeps the header's error: every write is a no-op
      in_record_ = true;
      return ar_;
    }
    if (in_record_) ar_.Rewind(record_start_);
    record_start_ = ar_.Size();
    in_record_ = true;
    const u64 placeholder = 0;
    ar_.Bytes(&placeholder, sizeof(placeholder));
    return ar_;
  }

  /** Closes the record; false when it failed or did not fit and was dropped. */
  CHI_CROSS_FUN bool EndRecord() {
    if (!in_record_) {
      last_error_ = detail::ArchiveError();
      last_error_.SetReason(ErrorCode::kInvalidArgument, "record",
                            "EndRecord without BeginRecord", ar_.Size());
      return false;
    }
    in_record_ = false;
    if (!header_ok_) return false;
    if (ar_.ok() && count_ == ~0u) {
      ar_.Fail(ErrorCode::kTooLarge, "a batch holds at most 2^32 - 1 records");
    }
    if (!ar_.ok()) {
      last_error_ = ar_.ErrorRecord();
      ar_.Rewind(record_start_);
      return false;
    }
    const u64 len = ar_.Size() - record_start_ - kBatchRecordPrefixBytes;
    ar_.PatchBytes(record_start_, &len, sizeof(len));
    ++count_;
    const u64 payload = ar_.Size() - kBatchHeaderBytes;
    ar_.PatchBytes(detail::kBatchCountOffset, &count_, sizeof(count_));
    ar_.PatchBytes(detail::kBatchPayloadOffset, &payload, sizeof(payload));
    last_error_ = detail::ArchiveError();
    return true;
  }

  /** One record written by fn(OutputArchive &); false when it was dropped. */
  CHI_SERIALIZE_HD_TEMPLATE
  template <typename Fn>
  CHI_CROSS_FUN bool Append(Fn &&fn) {
    static_cast<Fn &&>(fn)(BeginRecord());  // std::forward, without a host-only call
    return EndRecord();
  }

  /** Records in the batch. */
  CHI_CROSS_FUN u32 Count() const { return count_; }
  /** Bytes of the whole batch (header and records) once the open record is closed. */
  CHI_CROSS_FUN u64 Size() const { return in_record_ ? record_start_ : ar_.Size(); }
  /** The batch bytes (in growing mode: valid until the next write). */
  CHI_CROSS_FUN const char *Data() const { return ar_.Data(); }
  /** False when the last record was dropped or the header did not fit. */
  CHI_CROSS_FUN bool ok() const { return header_ok_ && last_error_.ok(); }
  /** Why the last record was dropped (or the header did not fit). */
  CHI_CROSS_FUN Status status() const {
    return (header_ok_ ? last_error_ : header_error_).ToStatus(true);
  }

 private:
  /** Writes the header with zero records; a buffer too small for it fails every record. */
  CHI_CROSS_FUN void WriteHeader() {
    const u32 magic = kBatchMagic, version = kBatchVersion, count = 0, flags = 0;
    const u64 payload = 0;
    ar_(magic, version, count, flags, payload);
    header_ok_ = ar_.ok();
    if (!header_ok_) header_error_ = ar_.ErrorRecord();
  }

  OutputArchive ar_;
  u64 record_start_ = 0;
  u32 count_ = 0;
  bool in_record_ = false;
  bool header_ok_ = false;
  detail::ArchiveError last_error_;    ///< why the last record was dropped
  detail::ArchiveError header_error_;  ///< why the header did not fit
};

/**
 * Reads a batch. Open() checks the header and walks every record length, so a
 * batch that opens cleanly is framed correctly and Next() cannot fail; what a
 * record's bytes mean is checked by the InputArchive handed out for it.
 *
 *   chi::BatchReader r;
 *   if (chi::Status st = r.Open(buf, len); !st.ok()) return st;
 *   chi::InputArchive rec;
 *   while (r.Next(rec)) { rec(task); if (!rec.ok()) ...; }
 */
class BatchReader {
 public:
  /** A reader with no batch; call Open() before Next(). */
  CHI_CROSS_FUN BatchReader() {}

  /**
   * Checks the header and framing of the batch at buf[0, len). The batch may be
   * followed by unrelated bytes (Size() says where it ends). Errors: kTruncated
   * (len too short for the header or payload), kMalformed (bad magic, flags,
   * record framing), kVersionMismatch.
   */
  CHI_CROSS_FUN Status Open(const char *buf, u64 len) {
    *this = BatchReader();
    buf_ = buf;
    InputArchive hdr(buf, len);
    u32 magic = 0, version = 0, flags = 0;
    u64 payload = 0;
    hdr(magic, version, count_, flags, payload);
    if (!hdr.ok()) {
      err_.SetSize(ErrorCode::kTruncated, "batch header", 0, kBatchHeaderBytes, len);
    } else if (magic != kBatchMagic) {
      err_.SetReason(ErrorCode::kMalformed, "batch header", "bad magic (not a chi batch)", 0);
    } else if (version != kBatchVersion) {
      err_.SetReason(ErrorCode::kVersionMismatch, "batch header",
                     "unsupported batch version (this build reads version 1)", 4);
    } else if (flags != 0) {
      err_.SetReason(ErrorCode::kMalformed, "batch header", "reserved flags are not zero", 12);
    } else if (payload > len - kBatchHeaderBytes) {
      err_.SetSize(ErrorCode::kTruncated, "batch payload", kBatchHeaderBytes, payload,
                   len - kBatchHeaderBytes);
    } else {
      end_ = kBatchHeaderBytes + payload;
      CheckFraming();
    }
    if (!err_.ok()) count_ = 0;
    pos_ = kBatchHeaderBytes;
    return status();
  }

  /**
   * Hands out the next record as an archive bounded by that record's length;
   * false after the last record or when Open() failed.
   */
  CHI_CROSS_FUN bool Next(InputArchive &rec) {
    if (!err_.ok() || index_ >= count_ || end_ - pos_ < kBatchRecordPrefixBytes) return false;
    u64 len = 0;
    std::memcpy(&len, buf_ + pos_, sizeof(len));
    const u64 body = pos_ + kBatchRecordPrefixBytes;
    if (len > end_ - body) return false;  // excluded by CheckFraming; kept as a guard
    rec = InputArchive(buf_ + body, len, body);
    pos_ = body + len;
    ++index_;
    return true;
  }

  /** Records the header declares (0 when Open failed). */
  CHI_CROSS_FUN u32 Count() const { return count_; }
  /** Records handed out by Next so far. */
  CHI_CROSS_FUN u32 Index() const { return index_; }
  /** Bytes the batch occupies (header and payload). */
  CHI_CROSS_FUN u64 Size() const { return end_; }
  /** True when the last Open() succeeded. */
  CHI_CROSS_FUN bool ok() const { return err_.ok(); }
  /** Why Open failed (offsets are counted from the batch start). */
  CHI_CROSS_FUN Status status() const { return err_.ToStatus(false); }

 private:
  /** Walks the record lengths: each must lie inside the payload, which they must fill. */
  CHI_CROSS_FUN void CheckFraming() {
    u64 pos = kBatchHeaderBytes;
    for (u32 i = 0; i < count_; ++i) {
      if (end_ - pos < kBatchRecordPrefixBytes) {
        err_.SetSize(ErrorCode::kTruncated, "record length", pos, kBatchRecordPrefixBytes,
                     end_ - pos);
        return;
      }
      u64 len = 0;
      std::memcpy(&len, buf_ + pos, sizeof(len));
      pos += kBatchRecordPrefixBytes;
      if (len > end_ - pos) {
        err_.SetSize(ErrorCode::kTruncated, "record", pos, len, end_ - pos);
        return;
      }
      pos += len;
    }
    if (pos != end_) {
      err_.SetReason(ErrorCode::kMalformed, "batch payload",
                     "bytes follow the last record the count declares", pos);
    }
  }

  const char *buf_ = nullptr;
  u64 end_ = 0;
  u64 pos_ = 0;
  u32 count_ = 0;
  u32 index_ = 0;
  detail::ArchiveError err_;
};

}  // namespace chi
