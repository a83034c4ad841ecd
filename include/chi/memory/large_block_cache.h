// Large payload blocks kept between tasks (host only). Invariant: a kept block is mapped
// and unused, and its pages are lent to the kernel unless it counts in the warm budget;
// every block handed out has exactly one owner.
//
// Why: glibc maps every allocation above its largest mmap threshold (32 MiB) afresh and
// unmaps it on free. A stream of large payloads (each a TaskBuffer decoded on the runtime
// and again on the client) then faulted in, zeroed and unmapped every page of every buffer:
// a 32 MiB echo over shm took 4.5x as long as a 16 MiB one on the 2-core machine. Smaller
// ones (from glibc's first mmap threshold, 128 KiB) fare no better on a thread whose buffers
// come and go out of step: glibc trims its main heap whenever more than twice its threshold
// lies free at the top, so a ZeroMQ client's echo (the payload, the encoded request that
// ZeroMQ frees once sent, the decoded answer) faulted in 480 fresh pages per 1 MiB round trip
// and 62 per 192 KiB one; with the payloads here, 2-7. A freed
// block here keeps its mapping and serves the next allocation it fits; up to WarmLimit()
// bytes of kept blocks stay resident (memory.warm_payload_bytes, default kDefaultWarmBytes),
// and the pages of the rest are lent to the kernel (LendPagesToKernel: reclaimed without
// writeback when memory runs short).
//
// Fork: the lock is held across fork (HoldAcrossFork), so a child forked while another
// thread held it starts with it free and can still allocate (a fork/exec pattern's child
// may build large payloads before it execs, or never exec at all).
#pragma once

#include <sys/mman.h>  // mmap, munmap

#include <algorithm>  // max: the smallest mapping
#include <mutex>      // guards the kept blocks (large allocations only: never contended long)

#include "chi/core/fork_lock.h"     // HoldAcrossFork
#include "chi/core/lend_pages.h"    // LendPagesToKernel
#include "chi/core/types.h"         // u32, u64
#include "chi/queue/ring_layout.h"  // RoundUpPow2, RoundUpTo: mapping sizes

namespace chi {

/** A process-wide cache of large, page-mapped blocks for task payloads. */
class LargeBlockCache {
 public:
  /** Smallest block served here; smaller ones are malloc's (below this it reuses them well). */
  static constexpr u64 kMinBytes = 128ull << 10;
  /**
   * Mappings of this size (a huge page) and more are whole multiples of it, smaller ones a
   * power of two, so near sizes share blocks and a small payload's block counts little
   * against the warm budget.
   */
  static constexpr u64 kGranuleBytes = 2ull << 20;
  /**
   * Blocks kept at once: a window of 64 payloads in flight (a client's outstanding tasks,
   * or the runtime's copies of them) finds its blocks again.
   */
  static constexpr u32 kMaxKeptBlocks = 64;
  /** Mapped bytes kept at once (lent pages cost address space only). */
  static constexpr u64 kMaxKeptBytes = 1ull << 30;
  /**
   * The default of kept bytes whose pages stay ours (not lent), as glibc keeps a freed heap
   * top up to 64 MiB: lending costs a page-table walk and TLB flush per free, which made a
   * 16 MiB echo slower than glibc's reuse of its heap. Blocks freed beyond it are lent.
   */
  static constexpr u64 kDefaultWarmBytes = 64ull << 20;

  /** The process's cache. Never destroyed: payloads may be freed during static destruction. */
  static LargeBlockCache &Instance() {
    static LargeBlockCache *cache = new LargeBlockCache();
    return *cache;
  }

  /**
   * A block of at least `bytes` bytes, 64-byte aligned: a kept block that fits (at most
   * twice the mapping it needs, so a huge block does not serve a small payload), else a new
   * mapping. nullptr when the system has no memory for it.
   */
  void *Allocate(u64 bytes) {
    if (bytes > kMaxBlockBytes) return nullptr;
    const u64 need = MappingFor(bytes + kHeaderBytes);
    Block block = TakeKept(need);
    if (block.base == nullptr) block = Map(need);
    if (block.base == nullptr) {
      Trim();  // kept blocks may be what the system is short of
      block = Map(need);
      if (block.base == nullptr) return nullptr;
    }
    // Written on every reuse: the kernel may have taken the header's page meanwhile.
    Header *h = reinterpret_cast<Header *>(block.base);
    h->mapped = block.mapped;
    return block.base + kHeaderBytes;
  }

  /** Takes back a block from Allocate: kept for the next one when there is room, else unmapped. */
  void Free(void *p) {
    if (p == nullptr) return;
    char *base = static_cast<char *>(p) - kHeaderBytes;
    const Header *h = reinterpret_cast<const Header *>(base);
    const u64 mapped = h->mapped;
    if (Keep(Block{base, mapped, false})) return;
    // Lent before it is kept: once kept, another thread may take it and write it at once.
    if (LendPagesToKernel(base, mapped) && Keep(Block{base, mapped, true})) return;
    munmap(base, mapped);
  }

