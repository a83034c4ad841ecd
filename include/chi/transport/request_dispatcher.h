// Runtime side of every transport: turns request bytes into a task submitted
// to the workers, and a finished task back into answer bytes. Bad bytes,
// unknown pools and unknown methods are answered with an error, never dropped.
#pragma once

#include <cstring>  // memcpy of the request id
#include <vector>   // answer buffers

#include "chi/runtime/pool_manager.h"       // pool -> container
#include "chi/runtime/runtime_limits.h"     // MaxOutputSize: the bound on answers
#include "chi/runtime/work_orchestrator.h"  // Submit
#include "chi/serialize/archive.h"          // wire format
#include "chi/transport/transport.h"        // envelope layout

namespace chi {

/** Starts an envelope in *out (the request id, nothing else) and returns an archive appending to it. */
inline OutputArchive BeginEnvelope(u64 request_id, std::vector<char> *out) {
  out->resize(kEnvelopeHeaderBytes);
  std::memcpy(out->data(), &request_id, sizeof(request_id));
  return OutputArchive(*out);
}

/**
 * Bytes of the stack buffer an envelope is first encoded into. Small tasks (nearly all)
 * then cost one bounds check and one memcpy per field instead of a vector append each.
 */
inline constexpr u64 kSmallEnvelopeBytes = 512;

/** What writes an envelope's body: a TaskOps save_in or save_out. */
using EnvelopeSaver = void (*)(Task &, OutputArchive &);

/**
 * Encodes an envelope (request id, then what `save` writes) into buf[0, cap) with a
 * fixed archive. Returns the bytes written, or 0 when it does not fit (or fails); then
 * *need, when given, is at least the bytes it takes (those up to the item that did not
 * fit, and that item's), so a caller can make that much room and try again.
 */
inline u64 EncodeEnvelopeInto(u64 request_id, Task *t, EnvelopeSaver save, char *buf, u64 cap,
                              u64 *need = nullptr) {
  if (cap < kEnvelopeHeaderBytes) {
    if (need != nullptr) *need = kEnvelopeHeaderBytes;
    return 0;
  }
  std::memcpy(buf, &request_id, sizeof(request_id));
  OutputArchive ar(buf + kEnvelopeHeaderBytes, cap - kEnvelopeHeaderBytes);
  save(*t, ar);
  if (CHI_LIKELY(ar.ok())) return kEnvelopeHeaderBytes + ar.Size();
  if (need != nullptr) {
    const detail::ArchiveError &e = ar.ErrorRecord();
    *need = e.code_ == ErrorCode::kTooLarge ? kEnvelopeHeaderBytes + e.offset_ + e.need_ : 0;
  }
  return 0;
}

/**
 * Encodes an envelope into *out: first on the stack (EncodeEnvelopeInto), and only
 * when that overflows again with a growing archive. Replaces what *out held; keeps its
 * capacity.
 */
inline void EncodeEnvelope(u64 request_id, Task *t, EnvelopeSaver save, std::vector<char> *out) {
  char small[kSmallEnvelopeBytes];
  if (const u64 n = EncodeEnvelopeInto(request_id, t, save, small, sizeof(small)); n != 0) {
    out->assign(small, small + n);
    return;
  }
  OutputArchive ar = BeginEnvelope(request_id, out);
  save(*t, ar);
}

/**
 * Bytes an encoded answer may take beyond limits.max_output_size: the envelope and answer
 * headers, the error message and the outputs' length and scalar fields. An output of
 * exactly the bound then still reaches its caller.
 */
inline constexpr u64 kAnswerFramingBytes = 1024;

/** The largest answer envelope the runtime sends a caller in another process. */
inline u64 MaxAnswerBytes() { return MaxOutputSize() + kAnswerFramingBytes; }

/** Writes an answer's header alone (an error answer: code and message, no outputs). */
inline void SaveAnswerHeader(Task &t, OutputArchive &ar) { t.SerializeBaseOut(ar); }

/** Makes *err the kTooLarge error that replaces an answer of at least `bytes` bytes. */
inline void SetAnswerTooLarge(u64 bytes, Task *err) {
  err->SetErrorf(ErrorCode::kTooLarge,
                 "answer of at least %llu bytes exceeds limits.max_output_size = %llu",
                 static_cast<unsigned long long>(bytes),
                 static_cast<unsigned long long>(MaxOutputSize()));
}

/**
 * Encodes a finished task's answer envelope into *out; the task stays alive. An answer
 * past MaxAnswerBytes is replaced by a kTooLarge error answer naming the bound: refused
 * without a copy when the item that overflows the stack buffer alone passes the bound
 * (one large buffer), else measured by encoding it.
 */
inline void EncodeAnswerKeep(Task *t, std::vector<char> *out) {
  const u64 bound = MaxAnswerBytes();
  char small[kSmallEnvelopeBytes];
  u64 need = 0;
  if (const u64 n = EncodeEnvelopeInto(t->request_id_, t, t->ops_->save_out, small,
                                       sizeof(small), &need);
      CHI_LIKELY(n != 0)) {
    out->assign(small, small + n);
    return;
  }
  if (need <= bound) {
    OutputArchive ar = BeginEnvelope(t->request_id_, out);
    t->ops_->save_out(*t, ar);
    if (CHI_LIKELY(out->size() <= bound)) return;
    need = out->size();
    std::vector<char>().swap(*out);  // the refused bytes were only measured: free them
  }
  Task err;
  SetAnswerTooLarge(need, &err);
  EncodeEnvelope(t->request_id_, &err, &SaveAnswerHeader, out);
}

/**
 * Encodes a finished task's answer envelope into buf[0, cap) as EncodeEnvelopeInto does,
 * held to MaxAnswerBytes as EncodeAnswerKeep is: an answer found to pass it is replaced
 * by its kTooLarge error answer. Returns the bytes written, or 0 with *need (when given)
 * at least the bytes it takes.
 */
inline u64 EncodeAnswerInto(Task *t, char *buf, u64 cap, u64 *need = nullptr) {
  const u64 bound = MaxAnswerBytes();
  u64 want = 0;
  const u64 n = EncodeEnvelopeInto(t->request_id_, t, t->ops_->save_out, buf,
                                   cap < bound ? cap : bound, &want);
  if (CHI_LIKELY(n != 0) || want <= bound) {
    if (need != nullptr) *need = want;
    return n;
  }
  Task err;
  SetAnswerTooLarge(want, &err);
  return EncodeEnvelopeInto(t->request_id_, &err, &SaveAnswerHeader, buf, cap, need);
}

/** Decodes requests for one runtime and encodes the answers. */
class RequestDispatcher {
 public:
  RequestDispatcher(PoolManager *pools, WorkOrchestrator *orch) : pools_(pools), orch_(orch) {}

