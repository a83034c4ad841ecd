// Error codes and a Status value: how every fallible call says what went wrong.
// A Status carries a code and a short message in a fixed buffer, so it can be
// built without allocating (also inside a task in shared memory).
#pragma once

#include <cstdarg>  // va_list
#include <cstdio>   // vsnprintf
#include <cstring>  // strncpy
#include <stdexcept>  // std::runtime_error for the throwing convenience APIs
#include <string>     // std::string in Error

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32

namespace chi {

/** Why something failed. 0 is success; values are stable (they travel in tasks). */
enum class ErrorCode : u32 {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kUnknownPool = 4,
  kUnknownMethod = 5,
  kUnknownModule = 6,
  kMalformed = 7,
  kTruncated = 8,
  kTooLarge = 9,
  kOutOfMemory = 10,
  kTimeout = 11,
  kPeerDead = 12,
  kVersionMismatch = 13,
  kSizeMismatch = 14,
  kIo = 15,
  kCancelled = 16,
  kShutdown = 17,
  kUnsupported = 18,
  kBadConfig = 19,
  kInternal = 20,
  kPermissionDenied = 21,  ///< the caller may not do this (another user, or unverified)
  kTooDeep = 22,           ///< subtasks nested past the runtime's bound
};

/** Short stable name of a code, for messages and logs. */
CHI_CROSS_FUN inline const char *ErrorName(ErrorCode c) {
  switch (c) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kUnknownPool: return "unknown pool";
    case ErrorCode::kUnknownMethod: return "unknown method";
    case ErrorCode::kUnknownModule: return "unknown module";
    case ErrorCode::kMalformed: return "malformed input";
    case ErrorCode::kTruncated: return "truncated input";
    case ErrorCode::kTooLarge: return "too large";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerDead: return "peer dead";
    case ErrorCode::kVersionMismatch: return "version mismatch";
    case ErrorCode::kSizeMismatch: return "size mismatch";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kShutdown: return "shutting down";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kBadConfig: return "bad configuration";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kPermissionDenied: return "permission denied";
    case ErrorCode::kTooDeep: return "too deep";
  }
  return "unknown error";
}

/** A code plus a human-readable message naming the problem. */
class Status {
 public:
  static constexpr u32 kMaxMessage = 160;

  /** Success. */
  CHI_CROSS_FUN Status() : code_(ErrorCode::kOk) { msg_[0] = '\0'; }

  /** Success, spelled out at call sites. */
  CHI_CROSS_FUN static Status Ok() { return Status(); }

  /** A failure with a fixed message (usable on the device). */
  CHI_CROSS_FUN static Status Error(ErrorCode code, const char *msg) {
    Status s;
    s.code_ = code;
    u32 i = 0;
    for (; msg != nullptr && msg[i] != '\0' && i + 1 < kMaxMessage; ++i) s.msg_[i] = msg[i];
    s.msg_[i] = '\0';
    return s;
  }

  /** A failure with a printf-style message (host only). */
  __attribute__((format(printf, 2, 3))) static Status Errorf(ErrorCode code, const char *fmt,
                                                             ...) {
    Status s;
    s.code_ = code;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(s.msg_, kMaxMessage, fmt, ap);
    va_end(ap);
    return s;
  }

  CHI_CROSS_FUN bool ok() const { return code_ == ErrorCode::kOk; }
  CHI_CROSS_FUN explicit operator bool() const { return ok(); }
  CHI_CROSS_FUN ErrorCode code() const { return code_; }
  CHI_CROSS_FUN const char *message() const { return msg_; }

  /** "unknown pool: 200.0 is not registered" style text (host only). */
  std::string ToString() const {
    if (ok()) return "ok";
    return std::string(ErrorName(code_)) + ": " + msg_;
  }

 private:
  ErrorCode code_;
  char msg_[kMaxMessage];
};

/** Exception thrown by the convenience APIs that return values (FromString, ...). */
class Error : public std::runtime_error {
 public:
  /** Wraps a failed Status. */
  explicit Error(const Status &s) : std::runtime_error(s.ToString()), code_(s.code()) {}
  /** The code that describes the failure. */
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace chi
