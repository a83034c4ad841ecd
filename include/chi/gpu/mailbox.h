// GpuQueue: the slots every GPU route travels through (cpu2gpu, gpu2gpu, gpu2cpu), after
// seed 001's mailboxes. A client claims a slot, writes its request into the slot's payload
// and posts; the one server thread that owns the slot answers into the same payload.
// Invariant: every word has one writer at a time (request: the claiming client; answer and
// served: the owning server), so no side ever needs a lock or a read-modify-write across
// PCIe; only clients of one memory race, on the claim words, with an atomic OR (GPU
// clients) or a CAS (host clients, host_slots.h).
//
// Protocol for slot s (seq is a 30-bit per-slot counter, written by the client side only):
//   client: OR the held bit into claim[s] (a GPU client's claim word also returns the slot's
//           last seq); write payload; request[s] = seq | len << 32 (release)
//   server: sees request[s].seq != served[s]; reads payload; runs; publishes the answer
//           (PutAnswer, below); answer[s] = seq | len << 32; served[s] = seq
//   client: polls the slot's answer words (TakeAnswer) until they carry seq; releases
//           claim[s] = seq, free.
// Answers travel inline when small (after NCCL's LL protocol): each 8-byte answer word holds
// 4 bytes of the answer and the sequence as a flag, so one batch of loads both detects the
// answer and reads it, and the server needs no release fence (a word is stored whole). A
// success's header (rc 0, no message: 8 zero bytes) is left out and flagged instead, so the
// usual small answer is one data word. A larger answer goes into the payload, and the first
// answer word, stored with release after it, says so.
// A client that stops waiting (timeout, abort, a dead kernel reclaimed by the host) leaves
// the claim as kVerify: the next claimer checks answer.seq == the record's seq (the server
// has finished with the payload) before using the slot, and otherwise moves on. So an
// abandoned request never corrupts the next one, and the slot heals by itself.
#pragma once

#include <cstddef>  // offsetof

#include "chi/core/atomic.h"      // Atomic, MemScope, MemOrder
#include "chi/core/macros.h"      // CHI_CROSS_FUN
#include "chi/core/types.h"       // u32, u64
#include "chi/gpu/device_util.h"  // FenceAcquire

