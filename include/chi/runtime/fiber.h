// Fibers for task execution: Boost.Context fibers on pooled 64 KB stacks.
// A worker owns one StackPool; stacks are mmap'd with a guard page and reused,
// so starting a task costs a context switch, not an allocation. Switches are
// annotated for ASan and TSan so sanitizer builds understand the stack changes.
#pragma once

#include <sys/mman.h>  // mmap/mprotect for stacks with guard pages

#include <boost/context/fiber.hpp>          // boost::context::fiber
#include <boost/context/stack_context.hpp>  // stack_context handed to Boost
#include <cstddef>                          // size_t
#include <new>                              // std::bad_alloc
#include <utility>                          // std::move
#include <vector>                           // free stack list

#include "chi/core/types.h"  // u64

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
      ++total_;
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
  u64 TotalStacks() const { return total_; }
  u64 FreeStacks() const { return free_.size(); }

 private:
  static constexpr size_t kPage = 4096;
  static size_t RoundToPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }

  size_t stack_bytes_;
  u64 total_ = 0;
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
 * worker's own stack, or a task fiber) keeps one; a no-op in normal builds.
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

  /** Call just before switching from `self` to `to`; `dying` when self never resumes. */
  static void BeforeSwitch(FiberSanitizerState *self, const FiberSanitizerState *to, bool dying) {
#if CHI_ASAN_FIBERS
    __sanitizer_start_switch_fiber(dying ? nullptr : &self->fake_stack, to->stack_bottom,
                                   to->stack_size);
#endif
#if CHI_TSAN_FIBERS
    __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
    (void)self;
    (void)to;
    (void)dying;
  }
  /** Call first thing after a switch lands in `self`; records the stack we came from. */
  static void AfterSwitch(FiberSanitizerState *self, FiberSanitizerState *from) {
#if CHI_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(self->fake_stack, &from->stack_bottom, &from->stack_size);
#endif
    (void)self;
    (void)from;
  }
};

}  // namespace chi