  /** Unmaps every kept block (memory pressure, tests). */
  void Trim() {
    Block all[kMaxKeptBlocks];
    u32 n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = kept_count_;
      for (u32 i = 0; i < n; ++i) all[i] = kept_[i];
      kept_count_ = 0;
    }
    for (u32 i = 0; i < n; ++i) munmap(all[i].base, all[i].mapped);
  }

  /**
   * Sets the kept bytes whose pages stay resident (the config key memory.warm_payload_bytes;
   * 0 lends every kept block). Kept blocks past a lowered limit are lent now.
   */
  void SetWarmLimit(u64 bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    warm_limit_ = bytes;
    u64 warm = UsageLocked().warm_bytes;
    for (u32 i = 0; i < kept_count_ && warm > warm_limit_;) {
      Block &b = kept_[i];
      if (b.lent) {
        ++i;
        continue;
      }
      warm -= b.mapped;
      b.lent = LendPagesToKernel(b.base, b.mapped);
      if (b.lent) {
        ++i;
        continue;
      }
      munmap(b.base, b.mapped);  // where pages cannot be lent, the block goes
      kept_[i] = kept_[--kept_count_];
    }
  }

  /** The kept bytes whose pages may stay resident. */
  u64 WarmLimit() const {
    std::lock_guard<std::mutex> lock(mu_);
    return warm_limit_;
  }

  /** What the cache keeps at one moment. */
  struct Usage {
    u32 blocks = 0;      ///< blocks kept for reuse
    u64 bytes = 0;       ///< their mapped bytes
    u64 warm_bytes = 0;  ///< of those, bytes whose pages were not lent to the kernel
  };
  /** The kept blocks right now, counted together (Monitor, tests). */
  Usage Kept() const {
    std::lock_guard<std::mutex> lock(mu_);
    return UsageLocked();
  }

 private:
  /** At a block's start; the payload follows at kHeaderBytes (a cache line: aligned). */
  struct Header {
    u64 mapped;  ///< bytes of the whole mapping
  };
  /** A mapping: kept, taken from the kept ones, or new. */
  struct Block {
    char *base = nullptr;
    u64 mapped = 0;
    bool lent = false;  ///< its pages were lent to the kernel (not counted warm)
  };
  static constexpr u64 kHeaderBytes = 64;
  /** Larger requests fail outright (no mapping size arithmetic can overflow). */
  static constexpr u64 kMaxBlockBytes = 1ull << 46;

  /** Holds the lock across fork (HoldAcrossFork): a forked child can still allocate. */
  LargeBlockCache() { HoldAcrossFork<&Lock>(); }
  /** The cache's lock (the fork handlers' way to it). */
  static std::mutex &Lock() { return Instance().mu_; }

  /** The mapping size for `bytes` (see kGranuleBytes). */
  static u64 MappingFor(u64 bytes) {
    if (bytes >= kGranuleBytes) return RoundUpTo(bytes, kGranuleBytes);
    return std::max<u64>(kMinBytes, RoundUpPow2(static_cast<u32>(bytes)));  // < 2 MiB here
  }

  /** Removes and returns the smallest kept block of `need` to 2 * `need` bytes (or none). */
  Block TakeKept(u64 need) {
    std::lock_guard<std::mutex> lock(mu_);
    u32 best = kMaxKeptBlocks;
    for (u32 i = 0; i < kept_count_; ++i) {
      const u64 m = kept_[i].mapped;
      if (m >= need && m <= 2 * need && (best == kMaxKeptBlocks || m < kept_[best].mapped)) {
        best = i;
      }
    }
    if (best == kMaxKeptBlocks) return Block{};
    const Block block = kept_[best];
    kept_[best] = kept_[--kept_count_];
    return block;
  }

  /** Sums the kept blocks (mu_ held; at most kMaxKeptBlocks of them). */
  Usage UsageLocked() const {
    Usage u;
    u.blocks = kept_count_;
    for (u32 i = 0; i < kept_count_; ++i) {
      u.bytes += kept_[i].mapped;
      if (!kept_[i].lent) u.warm_bytes += kept_[i].mapped;
    }
    return u;
  }

  /** Keeps a freed block when the limits allow (a warm one only within warm_limit_). */
  bool Keep(const Block &block) {
    std::lock_guard<std::mutex> lock(mu_);
    const Usage u = UsageLocked();
    if (u.blocks == kMaxKeptBlocks || u.bytes + block.mapped > kMaxKeptBytes) return false;
    if (!block.lent && u.warm_bytes + block.mapped > warm_limit_) return false;
    kept_[kept_count_++] = block;
    return true;
  }

  /** A new private anonymous mapping of `bytes` (base nullptr when there is no memory). */
  static Block Map(u64 bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? Block{} : Block{static_cast<char *>(p), bytes, false};
  }

  mutable std::mutex mu_;
  Block kept_[kMaxKeptBlocks] = {};
  u32 kept_count_ = 0;
  u64 warm_limit_ = kDefaultWarmBytes;  ///< see SetWarmLimit

  /** The cache, made before main (HoldAcrossFork says why). */
  static LargeBlockCache &made_;
};

inline LargeBlockCache &LargeBlockCache::made_ = LargeBlockCache::Instance();

}  // namespace chi