namespace chi::gpu {

/** Bytes of each slot's payload: the request and, later, the answer (the "copy space"). */
inline constexpr u32 kGpuPayloadBytes = 1024;
/** Bytes a GPU client may use for its task object in a slot's record. */
inline constexpr u32 kGpuTaskBytes = 512;
/** Answer words per slot: a header word (answer length) and kInlineAnswerWords - 1 data words. */
inline constexpr u32 kInlineAnswerWords = 8;
/** The longest answer body (the bytes after the 8-byte envelope id) carried inline. */
inline constexpr u32 kInlineAnswerBytes = 4 * (kInlineAnswerWords - 1);
/** Answer words a poll loads in one batch (one 32-byte sector): a small answer whole. */
inline constexpr u32 kAnswerPollWords = 4;
/** In the header word's data: the answer is in the payload (the rest is its length). */
inline constexpr u32 kAnswerInPayload = 1u << 31;
/** In the header word's data: the body began with kOkHeaderBytes zero bytes, left out. */
inline constexpr u32 kAnswerOk = 1u << 30;
/** Bytes of a success's answer header: rc_ = 0, then msg_'s length 0 (two u32s). */
inline constexpr u32 kOkHeaderBytes = 8;
/** In a request word's length: the request is in the payload as flagged words (PostInline). */
inline constexpr u32 kRequestInline = 1u << 31;
/** Returned by TryClaim when every slot is taken. */
inline constexpr u32 kNoSlot = ~0u;

/** Sequences are 30 bits: a GPU client's claim word carries its slot's last one beside 2 state bits. */
inline constexpr u32 kSeqMask = (1u << 30) - 1;

/** The sequence after `last` on a slot: never 0, which fresh (zeroed) words carry. */
CHI_CROSS_FUN inline u32 NextSeq(u32 last) {
  const u32 next = (last + 1) & kSeqMask;
  return next == 0 ? 1 : next;
}

/**
 * Stores `words` flagged words: each carries 4 bytes of `in` and `seq` as its flag, so a
 * reader can tell a whole word of this message from an old one without any fence.
 */
template <MemScope S>
CHI_CROSS_FUN void StoreFlagged(Atomic<u64, S> *w, const u32 *in, u32 words, u32 seq) {
  const u64 flag = static_cast<u64>(seq) << 32;
  // relaxed: every word is stored whole and checked on its own by the reader.
  for (u32 k = 0; k < words; ++k) w[k].Store(flag | in[k], MemOrder::kRelaxed);
}

/** Reads `words` flagged words into out; false while any still carries another flag. */
template <MemScope S>
CHI_CROSS_FUN bool LoadFlagged(const Atomic<u64, S> *w, u32 *out, u32 words, u32 seq) {
  for (u32 k = 0; k < words; ++k) {
    const u64 v = w[k].Load(MemOrder::kRelaxed);  // relaxed: each word carries its flag
    if (static_cast<u32>(v >> 32) != seq) return false;
    out[k] = static_cast<u32>(v);
  }
  return true;
}

/**
 * A GPU-client slot's claim word: two state bits, and above them the sequence of the slot's
 * last request (stored by the releasing client), so one RMW both claims a slot and tells
 * the claimer which sequence comes next, with no read of the record.
 */
namespace claim {
inline constexpr u32 kFree = 0;    ///< free; the mailbox is idle
inline constexpr u32 kHeld = 1;    ///< bit: a client owns the slot
inline constexpr u32 kVerify = 2;  ///< bit: check the mailbox is idle first (a byte memset of 2s sets it)
inline constexpr u32 kStateBits = 2;

/** The word a client releasing its slot stores: the slot's last sequence and its state. */
CHI_CROSS_FUN inline u32 Word(u32 last_seq, u32 state) { return last_seq << kStateBits | state; }
}  // namespace claim

/** How far a GPU client's request in a slot has come. */
enum class RecordStage : u32 {
  kLocal = 0,     ///< completed without being posted (an error found before sending)
  kPosted = 1,    ///< posted; the answer has not been read
  kAnswered = 2,  ///< the answer was read into the task
};

/**
 * A GPU client's private state for one slot (device memory, one per slot): the sequence it
 * last posted and the task object it waits on. Future<T> holds &task_ only; the record is
 * found from it by offset, so device futures stay one pointer, like host ones.
 */
struct alignas(64) ClientRecord {
  u32 seq_;            ///< last request sequence posted from this slot
  u32 slot_;           ///< this record's slot
  RecordStage stage_;  ///< of the task in task_
  MemScope scope_;     ///< scope of the queue's mailbox words (which GpuQueue<S> it is)
  const void *queue_;  ///< its GpuQueue<S> descriptor (a kernel's: the block's shared copy)
  u64 reserved_[5];
  alignas(16) char task_[kGpuTaskBytes];
};
static_assert(offsetof(ClientRecord, task_) == 64, "the task starts one line into its record");

/**
 * One queue's arrays. Scope S is that of the request/answer words: kSystem when one side is
 * the CPU (pinned memory), kDevice for gpu2gpu. The descriptor is plain data with pointers
 * valid in this process (pinned memory has the same address on both sides).
 */
template <MemScope S>
struct GpuQueue {
  u32 num_slots_ = 0;
  u32 payload_bytes_ = 0;              ///< per slot, a multiple of 16, <= kGpuPayloadBytes
  u64 max_wait_ns_ = 0;                ///< a GPU client gives up waiting after this long
  Atomic<u64, S> *request_ = nullptr;  ///< client -> server: seq | len << 32
  Atomic<u64, S> *answer_ = nullptr;   ///< server -> client: seq | len << 32 (the slot is done)
  Atomic<u64, S> *answer_words_ = nullptr;  ///< kInlineAnswerWords per slot: data | seq << 32
  char *payload_ = nullptr;            ///< num_slots_ * payload_bytes_
  Atomic<u32, MemScope::kDevice> *claims_ = nullptr;  ///< client side; see claim::
  ClientRecord *records_ = nullptr;                   ///< GPU-client queues only (else null)
  u32 *served_ = nullptr;  ///< server side: last sequence answered, per slot
  /**
   * Host-client queues only (else null): bumped after every post, so the GPU polls this
   * one pinned word instead of every slot's request word (hundreds of PCIe reads a round).
   */
  Atomic<u64, S> *doorbell_ = nullptr;
  const Atomic<u32, MemScope::kDevice> *abort_ = nullptr;  ///< the host's "give up" flag

