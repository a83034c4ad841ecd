// Fibers for task execution: Boost.Context fibers on pooled 64 KB stacks, kept
// as reusable "shells". A worker owns one ShellPool; each shell's body is a loop
// that runs one task after another, so starting a task costs a context switch,
// not a fiber creation. Invariant: a shell's body never returns while it still
// has work, and every switch is annotated for ASan and TSan right before the
// jump, with no instrumented frame unwinding in between (TSan's shadow stacks
// stay balanced; see FiberSanitizerState).
#pragma once

#include <sys/mman.h>  // mmap/mprotect for stacks with guard pages

#include <boost/context/fiber.hpp>          // boost::context::fiber
#include <boost/context/stack_context.hpp>  // stack_context handed to Boost
#include <cstddef>                          // size_t
#include <memory>                           // unique_ptr for shells (never move)
#include <new>                              // std::bad_alloc
#include <utility>                          // std::move
#include <vector>                           // free stack list, shell lists

#include "chi/core/atomic.h"  // counters read by Stats from other threads
#include "chi/core/macros.h"  // CHI_LIKELY, CHI_UNLIKELY
#include "chi/core/types.h"   // u64

#if defined(__SANITIZE_ADDRESS__)
#define CHI_ASAN_FIBERS 1
#include <sanitizer/common_interface_defs.h>  // __sanitizer_*_switch_fiber
#endif
#if defined(__SANITIZE_THREAD__)
#define CHI_TSAN_FIBERS 1
#include <sanitizer/tsan_interface.h>  // __tsan_*_fiber
#endif

namespace chi {

namespace ctx = boost::context;

/** Reuses fixed-size stacks (one guard page below each). Owned by one worker thread. */
class StackPool {
 public:
  /** Stacks of `stack_bytes` (rounded up to pages), 64 KB by default. */
  explicit StackPool(size_t stack_bytes = 64 * 1024) : stack_bytes_(RoundToPage(stack_bytes)) {}
  ~StackPool() {
    for (void *base : free_) munmap(base, stack_bytes_ + kPage);
  }
  StackPool(const StackPool &) = delete;
  StackPool &operator=(const StackPool &) = delete;

  /** A stack for Boost; reuses a freed one when available. */
  ctx::stack_context Allocate() {
    void *base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = mmap(nullptr, stack_bytes_ + kPage, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, kPage, PROT_NONE);  // guard page: overflow faults instead of corrupting
      total_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    }
    ctx::stack_context sc;
    sc.size = stack_bytes_;
    sc.sp = static_cast<char *>(base) + kPage + stack_bytes_;  // stacks grow down
    last_bottom_ = static_cast<char *>(base) + kPage;
    return sc;
  }
  /** Returns a stack to the pool. */
  void Deallocate(ctx::stack_context &sc) {
    free_.push_back(static_cast<char *>(sc.sp) - stack_bytes_ - kPage);
  }
  size_t StackBytes() const { return stack_bytes_; }
  /** Lowest usable address of the stack handed out last (sanitizer annotations). */
  const void *LastStackBottom() const { return last_bottom_; }
  /** Stacks ever mapped (for stats and leak checks). */
  u64 TotalStacks() const { return total_.Load(MemOrder::kRelaxed); }
  u64 FreeStacks() const { return free_.size(); }

 private:
  static constexpr size_t kPage = 4096;
  static size_t RoundToPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }

  size_t stack_bytes_;
  Atomic<u64> total_;
  const void *last_bottom_ = nullptr;
  std::vector<void *> free_;
};

/** The StackAllocator concept Boost expects, forwarding to a StackPool. */
class PooledStack {
 public:
  explicit PooledStack(StackPool *pool) : pool_(pool) {}
  ctx::stack_context allocate() { return pool_->Allocate(); }
  void deallocate(ctx::stack_context &sc) { pool_->Deallocate(sc); }

 private:
  StackPool *pool_;
};

/**
 * Sanitizer bookkeeping for one side of a switch. Each execution context (the
 * worker's own stack, or a fiber shell) keeps one; a no-op in normal builds.
 * TSan keeps a shadow stack per fiber and books every function entry and exit
 * on the fiber it believes current, so an annotation must sit right before the
 * jump on both sides: then the frames a switch enters and leaves land on one
 * fiber. A fiber that ends is the exception (Boost switches away only after the
 * body's frames returned), so its last switch is told to TSan by the side that
 * lands (AfterExit).
 */
