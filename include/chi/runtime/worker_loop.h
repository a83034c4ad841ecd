// The loop of a runtime Worker (worker.h): each pass drains resumed fibers, polls the
// lanes (active set every pass, cold set every kColdPollInterval passes) and the external
// poller, starts adopted tasks and runs due timers; an idle worker spins for its idle
// time, then parks on its futex or sleeps through its parker. While idle or parked it
// watches its peers' lanes and takes the tasks of one stuck in a long task (lane_help.h).
// Included by worker.h after the class; not meant to be included on its own.
#pragma once

#include <pthread.h>  // pthread_setname_np: workers are named in ps, top and debuggers
#include <sched.h>    // sched_yield while idle

#include <algorithm>  // min of the park's deadlines
#include <cstdio>     // snprintf of the thread's name

#include "chi/core/atomic.h"      // the parked word and its fence
#include "chi/core/futex.h"       // parking
#include "chi/runtime/worker.h"   // the class these functions belong to

namespace chi {

void Worker::Loop() {
  tls_current_worker = this;
  char name[16];  // the kernel keeps 15 characters
  std::snprintf(name, sizeof(name), "chi-worker-%u", id_);
  pthread_setname_np(pthread_self(), name);
  san_.AdoptCurrentThread();  // before any shell: they switch back to this stack
  u32 idle = 0;
  u64 idle_since = 0;
  u64 pass = 0;
  u64 stop_since = 0;
  for (;;) {
    ++pass;
    bool did = DrainResumes();
    did |= PollLanes(pass);
    did |= external_.Poll(id_);
    did |= StartAdopted();
    if ((pass & (kColdPollInterval - 1)) == 0 || !did) did |= RunDueTimers(false);
    if (did) {
      idle = 0;
      continue;
    }
    if (stop_.Load(MemOrder::kAcquire) != 0) {
      RunDueTimers(true);  // periodic tasks end at shutdown
      if (running_ == 0 && !HasWork()) break;
      if (stop_since == 0) stop_since = NowNs();
      if (NowNs() - stop_since > kStopGraceNs) break;  // fibers blocked forever are abandoned
      CpuRelax();
      continue;
    }
    // Spin for a fixed time, not a fixed count (PAUSE costs 10-140 cycles by CPU),
    // yielding every 64 polls so a client thread sharing this CPU still runs. The first
    // kHotPolls polls after work skip the PAUSE: the next request of a client waiting on
    // a round trip comes within a few hundred ns, and a PAUSE (~27 ns on the CI
    // machine's Zen 5) would add up to its length to noticing it.
    if (idle == 0) idle_since = NowNs();
    ++idle;
    if (parker_ != nullptr) {
      // Its polls are system calls: beside them the clock is cheap, so the spin ends on
      // time (counted in 64s, the network worker polled 66 times per request on the 2-core
      // VM, whatever its spin_ns).
      if (NowNs() - idle_since < idle_spin_ns_) continue;
    } else {
      if ((idle & 63) != 0) {
        if (idle > kHotPolls) CpuRelax();
        continue;
      }
      const u64 now = NowNs();
      if (help_ != nullptr && HelpPeers(now)) {
        idle = 0;
        continue;
      }
      if (now - idle_since < idle_spin_ns_) {
        sched_yield();
        continue;
      }
    }
    idle = 0;
    if (external_.End(id_)) continue;
    Park();
  }
  external_.End(id_);
  EndShells();
  tls_current_worker = nullptr;
}

bool Worker::FeedLane() {
  if (overflow_->Empty()) return false;
  if (active_.empty()) {  // no lane (a poller's worker beyond kPollerLanes): only it runs them
    while (Task *t = overflow_->Pop()) StartTask(t);
    return true;
  }
  overflow_->FeedInto(active_.front().lane);
  return false;  // the lane's poll below starts them
}

bool Worker::PollLanes(u64 pass) {
  bool did = FeedLane();
  for (size_t i = 0; i < active_.size(); ++i) {
    LaneSlot &slot = active_[i];
    u64 entry;
    u32 n = 0;
    while (n < kPopBatch && slot.lane->TryPop(entry)) {
      StartTask(reinterpret_cast<Task *>(entry));
      ++n;
    }
    if (n != 0) {
      slot.empty_polls = 0;
      did = true;
    } else if (active_.size() > 1 && ++slot.empty_polls > kColdAfterEmptyPolls) {
      cold_.push_back(slot);  // quiet lanes move out of the hot loop
      active_[i] = active_.back();
      active_.pop_back();
      --i;
    }
  }
  if ((pass & (kColdPollInterval - 1)) == 0 || !did) {
    for (size_t i = 0; i < cold_.size(); ++i) {
      if (cold_[i].lane->Empty()) continue;
      cold_[i].empty_polls = 0;
      active_.push_back(cold_[i]);  // activity: back to the active set
      cold_[i] = cold_.back();
      cold_.pop_back();
      --i;
      did = true;
    }
  }
  return did;
}

/** Starts the tasks the external poller adopted in this pass; true when there were any. */
bool Worker::StartAdopted() {
  if (adopted_.empty()) return false;
  for (size_t k = 0; k < adopted_.size(); ++k) {  // by index: safe even if a start adopted more
    StartAcquired(adopted_[k].task, adopted_[k].pool);
  }
  adopted_.clear();
  return true;
}

bool Worker::DrainResumes() {
  if (resume_.Load(MemOrder::kRelaxed) == 0) return false;
  // acquire pairs with Resume's release; taking the whole stack at once avoids ABA.
  auto *r = reinterpret_cast<RunContext *>(resume_.Exchange(0, MemOrder::kAcquire));
  RunContext *fifo = nullptr;
  while (r != nullptr) {  // reverse: resume in the order events completed
    RunContext *next = r->next_;
    r->next_ = fifo;
    fifo = r;
    r = next;
  }
  while (fifo != nullptr) {
    RunContext *next = fifo->next_;
    SwitchTo(fifo);
    fifo = next;
  }
  return true;
}

bool Worker::RunDueTimers(bool stopping) {
  if (timers_.empty() && sleepers_.empty()) return false;
  const u64 now = NowNs();
  bool did = false;
  for (size_t i = 0; i < sleepers_.size(); ++i) {
    if (!stopping && now < sleepers_[i].wake_ns) continue;
    RunContext *r = sleepers_[i].r;
    sleepers_[i] = sleepers_.back();
    sleepers_.pop_back();
    --i;
    did = true;
    SwitchTo(r);  // may append new sleepers; the loop bound re-reads the size
  }
  for (size_t i = 0; i < timers_.size(); ++i) {
    RunContext *r = timers_[i];
    Task *t = r->task_;
    const bool cancelled =
        stopping || (t->state_.Load(MemOrder::kAcquire) & task_state::kCancelRequested) != 0 ||
        r->pool_->destroying_.Load(MemOrder::kAcquire) != 0;
    if (!cancelled && now < r->next_run_ns_) continue;
    timers_[i] = timers_.back();
    timers_.pop_back();
    --i;
    --running_;
    did = true;
    if (cancelled) {
      PoolInfo *pool = r->pool_;
      FreeRunContext(r);
      FinishTask(t, pool);
    } else {
      Launch(r);
    }
  }
  return did;
}

bool Worker::HasWork() const {
  if (resume_.Load(MemOrder::kRelaxed) != 0 || !overflow_->Empty() || !adopted_.empty()) {
    return true;
  }
  if (!sleepers_.empty()) {
    const u64 now = NowNs();
    for (const Sleeper &sl : sleepers_) {
      if (sl.wake_ns <= now) return true;
    }
  }
  for (const LaneSlot &l : active_) {
    if (!l.lane->Empty()) return true;
  }
  for (const LaneSlot &l : cold_) {
    if (!l.lane->Empty()) return true;
  }
  return false;
}

/**
 * An idle worker's look at its peers' lanes (every kLaneHelpLookNs): takes up to
 * kPopBatch tasks from each lane whose owner has been stuck for kLaneStuckNs, refills the
 * lane from the owner's overflow list (the owner feeds it only from its loop), and starts
 * them here. True when it took any.
 */
bool Worker::HelpPeers(u64 now_ns) {
  if (now_ns < next_help_ns_) return false;
  next_help_ns_ = now_ns + kLaneHelpLookNs;
  bool did = false;
  for (u32 k = 0; k < help_->Size(); ++k) {
    TaskLane *lane = help_->Lane(k);
    if (!help_->Stuck(k, lane->Head(), !lane->Empty(), now_ns)) continue;
    u64 taken[kPopBatch];
    u32 n = 0;
    while (n < kPopBatch && lane->TryPop(taken[n])) ++n;
    help_->Overflow(k)->FeedInto(lane);
    help_->Took(k, lane->Head());  // before running them: they may take long themselves
    helped_.AddOwned(n);           // only this thread writes it
    for (u32 i = 0; i < n; ++i) StartTask(reinterpret_cast<Task *>(taken[i]));
    did |= n != 0;
  }
  return did;
}

/** When the earliest timer or sleeper is due (~0 for none). */
u64 Worker::NextTimerNs() const {
  u64 next = ~0ull;
  for (RunContext *r : timers_) next = r->next_run_ns_ < next ? r->next_run_ns_ : next;
  for (const Sleeper &sl : sleepers_) next = sl.wake_ns < next ? sl.wake_ns : next;
  return next;
}

/**
 * Turns a park into a deep one (no timeout to watch the peers) when no peer lane has a
 * task ready; false when one has (the park stays a watching one) or a waker came first.
 */
bool Worker::ParkDeep() {
  if (help_->PeersQueued()) return false;
  u32 parked = kParked;
  if (!parked_.CompareExchange(parked, kParkedDeep, MemOrder::kRelaxed)) return false;
  // seq_cst: counted before the re-check of the peers' lanes; a submitter publishes into a
  // lane, then reads the count (Dekker): it sees us here, or we see its task.
  deep_parked_->FetchAdd(1, MemOrder::kSeqCst);
  if (!help_->PeersQueued()) return true;
  deep_parked_->FetchSub(1, MemOrder::kRelaxed);
  parked = kParkedDeep;
  parked_.CompareExchange(parked, kParked, MemOrder::kRelaxed);  // a waker may have come
  return false;
}

void Worker::Park() {
  for (;;) {
    parked_.Store(kParked, MemOrder::kRelaxed);
    // seq_cst fence: the parked flag is visible before we re-check for work, and a
    // producer's fence orders its push before its read of the flag (Dekker).
    FenceSeqCst();
    if (HasWork() || stop_.Load(MemOrder::kAcquire) != 0) {
      parked_.Store(kAwake, MemOrder::kRelaxed);
      return;
    }
    const bool deep = help_ != nullptr && ParkDeep();
    const bool watching = help_ != nullptr && !deep;
    const u64 now = NowNs();
    const u64 timer = NextTimerNs();
    u64 until = timer;
    if (watching) {
      // Look again after kLaneWatchParkNs, or when a lane's wait is due (but not sooner
      // than a look may come: a due lane whose tasks cannot be popped yet would spin us).
      const u64 due = std::min(now + kLaneWatchParkNs, help_->NextDueNs());
      until = std::min(until, std::max(due, now + kLaneHelpLookNs));
    } else if (deep && help_->HasRolePeers()) {
      until = std::min(until, now + kLaneDeepParkNs);  // tasks queued with no wake (lane_help.h)
    }
    const u64 timeout = until == ~0ull ? 0 : (until > now ? until - now : 1);
    parks_.FetchAdd(1, MemOrder::kRelaxed);
    if (parker_ != nullptr) {
      parker_->Sleep(timeout);  // a waker that saw parked_ != kAwake interrupts it
    } else {
      FutexWait(parked_.Raw(), deep ? kParkedDeep : kParked, timeout);
    }
    if (deep) deep_parked_->FetchSub(1, MemOrder::kRelaxed);
    const bool woken = parked_.Exchange(kAwake, MemOrder::kRelaxed) == kAwake;
    // Watching or deep, and nobody woke it: look at the peers, and sleep on unless they
    // need help (no idle spin between these looks; a look that finds tasks queued starts
    // their wait, and the next park watches them).
    const u64 after = NowNs();
    if (woken || help_ == nullptr || stop_.Load(MemOrder::kAcquire) != 0 || after >= timer) return;
    if (HelpPeers(after)) return;
  }
}

}  // namespace chi