  /** The payload of slot s (16-byte aligned). */
  CHI_CROSS_FUN char *Payload(u32 s) const {
    return payload_ + static_cast<u64>(s) * payload_bytes_;
  }

  /**
   * Whether the client polls its answer words as one 16-byte pair (header + one data word):
   * gpu2cpu, GPU clients of pinned memory (records_ set), whose strong loads over PCIe go
   * one round trip each (benchmarks/gpu/NOTES.md). Others poll a 32-byte batch.
   */
  CHI_CROSS_FUN bool PairPoll() const { return S == MemScope::kSystem && records_ != nullptr; }

  /** The longest answer body (after a success's left-out header) the server puts inline. */
  CHI_CROSS_FUN u32 InlineAnswerCap() const { return PairPoll() ? 4 : kInlineAnswerBytes; }

  /**
   * Whether small requests are posted inline: for gpu2cpu, whose writer is a GPU thread
   * (posted stores need no system-scope fence that way) and whose reader is the host.
   */
  CHI_CROSS_FUN bool InlineRequests() const {
    return S == MemScope::kSystem && records_ != nullptr;
  }

  // ---- Client side ----

  /**
   * Looks at up to `window` slots from `start` (all by default): claims a free slot whose
   * mailbox is idle, or returns kNoSlot; *last_seq (if given) is the sequence of the slot's
   * last request (NextSeq of it is the next). Clients of one launch start at distinct
   * slots, so usually the first RMW wins.
   */
  CHI_CROSS_FUN u32 TryClaim(u32 start, u32 window = ~0u, u32 *last_seq = nullptr) const {
    const u32 n = window < num_slots_ ? window : num_slots_;
    for (u32 i = 0; i < n; ++i) {
      const u32 s = (start + i) % num_slots_;
      // One OR claims a free slot and reads its last sequence; on a held slot it changes
      // nothing. No load first: that would add an L2 round trip to every claim.
      // acquire: the previous owner's writes (its record) are visible once the slot is ours.
      const u32 c = claims_[s].FetchOr(claim::kHeld, MemOrder::kAcquire);
      if ((c & claim::kHeld) != 0) continue;
      if ((c & claim::kVerify) == 0) {
        if (last_seq != nullptr) *last_seq = c >> claim::kStateBits;
        return s;
      }
      if (IsIdle(s)) {  // the record holds the last sequence (a reclaim overwrote the word)
        if (last_seq != nullptr) *last_seq = records_ != nullptr ? records_[s].seq_ : 0;
        return s;
      }
      // release: hand the slot back unchanged; its last request is still being answered.
      claims_[s].Store(c, MemOrder::kRelease);
    }
    return kNoSlot;
  }

  /** Publishes the request in slot s (its payload is written), and rings the doorbell. */
  CHI_CROSS_FUN void Post(u32 s, u32 seq, u32 len) const {
    // release: the payload is visible to the server before the request word.
    request_[s].Store(static_cast<u64>(seq) | static_cast<u64>(len) << 32, MemOrder::kRelease);
    // release: a server that sees the new count then sees the request word (after its fence).
    if (doorbell_ != nullptr) doorbell_->FetchAdd(1, MemOrder::kRelease);
  }

