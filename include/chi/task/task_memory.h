// Task memory for in-process tasks: per-thread caches of fixed size classes so
// submit and complete never reach malloc in steady state. A block freed by
// another thread (a worker freeing a fire-and-forget task) goes back to its
// owner's lock-free remote list, which the owner drains when its own list is empty.
// The pool's lock is held across fork (HoldAcrossFork), so a child forked while another
// thread started or ended can still start threads that allocate tasks.
#pragma once


#include <cstddef>  // max_align_t
#include <cstdlib>  // malloc/free for blocks and oversized tasks
#include <mutex>    // guards the cold list of abandoned caches (thread start/exit only)
#include <new>      // placement new

#include "chi/core/atomic.h"     // remote-free stack head
#include "chi/core/fork_lock.h"  // HoldAcrossFork for the pool's lock
#include "chi/core/macros.h"     // CHI_LIKELY
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** Size-class allocator with per-thread caches; blocks keep a 16-byte header. */
class TaskMemory {
 public:
  static constexpr u32 kNumClasses = 7;          ///< 64 B .. 4 KiB, powers of two
  static constexpr u64 kMaxClassBytes = 4096;
  static constexpr u32 kMaxCachedPerClass = 1024;  ///< beyond this, blocks go to malloc

  /** Allocates at least `bytes` (16-byte aligned); nullptr when memory is exhausted. */
  static void *Alloc(u64 bytes) {
    const u32 cls = ClassOf(bytes + sizeof(Header));
    if (cls == kNumClasses) {  // oversized: plain malloc, tagged so Free knows
      auto *h = static_cast<Header *>(malloc(bytes + sizeof(Header)));
      if (h == nullptr) return nullptr;
      h->owner = nullptr;
      h->cls = kNumClasses;
      return h + 1;
    }
    Cache &c = Local();
    Header *h = c.free_[cls];
    if (h == nullptr) {
      c.DrainRemote();
      h = c.free_[cls];
    }
    c.Count(&c.allocs_);
    if (h != nullptr) {
      c.free_[cls] = h->next;
      --c.count_[cls];
    } else {
      h = static_cast<Header *>(malloc(kMinClassBytes << cls));
      if (h == nullptr) return nullptr;
    }
    h->owner = &c;
    h->cls = cls;
    return h + 1;
  }

  /** Class c's blocks are kMinClassBytes << c bytes, header included (64 B .. 4 KiB). */
  static constexpr u32 kMinClassShift = 6;
  static constexpr u64 kMinClassBytes = 1ull << kMinClassShift;
  static_assert(kMinClassBytes << (kNumClasses - 1) == kMaxClassBytes, "classes end at 4 KiB");

  /** The smallest class whose blocks hold `bytes`, header included (kNumClasses: oversized). */
  static constexpr u32 ClassOf(u64 bytes) {
    if (bytes <= kMinClassBytes) return 0;
    if (bytes > kMaxClassBytes) return kNumClasses;
    // ceil(log2(bytes)) - log2(kMinClassBytes)
    return static_cast<u32>(64 - __builtin_clzll(bytes - 1)) - kMinClassShift;
  }

  /**
   * Class-sized blocks allocated and not yet freed, summed over every thread
   * (oversized tasks are not counted). A statistic for leak checks: exact once
   * all threads are quiet.
   */
  static i64 LiveBlocks() {
    CachePool &p = Pool();
    std::lock_guard<std::mutex> g(p.mu);
    i64 live = 0;
    for (Cache *c = p.all; c != nullptr; c = c->next_all_) {
      live += static_cast<i64>(c->allocs_.Load(MemOrder::kRelaxed)) -
              static_cast<i64>(c->frees_.Load(MemOrder::kRelaxed));
    }
    return live;
  }

  /** Returns a block from Alloc, from any thread. */
  static void Free(void *p) {
    if (p == nullptr) return;
    Header *h = static_cast<Header *>(p) - 1;
    if (h->cls == kNumClasses) {
      free(h);
      return;
    }
    Cache &me = Local();
    me.Count(&me.frees_);
    if (h->owner == &me) {
      me.PushLocal(h);
    } else {
      h->owner->PushRemote(h);
    }
  }