struct FiberSanitizerState {
  const void *stack_bottom = nullptr;
  size_t stack_size = 0;
#if CHI_ASAN_FIBERS
  void *fake_stack = nullptr;
#endif
#if CHI_TSAN_FIBERS
  void *tsan_fiber = nullptr;
#endif

  /** Makes this the state of the calling thread's own stack (the owner of its shells). */
  void AdoptCurrentThread() {
#if CHI_TSAN_FIBERS
    tsan_fiber = __tsan_get_current_fiber();
#endif
  }

  /** Call just before switching from `self` to `to`, when `self` will be resumed. */
  static void BeforeSwitch(FiberSanitizerState *self, const FiberSanitizerState *to) {
#if CHI_ASAN_FIBERS
    __sanitizer_start_switch_fiber(&self->fake_stack, to->stack_bottom, to->stack_size);
#endif
#if CHI_TSAN_FIBERS
    __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
    (void)self;
    (void)to;
  }
  /** Call first thing after a switch lands in `self`; records the stack we came from. */
  static void AfterSwitch(FiberSanitizerState *self, FiberSanitizerState *from) {
#if CHI_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(self->fake_stack, &from->stack_bottom, &from->stack_size);
#endif
    (void)self;
    (void)from;
  }
  /**
   * Call in a fiber that is about to return for good, switching to `to`: ASan
   * frees its fake stack. TSan is told by the landing side (AfterExit), since
   * this fiber's frames still return after this call.
   */
  static void BeforeExit(FiberSanitizerState *self, const FiberSanitizerState *to) {
#if CHI_ASAN_FIBERS
    __sanitizer_start_switch_fiber(nullptr, to->stack_bottom, to->stack_size);
#endif
    (void)self;
    (void)to;
  }
  /** Call first thing after landing in `self` from a fiber that ended; forgets that fiber. */
  static void AfterExit(FiberSanitizerState *self, FiberSanitizerState *from) {
#if CHI_TSAN_FIBERS
    __tsan_switch_to_fiber(self->tsan_fiber, 0);
    __tsan_destroy_fiber(from->tsan_fiber);
    from->tsan_fiber = nullptr;
#endif
    AfterSwitch(self, from);
  }
};

/**
 * A fiber reused for many jobs. Its body (a plain function the owner gives)
 * loops: take a job, run it, Suspend, take the next; it returns only when the
 * owner ends it. Created, entered and ended by one owner thread; never moves
 * (the fiber holds its address).
 */
class FiberShell {
 public:
  /** What a shell runs, on its own stack: `body(arg, shell)`; returning ends the shell. */
  using Body = void (*)(void *arg, FiberShell &shell);
  /** Thrown out of Suspend when the owner abandons the shell (Abandon); not a job's failure. */
  struct Unwind {};

  FiberShell() = default;
  FiberShell(const FiberShell &) = delete;
  FiberShell &operator=(const FiberShell &) = delete;

  /** Owner side: creates the fiber on a stack from `stacks`; the body starts at the first Enter. */
  void Start(StackPool *stacks, FiberSanitizerState *owner, Body body, void *arg) {
    owner_ = owner;
#if CHI_TSAN_FIBERS
    san_.tsan_fiber = __tsan_create_fiber(0);
    // Boost runs the fiber's entry frame during construction: book it on the shell.
    __tsan_switch_to_fiber(san_.tsan_fiber, 0);
#endif
    fiber_ = ctx::fiber(std::allocator_arg, PooledStack(stacks),
                        [this, body, arg](ctx::fiber &&owner_side) {
                          return Main(std::move(owner_side), body, arg);
                        });
#if CHI_TSAN_FIBERS
    __tsan_switch_to_fiber(owner_->tsan_fiber, 0);
#endif
    san_.stack_bottom = stacks->LastStackBottom();
    san_.stack_size = stacks->StackBytes();
  }

  /** Owner side: runs the shell until it suspends (true) or its body returned (false). */
  bool Enter() {
    FiberSanitizerState::BeforeSwitch(owner_, &san_);
    fiber_ = std::move(fiber_).resume();
    return Landed();
  }

  /** Shell side: switches back to the owner until its next Enter. */
  void Suspend() {
    FiberSanitizerState::BeforeSwitch(&san_, owner_);
    sink_ = std::move(sink_).resume();
    FiberSanitizerState::AfterSwitch(&san_, owner_);
  }