  /** The longest request PostInline takes: 4 bytes of it per 8-byte word of the payload. */
  CHI_CROSS_FUN u32 InlineRequestCap() const {
    return InlineRequests() ? payload_bytes_ / 2 : 0;
  }

  /**
   * Posts a request of `len` (<= InlineRequestCap()) bytes at buf (16-byte aligned, holding a
   * multiple of 16 bytes past len) as flagged words in slot s's payload, then the request
   * word, relaxed on a GPU (kFlaggedPublish): each word is stored whole and carries seq, so
   * the reader needs no fence from us (one at system scope costs a GPU ~0.7 us) and checks
   * every word instead.
   */
  CHI_CROSS_FUN void PostInline(u32 s, u32 seq, const char *buf, u32 len) const {
    StoreFlagged(reinterpret_cast<Atomic<u64, S> *>(Payload(s)),
                 reinterpret_cast<const u32 *>(buf), (len + 3) / 4, seq);
    request_[s].Store(static_cast<u64>(seq) | static_cast<u64>(len | kRequestInline) << 32,
                      kFlaggedPublish);
  }

  /** True once the answer to request `seq` is in slot s; *len is its length. */
  CHI_CROSS_FUN bool Answered(u32 s, u32 seq, u32 *len) const {
    // acquire: the answer's bytes are read right after a hit. An acquire load costs a poll
    // no more than a relaxed one, and a hit then needs no fence (~0.5 us at system scope).
    const u64 w = answer_[s].Load(MemOrder::kAcquire);
    if (static_cast<u32>(w) != seq) return false;
    *len = static_cast<u32>(w >> 32);
    return true;
  }

  /**
   * Takes the answer to request `seq` from slot s once it is complete: writes its envelope
   * (the 8-byte id, which is seq, then the body) into buf, which holds kGpuPayloadBytes, and
   * its length into *len. False while it is not (wholly) there. One batch of loads for a
   * small answer: the poll is the read.
   */
  CHI_CROSS_FUN bool TakeAnswer(u32 s, u32 seq, char *buf, u32 *len) const {
    const Atomic<u64, S> *w = answer_words_ + static_cast<u64>(s) * kInlineAnswerWords;
    u64 v[kAnswerPollWords];
    const u32 polled = PairPoll() ? 2 : kAnswerPollWords;  // words this poll loaded
    if (PairPoll()) {
      LoadPair(w, &v[0], &v[1]);
    } else {
      // kFencedPoll: each word carries its own flag; a payload answer fences below.
      CHI_UNROLL
      for (u32 k = 0; k < kAnswerPollWords; ++k) v[k] = w[k].Load(kFencedPoll);
    }
    if (static_cast<u32>(v[0] >> 32) != seq) return false;
    const u32 head = static_cast<u32>(v[0]);
    *reinterpret_cast<u64 *>(buf) = seq;  // the envelope id of a request is its sequence
    if ((head & kAnswerInPayload) != 0) {
      FenceAcquire<S>();  // the relaxed poll saw the release store
      u32 n = head & ~kAnswerInPayload;
      n = n < payload_bytes_ ? n : payload_bytes_;
      CopyChunks(buf, Payload(s), n);
      *len = n;
      return true;
    }
    u32 *out = reinterpret_cast<u32 *>(buf + 8);
    const u32 ok = (head & kAnswerOk) != 0 ? kOkHeaderBytes / 4 : 0;  // words left out
    out[0] = 0;  // the left-out header, if any (else overwritten below)
    out[1] = 0;
    out += ok;
    const u32 raw = head & ~kAnswerOk;
    const u32 body = raw < kInlineAnswerBytes ? raw : kInlineAnswerBytes;
    const u32 words = (body + 3) / 4;  // data words after the header
    CHI_UNROLL
    for (u32 k = 1; k < kAnswerPollWords; ++k) {
      if (k > words || k >= polled) break;
      if (static_cast<u32>(v[k] >> 32) != seq) return false;  // still arriving
      out[k - 1] = static_cast<u32>(v[k]);
    }
    // A longer answer's remaining words, one at a time (rare: kept out of registers).
    if (words >= polled &&
        !LoadFlagged(w + polled, out + polled - 1, words - (polled - 1), seq)) {
      return false;
    }
    *len = 8 + 4 * ok + body;
    return true;
  }