 private:
  struct Cache;
  /** Precedes every block; `next` links free blocks. */
  struct alignas(16) Header {
    union {
      Cache *owner;
      Header *next;
    };
    u32 cls;
  };

  /** One thread's free lists; immortal so late remote frees always have a home. */
  struct Cache {
    Header *free_[kNumClasses] = {};
    u32 count_[kNumClasses] = {};
    Atomic<u64> remote_;  ///< Treiber stack of blocks freed by other threads
    Atomic<u64> allocs_;  ///< class-sized blocks handed out by this thread
    Atomic<u64> frees_;   ///< class-sized blocks this thread gave back
    Cache *next_abandoned_ = nullptr;
    Cache *next_all_ = nullptr;

    /** Owner-only increment: a load and a store, no read-modify-write on the hot path. */
    static void Count(Atomic<u64> *c) {
      c->Store(c->Load(MemOrder::kRelaxed) + 1, MemOrder::kRelaxed);
    }

    void PushLocal(Header *h) {
      const u32 cls = h->cls;
      if (count_[cls] >= kMaxCachedPerClass) {
        free(h);
        return;
      }
      h->next = free_[cls];
      free_[cls] = h;
      ++count_[cls];
    }
    /** Lock-free push from any thread; `cls` stays valid (only `owner` is reused as `next`). */
    void PushRemote(Header *h) {
      u64 head = remote_.Load(MemOrder::kRelaxed);
      do {
        h->next = reinterpret_cast<Header *>(head);
        // release: the owner must see `next` and the block's contents.
      } while (!remote_.CompareExchange(head, reinterpret_cast<u64>(h), MemOrder::kRelease));
    }
    /** Moves every remotely freed block to the local lists (owner thread only). */
    void DrainRemote() {
      // acquire pairs with PushRemote's release; exchange takes the whole stack, so no ABA.
      auto *h = reinterpret_cast<Header *>(remote_.Exchange(0, MemOrder::kAcquire));
      while (h != nullptr) {
        Header *next = h->next;
        PushLocal(h);
        h = next;
      }
    }
  };

  /** Hands caches of exited threads to new threads (caches are never freed). */
  struct CachePool {
    std::mutex mu;
    Cache *abandoned = nullptr;
    Cache *all = nullptr;  ///< every cache ever made (for LiveBlocks)
  };
  static CachePool &Pool() {
    static CachePool *pool = NewPool();  // immortal: thread exits may run late
    return *pool;
  }
  /** The pool, with its lock held across fork (HoldAcrossFork): the child starts with it free. */
  static CachePool *NewPool() {
    auto *pool = new CachePool();
    HoldAcrossFork<&PoolLock>();
    return pool;
  }
  /** The pool's lock (the fork handlers' way to it). */
  static std::mutex &PoolLock() { return Pool().mu; }

  /** Returns the thread's cache to the pool at thread exit. */
  struct CacheHandle {
    Cache *cache;
    CacheHandle() {
      CachePool &p = Pool();
      std::lock_guard<std::mutex> g(p.mu);
      if (p.abandoned != nullptr) {
        cache = p.abandoned;
        p.abandoned = cache->next_abandoned_;
      } else {
        cache = new Cache();
        cache->next_all_ = p.all;
        p.all = cache;
      }
    }
    ~CacheHandle() {
      CachePool &p = Pool();
      std::lock_guard<std::mutex> g(p.mu);
      cache->next_abandoned_ = p.abandoned;
      p.abandoned = cache;
    }
  };

  /**
   * The calling thread's cache. The plain pointer is read on every call (a trivial
   * thread_local costs no initialisation check); the handle that returns the cache at
   * thread exit is made on the thread's first call.
   */
  static Cache &Local() {
    Cache *c = tls_cache_;
    return CHI_LIKELY(c != nullptr) ? *c : BindLocal();
  }
  static Cache &BindLocal() {
    thread_local CacheHandle handle;
    tls_cache_ = handle.cache;
    return *handle.cache;
  }
  static inline thread_local Cache *tls_cache_ = nullptr;

  /** The pool, made before main (HoldAcrossFork says why). */
  static inline CachePool &made_pool_ = Pool();
};

}  // namespace chi