  /**
   * Where requests for a GPU route (LocalGpuBcast, ToLocalGpu) go instead of the workers:
   * the runtime's GPU transport, read at each request (it comes and goes with the GPUs).
   * Without it, or while it is null, those requests reach the router, which refuses them.
   */
  void RouteGpuTo(const Atomic<ClientTransport *> *gpu) { gpu_ = gpu; }

  /**
   * Decodes one request and submits its task with `completer` and `cookie`
   * attached (the completer later calls EncodeAnswer). On failure returns false
   * and fills `error_answer` with an answer carrying the error for the client.
   * Called on a worker's own loop (a transport's WorkerPoller) that would keep the task
   * (WorkOrchestrator::LocalWorkerFor), it stays there (Worker::Adopt) with the pool
   * reference taken here, unless `here` is false: then it goes to a lane, as from any
   * other thread.
   */
  bool Dispatch(const char *data, u64 len, TaskCompleter *completer, u64 cookie,
                std::vector<char> *error_answer, bool here = true) {
    u64 request_id = 0;
    PoolInfo *pool = nullptr;
    Status why;
    Task *t = Decode(data, len, &request_id, &pool, &why);
    if (t == nullptr) {
      EncodeError(request_id, why.code(), why.message(), error_answer);
      return false;
    }
    t->task_flags_.UnsetBits(TASK_FIRE_AND_FORGET);  // the completer owns and frees it
    t->completer_ = completer;
    t->transport_cookie_ = cookie;
    t->request_id_ = request_id;  // echoed back in the answer
    Worker *me = here ? orch_->LocalWorkerFor(*t) : nullptr;
    if (me != nullptr && CurrentRunContext() == nullptr &&
        !(gpu_ != nullptr && t->pool_query_.IsGpuRoute()) && orch_->IsAccepting()) {
      me->Adopt(t, pool);  // the worker's next step starts it (it releases the pool)
      return true;
    }
    pools_->Release(pool);
    if (gpu_ != nullptr && t->pool_query_.IsGpuRoute()) {
      // acquire: the GPU transport is fully started before we hand it tasks.
      if (ClientTransport *g = gpu_->Load(MemOrder::kAcquire); g != nullptr && g->Send(t)) {
        return true;  // the GPU transport completes it (answer or error) through completer_
      }
    }
    if (!(here ? orch_->Submit(t) : orch_->SubmitShared(t))) {
      t->completer_ = nullptr;
      DeleteTask(t);
      EncodeError(request_id, ErrorCode::kShutdown, "runtime is shutting down", error_answer);
      return false;
    }
    return true;
  }