  /**
   * Gives slot s up; `last_seq` is the sequence of its last request (the record's seq_),
   * `maybe_pending` when that request may still be unanswered.
   */
  CHI_CROSS_FUN void Release(u32 s, u32 last_seq, bool maybe_pending) const {
    // release: our reads of the answer and record writes happen before the next owner's.
    claims_[s].Store(claim::Word(last_seq, maybe_pending ? claim::kVerify : claim::kFree),
                     MemOrder::kRelease);
  }

  // ---- Server side ----

  /**
   * The request `word` (seq | len << 32, just polled) of slot s: its bytes, or nullptr while
   * a request posted inline has not wholly arrived (poll again later). An inline request is
   * unpacked into buf (kGpuPayloadBytes); any other is read in place, after an acquire fence.
   * *len is its length, the inline bit cleared.
   */
  CHI_CROSS_FUN const char *TakeRequest(u32 s, u64 word, char *buf, u32 *len) const {
    const u32 seq = static_cast<u32>(word);
    const u32 n = static_cast<u32>(word >> 32);
    if ((n & kRequestInline) == 0) {
      FenceAcquire<S>();  // the payload was written before the request word (release)
      *len = n;
      return Payload(s);
    }
    *len = n & ~kRequestInline;
    if (*len > InlineRequestCap()) {
      *len = 0;  // malformed: the caller answers it as a length out of range
      return buf;
    }
    const auto *w = reinterpret_cast<const Atomic<u64, S> *>(Payload(s));
    u32 *out = reinterpret_cast<u32 *>(buf);
    return LoadFlagged(w, out, (*len + 3) / 4, seq) ? buf : nullptr;  // nullptr: arriving
  }

  /** The doorbell count (kFencedPoll; FenceAcquire before reading request words it covers). */
  CHI_CROSS_FUN u64 Doorbell() const { return doorbell_->Load(kFencedPoll); }

  /** The request word of slot s (kFencedPoll: pollers batch these; FenceAcquire before use). */
  CHI_CROSS_FUN u64 PeekRequest(u32 s) const { return request_[s].Load(kFencedPoll); }
  /**
   * The request word of slot s with acquire order: a new one's payload may be read right
   * after, with no fence (an acquire load holds back only the accesses after it).
   */
  CHI_CROSS_FUN u64 PeekRequestAcquire(u32 s) const {
    return request_[s].Load(MemOrder::kAcquire);
  }

  /**
   * Publishes the answer to request `seq`: `len` bytes at buf (16-byte aligned, holding a
   * multiple of 16 bytes past len), its 8-byte envelope id first. A small answer is stored
   * inline, word by word with no fence; a larger one into the payload, then the header word
   * with release. Then the slot's answer word (Answer).
   */
  CHI_CROSS_FUN void PutAnswer(u32 s, u32 seq, const char *buf, u32 len) const {
    Atomic<u64, S> *w = answer_words_ + static_cast<u64>(s) * kInlineAnswerWords;
    const u64 flag = static_cast<u64>(seq) << 32;
    u32 body = len > 8 ? len - 8 : 0;
    const char *data = buf + 8;
    u32 ok = 0;
    if (body >= kOkHeaderBytes && *reinterpret_cast<const u64 *>(data) == 0) {
      ok = kAnswerOk;  // a success's header: the client puts it back
      data += kOkHeaderBytes;
      body -= kOkHeaderBytes;
    }
    if (body <= InlineAnswerCap()) {
      StoreFlagged(w + 1, reinterpret_cast<const u32 *>(data), (body + 3) / 4, seq);
      w[0].Store(flag | ok | body, kFlaggedPublish);  // a flagged word like the rest
      Answer(s, seq, len, kFlaggedPublish);
      return;
    }
    CopyChunks(Payload(s), buf, len);
    // release: the payload is visible to the client before the header word.
    w[0].Store(flag | kAnswerInPayload | len, MemOrder::kRelease);
    Answer(s, seq, len, MemOrder::kRelaxed);
  }