  /**
   * Owner side, for a shell suspended in a job that will never be resumed: Suspend
   * throws Unwind in the shell, so the job's frames unwind (destructors run) and the
   * body returns. True if the shell ended (a job that swallowed Unwind and suspended
   * again leaves it alive; Boost then unwinds it when the shell is destroyed).
   */
  bool Abandon() {
    FiberSanitizerState::BeforeSwitch(owner_, &san_);
    fiber_ = std::move(fiber_).resume_with([this](ctx::fiber &&owner_side) -> ctx::fiber {
      sink_ = std::move(owner_side);
      FiberSanitizerState::AfterSwitch(&san_, owner_);
      throw Unwind{};
    });
    return !Landed();
  }

  /** False once the body returned. */
  bool Alive() const { return static_cast<bool>(fiber_); }

 private:
  /** The fiber's function: annotations around the owner's body. */
  ctx::fiber Main(ctx::fiber &&owner_side, Body body, void *arg) {
    FiberSanitizerState::AfterSwitch(&san_, owner_);
    sink_ = std::move(owner_side);
    try {
      body(arg, *this);
    } catch (const Unwind &) {  // Abandon: the job's frames are gone, end like a normal exit
    }
    FiberSanitizerState::BeforeExit(&san_, owner_);
    return std::move(sink_);
  }

  /** Owner side, right after a switch into the shell returned; false if the shell ended. */
  bool Landed() {
    if (CHI_UNLIKELY(!fiber_)) {
      FiberSanitizerState::AfterExit(owner_, &san_);
      return false;
    }
    FiberSanitizerState::AfterSwitch(owner_, &san_);
    return true;
  }

  ctx::fiber fiber_;                      ///< the shell side while it is suspended
  ctx::fiber sink_;                       ///< the owner side while the shell runs
  FiberSanitizerState san_;               ///< sanitizer view of the shell's stack
  FiberSanitizerState *owner_ = nullptr;  ///< sanitizer view of the owner's stack
};

/**
 * One thread's fiber shells, all running the same body: hands out an idle shell
 * (making one only when every shell is busy), takes it back when its job is done,
 * and ends the idle ones when the thread exits. So shells, and their stacks, are
 * bounded by the most jobs ever in progress at once, not by the jobs run.
 */
class ShellPool {
 public:
  /** Shells on `stack_bytes` stacks, switching with `owner`, running `body(arg, shell)`. */
  ShellPool(size_t stack_bytes, FiberSanitizerState *owner, FiberShell::Body body, void *arg)
      : stacks_(stack_bytes), owner_(owner), body_(body), arg_(arg) {}
  ShellPool(const ShellPool &) = delete;
  ShellPool &operator=(const ShellPool &) = delete;

  /** An idle shell (its body waits at the top of its loop), or a new one. */
  FiberShell *Take() {
    if (CHI_LIKELY(!idle_.empty())) {
      FiberShell *s = idle_.back();
      idle_.pop_back();
      return s;
    }
    all_.push_back(std::make_unique<FiberShell>());
    all_.back()->Start(&stacks_, owner_, body_, arg_);
    created_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    return all_.back().get();
  }
  /** Takes back a shell whose job finished (it is suspended between jobs). */
  void Give(FiberShell *s) { idle_.push_back(s); }

  /** Enters every idle shell once more; the body must find no job and return. */
  void EndIdle() {
    for (FiberShell *s : idle_) s->Enter();
    idle_.clear();
  }

  /** Shells ever created (each has run any number of jobs); any thread. */
  u64 Created() const { return created_.Load(MemOrder::kRelaxed); }
  /** Shells whose body has not returned yet; owner thread only. */
  u64 Live() const {
    u64 n = 0;
    for (const auto &s : all_) n += s->Alive() ? 1 : 0;
    return n;
  }
  const StackPool &Stacks() const { return stacks_; }

 private:
  StackPool stacks_;  ///< first member: outlives the shells, whose stacks it takes back
  FiberSanitizerState *owner_;
  FiberShell::Body body_;
  void *arg_;
  std::vector<std::unique_ptr<FiberShell>> all_;
  std::vector<FiberShell *> idle_;
  Atomic<u64> created_;
};

}  // namespace chi