  /**
   * Decodes one request envelope into a new task of this runtime's pools: the routing
   * header, then the inputs of the method it names. Returns the task with *pool acquired
   * (the caller releases it once the task is queued, or with the task), or nullptr with
   * *why naming the problem: kTruncated, kMalformed, kUnsupported (a periodic task),
   * kUnknownPool or kUnknownMethod. *request_id is the envelope's id once it has one.
   * Every byte is untrusted: nothing here reads outside [data, data + len).
   */
  Task *Decode(const char *data, u64 len, u64 *request_id, PoolInfo **pool, Status *why) {
    *request_id = 0;
    if (len < kEnvelopeHeaderBytes) {
      *why = Status::Error(ErrorCode::kTruncated, "request shorter than its 8-byte header");
      return nullptr;
    }
    std::memcpy(request_id, data, sizeof(*request_id));
    InputArchive ar(data + kEnvelopeHeaderBytes, len - kEnvelopeHeaderBytes);
    // Reused per thread: a fresh Task costs a 96-byte message clear per request. A
    // decode that succeeds overwrites every routing field; rc_ and msg_ are never set.
    thread_local Task base;
    base.SerializeBaseIn(ar);
    if (!ar.ok()) {  // truncated bytes, or an invalid pool query (SerializeBaseIn)
      *why = Status::Error(ErrorCode::kMalformed, ar.status().message());
      return nullptr;
    }
    if (base.task_flags_.Any(TASK_PERIODIC)) {  // nobody could cancel it from afar
      *why = Status::Error(ErrorCode::kUnsupported,
                           "periodic tasks cannot be submitted from another process");
      return nullptr;
    }
    PoolInfo *p = pools_->Acquire(base.pool_id_);
    if (p == nullptr) {
      *why = Status::Errorf(ErrorCode::kUnknownPool, "pool %s does not exist",
                            base.pool_id_.ToString().c_str());
      return nullptr;
    }
    Container *c = p->FirstLocal();
    Task *t = c != nullptr ? c->LoadTaskIn(base.method_, base, ar) : nullptr;
    if (t == nullptr) {
      // Asked only on failure: the virtual call is not free on the hot path.
      const bool has_method = c != nullptr && c->HasMethod(base.method_);
      pools_->Release(p);
      *why = has_method ? Status::Errorf(ErrorCode::kMalformed,
                                         "inputs of method %u are malformed: %s", base.method_,
                                         ar.status().message())
                        : Status::Errorf(ErrorCode::kUnknownMethod, "pool %s has no method %u",
                                         base.pool_id_.ToString().c_str(), base.method_);
      return nullptr;
    }
    *pool = p;
    return t;
  }