  /**
   * Marks slot s's request `seq` done (a verifying claimer, the reaper and probes read it);
   * PutAnswer calls it. Alone, it publishes only a length: the answer's bytes, if any, must
   * be in the payload and `order` release.
   */
  CHI_CROSS_FUN void Answer(u32 s, u32 seq, u32 len, MemOrder order = MemOrder::kRelease) const {
    answer_[s].Store(static_cast<u64>(seq) | static_cast<u64>(len) << 32, order);
  }

  // ---- Layout ----

  /** Bytes of the arrays both sides touch: request, answer, payloads, doorbell, answer words. */
  CHI_CROSS_FUN static u64 SharedBytes(u32 slots, u32 payload_bytes) {
    return 2 * Lines(8ull * slots) + static_cast<u64>(slots) * payload_bytes + 64 +
           AnswerWordBytes(slots);
  }
  /** Bytes of the client side: claims, and records when the clients are GPU threads. */
  CHI_CROSS_FUN static u64 ClientBytes(u32 slots, bool gpu_clients) {
    return Lines(4ull * slots) + (gpu_clients ? sizeof(ClientRecord) * slots : 0);
  }
  /** Bytes of the server side: the served sequences. */
  CHI_CROSS_FUN static u64 ServerBytes(u32 slots) { return Lines(4ull * slots); }

  /**
   * Points a descriptor at zeroed memory: `shared` (SharedBytes), `client` (ClientBytes)
   * and `server` (ServerBytes), each 64-byte aligned.
   */
  CHI_CROSS_FUN static GpuQueue Make(u32 slots, u32 payload_bytes, u64 max_wait_ns, char *shared,
                                     char *client, bool gpu_clients, char *server,
                                     const Atomic<u32, MemScope::kDevice> *abort) {
    GpuQueue q;
    q.num_slots_ = slots;
    q.payload_bytes_ = payload_bytes;
    q.max_wait_ns_ = max_wait_ns;
    q.request_ = reinterpret_cast<Atomic<u64, S> *>(shared);
    q.answer_ = reinterpret_cast<Atomic<u64, S> *>(shared + Lines(8ull * slots));
    q.payload_ = shared + 2 * Lines(8ull * slots);
    q.claims_ = reinterpret_cast<Atomic<u32, MemScope::kDevice> *>(client);
    q.records_ =
        gpu_clients ? reinterpret_cast<ClientRecord *>(client + Lines(4ull * slots)) : nullptr;
    q.served_ = reinterpret_cast<u32 *>(server);
    char *const doorbell =
        shared + 2 * Lines(8ull * slots) + static_cast<u64>(slots) * payload_bytes;
    q.doorbell_ = gpu_clients ? nullptr : reinterpret_cast<Atomic<u64, S> *>(doorbell);
    q.answer_words_ = reinterpret_cast<Atomic<u64, S> *>(doorbell + 64);
    q.abort_ = abort;
    return q;
  }

 private:
  /** True when slot s's last request has been answered (the payload is the client's). */
  CHI_CROSS_FUN bool IsIdle(u32 s) const {
    if (records_ == nullptr) return true;  // host clients release only after the answer
    // kFencedPoll; the fence orders the server's answer writes before our new request.
    if (static_cast<u32>(answer_[s].Load(kFencedPoll)) != records_[s].seq_) return false;
    FenceAcquire<S>();
    return true;
  }

  CHI_CROSS_FUN static u64 Lines(u64 bytes) { return (bytes + 63) & ~63ull; }
  CHI_CROSS_FUN static u64 AnswerWordBytes(u32 slots) {
    return 8ull * kInlineAnswerWords * slots;  // 64 bytes a slot: whole lines
  }
};

}  // namespace chi::gpu
