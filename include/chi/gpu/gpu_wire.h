// The bytes in a GPU slot: the envelope every transport uses (transport.h), written and
// read by typed code that runs on the device and the host alike.
//   request: [u64 request id][routing header + inputs]   (Task::SerializeBaseIn, SerializeIn)
//   answer:  [u64 request id][answer header + outputs]   (or the answer header alone on error)
// Invariant: nothing is ever written past `cap`; a task that does not fit is an error, not
// a truncated message. The request id is the slot's sequence, so a stale answer is caught.
// The templates are host-device for any task type; CHI_SERIALIZE_HD_TEMPLATE lets nvcc
// instantiate them for host-only tasks too (only GPU task types ever run them on the device).
#pragma once

#include "chi/core/macros.h"        // CHI_CROSS_FUN
#include "chi/core/status.h"        // ErrorCode
#include "chi/core/types.h"         // u32, u64
#include "chi/serialize/archive.h"  // OutputArchive, InputArchive
#include "chi/task/task.h"          // Task
#include "chi/task/task_flags.h"    // task_state::kComplete

namespace chi::gpu {

/** Bytes of the request-id prefix (as kEnvelopeHeaderBytes in transport.h). */
inline constexpr u32 kGpuEnvelopeBytes = 8;

/** Writes the envelope id at a 16-byte aligned buffer. */
CHI_CROSS_FUN inline void PutRequestId(char *buf, u64 id) { *reinterpret_cast<u64 *>(buf) = id; }
/** Reads the envelope id. */
CHI_CROSS_FUN inline u64 GetRequestId(const char *buf) {
  return *reinterpret_cast<const u64 *>(buf);
}

/**
 * Encodes t's request into buf (N bytes, 16-byte aligned). Returns its length, or 0 with
 * *error set when it is longer than `cap` (the slot's payload, at most N: kTooLarge) or
 * cannot be encoded. The archive is bounded by N, a constant, so for a task of fixed-size
 * fields every bounds check folds away and each field is stored at a constant offset. (Bounded
 * by the runtime `cap`, the cursor stayed a runtime value and each field became a chain of
 * byte stores: a third of a kernel's whole submit.)
 */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT, u32 N>
CHI_CROSS_FUN u32 EncodeRequest(TaskT &t, u64 id, char (&buf)[N], u32 cap, ErrorCode *error) {
  static_assert(N >= kGpuEnvelopeBytes, "a GPU message starts with its 8-byte id");
  PutRequestId(buf, id);
  OutputArchive ar(buf + kGpuEnvelopeBytes, N - kGpuEnvelopeBytes);
  t.SerializeBaseIn(ar);
  t.SerializeIn(ar);
  const u64 len = kGpuEnvelopeBytes + ar.Size();
  if (!ar.ok() || len > cap) {
    *error = ar.ok() ? ErrorCode::kTooLarge : ar.code();
    return 0;
  }
  return static_cast<u32>(len);
}

/**
 * Encodes an answer that carries only an error; returns its length. Out of line: it is never
 * on the path of a served task, and inlined its message copy was hoisted into that path.
 */
CHI_CROSS_FUN CHI_NOINLINE inline u32 EncodeErrorAnswer(u64 id, ErrorCode code, const char *msg,
                                                        char *buf, u32 cap) {
  Task err;
  err.SetError(code, msg);
  PutRequestId(buf, id);
  OutputArchive ar(buf + kGpuEnvelopeBytes, cap - kGpuEnvelopeBytes);
  err.SerializeBaseOut(ar);
  return kGpuEnvelopeBytes + static_cast<u32>(ar.Size());
}

/**
 * Encodes t's answer into buf (N bytes; the archive is bounded by that constant, as in
 * EncodeRequest). An answer longer than `cap` (at most N) becomes a kTooLarge error answer.
 */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT, u32 N>
CHI_CROSS_FUN u32 EncodeAnswer(TaskT &t, u64 id, char (&buf)[N], u32 cap) {
  static_assert(N >= kGpuEnvelopeBytes, "a GPU message starts with its 8-byte id");
  PutRequestId(buf, id);
  OutputArchive ar(buf + kGpuEnvelopeBytes, N - kGpuEnvelopeBytes);
  t.SerializeBaseOut(ar);
  t.SerializeOut(ar);
  const u64 len = kGpuEnvelopeBytes + ar.Size();
  if (!ar.ok() || len > cap) {
    return EncodeErrorAnswer(id, ErrorCode::kTooLarge,
                             "the task's outputs exceed the GPU copy space", buf, cap);
  }
  return static_cast<u32>(len);
}

/**
 * Reads an answer into t: its outputs, or only the error when the server refused the
 * request. A wrong id or malformed bytes set kMalformed on t.
 */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT>
CHI_CROSS_FUN void DecodeAnswer(TaskT &t, const char *buf, u32 len, u64 expect_id) {
  if (len < kGpuEnvelopeBytes || GetRequestId(buf) != expect_id) {
    t.SetError(ErrorCode::kMalformed, "GPU answer is short or names another request");
    return;
  }
  // One pass, straight into t: the answer header is t's rc_ and msg_ (SerializeBaseOut), so
  // decoding it into a scratch Task first only cost a zero-filled Task and a second pass.
  InputArchive in(buf + kGpuEnvelopeBytes, len - kGpuEnvelopeBytes);
  t.SerializeBaseOut(in);
  if (!in.ok()) {
    t.SetError(ErrorCode::kMalformed, "GPU answer header is malformed");
    return;
  }
  // An error-only answer: rc_ and msg_ are set. Remaining() first: rc_ was just written to
  // t's memory, and reading it back on a GPU is an L2 round trip.
  if (in.Remaining() == 0 && t.rc_ != 0) return;
  t.SerializeOut(in);
  if (!in.ok()) t.SetError(ErrorCode::kMalformed, "GPU answer outputs are malformed");
}

/** Marks a task held by a GPU-side client complete (only its owning thread reads it). */
CHI_CROSS_FUN inline void MarkComplete(Task &t) {
  // relaxed: the owning thread wrote the outputs and is the only reader (futures are per
  // thread), so program order suffices; a release would cost a fence per task.
  t.state_.Store(task_state::kComplete, MemOrder::kRelaxed);
}

}  // namespace chi::gpu