  /** The orchestrator requests are submitted to (transports install worker pollers there). */
  WorkOrchestrator *Orchestrator() const { return orch_; }

  /** Encodes a finished server-side task's answer and frees the task. */
  static void EncodeAnswer(Task *t, std::vector<char> *out) {
    EncodeAnswerKeep(t, out);
    t->completer_ = nullptr;
    DeleteTask(t);
  }

  /** An answer that carries only an error (no outputs). */
  static void EncodeError(u64 request_id, ErrorCode code, const char *msg,
                          std::vector<char> *out) {
    Task err;
    err.SetError(code, msg);
    OutputArchive ar = BeginEnvelope(request_id, out);
    err.SerializeBaseOut(ar);
  }

 private:
  PoolManager *pools_;
  const Atomic<ClientTransport *> *gpu_ = nullptr;  ///< see RouteGpuTo
  WorkOrchestrator *orch_;
};

/** Client side: writes the request envelope for a stamped task. */
inline void EncodeRequest(Task *t, u64 request_id, std::vector<char> *out) {
  EncodeEnvelope(request_id, t, t->ops_->save_in, out);
}

/**
 * A failure answered with no message, or one that reads as empty (a runtime of another
 * build, or a hostile one), still says what failed: the code's name, and that the runtime
 * gave no reason.
 */
inline void ExplainBareError(Task *t) {
  if (t->rc_ == 0 || t->msg_.c_str()[0] != '\0') return;  // a leading NUL reads as empty
  const u32 rc = t->rc_;
  t->rc_ = 0;  // SetErrorf keeps the first failure: this one, with a message
  t->SetErrorf(static_cast<ErrorCode>(rc), "the runtime answered %s (code %u) with no message",
               ErrorName(static_cast<ErrorCode>(rc)), rc);
}

/**
 * Client side: reads an answer into the task (outputs, or just the error when
 * the runtime refused the request). Malformed answers set kMalformed on the task.
 */
inline void DecodeAnswer(Task *t, const char *data, u64 len) {
  if (len < kEnvelopeHeaderBytes) {
    t->SetError(ErrorCode::kMalformed, "answer shorter than its header");
    return;
  }
  u32 rc = 0;  // the answer header's first field: a success reads straight into the task
  if (len >= kEnvelopeHeaderBytes + sizeof(rc)) {
    std::memcpy(&rc, data + kEnvelopeHeaderBytes, sizeof(rc));
  }
  if (rc == 0) {
    InputArchive direct(data + kEnvelopeHeaderBytes, len - kEnvelopeHeaderBytes);
    t->ops_->load_out(*t, direct);
    if (CHI_LIKELY(direct.ok())) return;
  }
  // An error answer, or bytes that did not decode: look at the header alone first.
  InputArchive ar(data + kEnvelopeHeaderBytes, len - kEnvelopeHeaderBytes);
  Task header;
  header.SerializeBaseOut(ar);
  if (!ar.ok()) {
    t->SetError(ErrorCode::kMalformed, "answer header is malformed");
    return;
  }
  if (header.rc_ != 0 && ar.Remaining() == 0) {  // an error-only answer
    t->rc_ = header.rc_;
    t->msg_ = header.msg_;
    ExplainBareError(t);
    return;
  }
  InputArchive full(data + kEnvelopeHeaderBytes, len - kEnvelopeHeaderBytes);
  t->ops_->load_out(*t, full);
  if (!full.ok()) t->SetError(ErrorCode::kMalformed, "answer outputs are malformed");
  ExplainBareError(t);
}

}  // namespace chi
