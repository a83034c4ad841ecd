// How the shm client's receiver thread (ShmClientReceiver, shm_client_receive.h) waits
// for answers: it spins briefly, naps while callers spinning in Future::Wait take the
// answers themselves, parks on the answer stream otherwise, and checks the runtime's
// liveness while it waits. Included by shm_client_receive.h after the class; not meant to
// be included on its own.
#pragma once

#include <sched.h>  // sched_yield while the receiver spins

#include <cstdio>  // snprintf of failure messages

#include "chi/core/cpu_share.h"                // ShareCpu: a worker on our CPU
#include "chi/core/futex.h"                    // the receiver's naps
#include "chi/queue/wait_event.h"              // MonotonicNs, deadlines of its parks
#include "chi/transport/shm_client_receive.h"  // the class these functions belong to
#include "chi/transport/shm_process.h"         // IsProcessAlive: the runtime's liveness

namespace chi {

ShmClientReceiver::SpinResult ShmClientReceiver::SpinForAnswer() {
  u64 start = MonotonicNs();
  for (u32 i = 1;; ++i) {
    if (ans_.HasData()) return SpinResult::kData;
    // relaxed: AwaitAnswer re-reads it with acquire.
    if (rx_stop_.Load(MemOrder::kRelaxed) != 0) return SpinResult::kStop;
    if (CallersDeliver()) {
      LeaveToCallers();
      start = MonotonicNs();
      continue;
    }
    CpuRelax();
    if ((i & 63) != 0) continue;
    const u64 spun = MonotonicNs() - start;
    if (spun >= (Outstanding() != 0 ? kReceiverBusySpinNs : kReceiverSpinNs)) {
      return SpinResult::kPark;
    }
    // Spinning here only delays the worker.
    if (ShareCpu(slot_->runtime_cpu_)) return SpinResult::kPark;
    // A thread we are waiting for (a runtime worker, the caller) may share this CPU.
    sched_yield();
  }
}

bool ShmClientReceiver::AwaitAnswer() {
  for (;;) {
    const SpinResult spin = SpinForAnswer();
    if (spin != SpinResult::kPark) return spin == SpinResult::kData;
    // Parked on the stream, the receiver costs the runtime a futex wake per answer: it
    // goes back to napping as soon as callers take the answers again.
    while (!CallersDeliver()) {
      const u64 period = Outstanding() != 0 ? kPeerCheckNs : kIdleCheckNs;
      WaitResult r = slot_->answer_ready_.Wait(
          [&] {
            // seq_cst: re-checks against the runtime's publishes and Close's stop flag.
            return ans_.HasDataSeqCst() || rx_stop_.Load(MemOrder::kSeqCst) != 0 ||
                   slot_->state_.Load(MemOrder::kSeqCst) !=
                       static_cast<u32>(ShmSlotState::kActive) ||
                   header_->runtime_state_.Load(MemOrder::kSeqCst) ==
                       static_cast<u32>(ShmRuntimeState::kStopped);
          },
          DeadlineAfter(period), rx_waits_);
      if (rx_stop_.Load(MemOrder::kAcquire) != 0) return false;  // acquire: Close's stop
      if (ans_.HasData()) return true;
      if (ans_.Unframed()) {  // published bytes with no record: nothing will frame them
        Fail(ErrorCode::kMalformed, "shm transport: the runtime's answer stream is corrupt");
        return false;
      }
      if (!PeerHealthy(r == WaitResult::kTimedOut)) return ans_.HasData();
    }
  }
}

bool ShmClientReceiver::CallersDeliver() {
  if (!helper_installed_) return false;
  const u64 helped = helped_answers_.Load(MemOrder::kRelaxed);  // relaxed: a hint
  callers_delivered_ = helped != helped_seen_;
  helped_seen_ = helped;
  return callers_delivered_ || WaitHelper::Spinners() != 0;
}

void ShmClientReceiver::LeaveToCallers() {
  // acquire: StopReceiving and CallerGaveUp bump the word after what they report.
  const u32 seen = rx_nap_.Load(MemOrder::kAcquire);
  if (seen != nap_seen_) {  // someone gave up (or Close stops us) since the last nap
    nap_seen_ = seen;
    return;  // the caller's loop looks at the stream first
  }
  const bool waited = callers_delivered_ || Outstanding() <= WaitHelper::Spinners();
  const u64 nap = waited ? kCallerNapNs : kShortNapNs;
  // seq_cst: announce the nap, then sleep while the word still holds `seen` (Dekker
  // with CallerGaveUp's bump, then read of the flag).
  rx_napping_.Store(1, MemOrder::kSeqCst);
  if (rx_stop_.Load(MemOrder::kSeqCst) == 0) FutexWait(rx_nap_.Raw(), seen, nap);
  rx_napping_.Store(0, MemOrder::kRelaxed);  // relaxed: only spares CallerGaveUp a wake
}

bool ShmClientReceiver::RuntimeSilent() {
  if (hang_timeout_ns_ == 0) return false;
  const u64 now = MonotonicNs();
  // relaxed: a clock value the poller stores; only its change matters (not its value, so
  // processes in different time namespaces agree).
  const u64 beat = header_->heartbeat_ns_.Load(MemOrder::kRelaxed);
  if (beat != beat_seen_ || Outstanding() == 0) {
    beat_seen_ = beat;
    beat_changed_ns_ = now;
    return false;
  }
  return now - beat_changed_ns_ > hang_timeout_ns_;
}

bool ShmClientReceiver::PeerHealthy(bool check_process) {
  char msg[Status::kMaxMessage];
  ErrorCode code = ErrorCode::kOk;
  // acquire: whatever the runtime wrote before changing the state is visible after.
  const u32 state = slot_->state_.Load(MemOrder::kAcquire);
  const u32 runtime_state = header_->runtime_state_.Load(MemOrder::kAcquire);
  if (state == static_cast<u32>(ShmSlotState::kBroken)) {
    u32 why = slot_->broken_code_.Load(MemOrder::kRelaxed);  // relaxed: set before the state
    code = why != 0 ? static_cast<ErrorCode>(why) : ErrorCode::kMalformed;
    if (code == ErrorCode::kPermissionDenied) {
      std::snprintf(msg, sizeof(msg),
                    "shm transport: runtime pid %u refused this connection: the slot's owner "
                    "is not a live process of its user",
                    runtime_.pid);
    } else {
      std::snprintf(msg, sizeof(msg),
                    "shm transport: runtime pid %u reset this connection: it received a bad "
                    "request stream (%s)",
                    runtime_.pid, ErrorName(code));
    }
  } else if (slot_->owner_pid_.Load(MemOrder::kAcquire) != self_.pid ||  // acquire: reclaim
             slot_->generation_.Load(MemOrder::kAcquire) != generation_ ||
             state != static_cast<u32>(ShmSlotState::kActive)) {
    code = ErrorCode::kPeerDead;
    std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u took this connection back",
                  runtime_.pid);
  } else if (runtime_state == static_cast<u32>(ShmRuntimeState::kStopped)) {
    code = ErrorCode::kShutdown;
    std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u stopped", runtime_.pid);
  } else if (check_process && !IsProcessAlive(runtime_)) {
    code = ErrorCode::kPeerDead;
    std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u died", runtime_.pid);
  } else if (check_process && runtime_state == static_cast<u32>(ShmRuntimeState::kServing) &&
             RuntimeSilent()) {
    code = ErrorCode::kPeerDead;  // as a ZeroMQ client finds it (its heartbeats stop)
    std::snprintf(msg, sizeof(msg),
                  "shm transport: runtime pid %u is alive but showed no sign of life for %.1f s "
                  "with tasks outstanding (stopped or hung; networking.hang_timeout_s)",
                  runtime_.pid, static_cast<double>(hang_timeout_ns_) / 1e9);
  }
  if (code == ErrorCode::kOk) return true;
  if (ans_.HasData()) return false;  // deliver what arrived before the end first
  Fail(code, msg);
  return false;
}

}  // namespace chi
