// Shared-memory layer: backends, offset pointers, the registry and the in-segment
// allocators, including two real processes sharing one segment (fork + exec of this
// binary; CHI_TEST_CHILD=<role> makes the copy run a child routine instead of doctest).
#include <doctest/doctest.h>

#include <chi/memory/arena_allocator.h>
#include <chi/memory/full_ptr.h>
#include <chi/memory/malloc_backend.h>
#include <chi/memory/memory_registry.h>
#include <chi/memory/posix_shm_backend.h>
#include <chi/memory/shm_ptr.h>
#include <chi/memory/size_class_allocator.h>

#include <dirent.h>    // counting /proc/self/fd
#include <fcntl.h>     // shm_open flags
#include <signal.h>    // kill
#include <sys/mman.h>  // shm_open, mmap
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execve, _exit

#include <chrono>       // deadlines for bounded waits
#include <cinttypes>    // PRIu64 for passing offsets through the environment
#include <cstdio>       // snprintf, fprintf in child routines
#include <cstdlib>      // getenv, strtoull
#include <cstring>      // memcpy, strncmp
#include <fstream>      // /proc/self/maps
#include <string>       // names
#include <thread>       // the two-thread stress variant
#include <type_traits>  // POD checks
#include <vector>       // live-block lists

extern char **environ;

using chi::AllocatorId;
using chi::ArenaAllocator;
using chi::ErrorCode;
using chi::FullPtr;
using chi::MallocBackend;
using chi::MemoryRegistry;
using chi::PosixShmBackend;
using chi::ShmPtr;
using chi::SizeClassAllocator;
using chi::Status;
using chi::u32;
using chi::u64;
using chi::u8;

namespace {

// ---- Helpers shared by parent and child ----

constexpr int kChildWaitSeconds = 120;  // hang detection only; children normally take < 2 s

/** A segment name unique to this run and call. */
std::string UniqueName(const char *tag) {
  static int counter = 0;
  return "test_" + std::to_string(getpid()) + "_" + tag + "_" + std::to_string(counter++);
}

/** Removes a segment's name at scope exit, whatever happened in between. */
struct SegmentGuard {
  std::string name;
  ~SegmentGuard() { PosixShmBackend::DestroyByName(name); }
};

/** Open file descriptors of this process. */
int CountOpenFds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

/** True if segment `name` is mapped anywhere in this process. */
bool IsMapped(const std::string &name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string os_name = PosixShmBackend::OsName(name).substr(1);  // maps omit the '/'
  while (std::getline(maps, line)) {
    if (line.find(os_name) != std::string::npos) return true;
  }
  return false;
}

/** splitmix64: the byte pattern written into blocks. */
u64 Mix(u64 x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/** Writes a block that can check itself: {size, seed} then Mix(seed + i) words. */
void FillBlock(u8 *p, u64 size, u64 seed) {
  std::memcpy(p, &size, 8);
  std::memcpy(p + 8, &seed, 8);
  for (u64 i = 16; i < size; i += 8) {
    u64 v = Mix(seed + i);
    std::memcpy(p + i, &v, size - i < 8 ? size - i : 8);
  }
}

/** True if FillBlock's pattern of this size is intact (nothing else wrote over it). */
bool CheckBlock(const u8 *p, u64 size) {
  u64 stored_size = 0, seed = 0;
  std::memcpy(&stored_size, p, 8);
  std::memcpy(&seed, p + 8, 8);
  if (stored_size != size) return false;
  for (u64 i = 16; i < size; i += 8) {
    u64 v = Mix(seed + i);
    if (std::memcmp(p + i, &v, size - i < 8 ? size - i : 8) != 0) return false;
  }
  return true;
}

/** Builds this process's environment plus the given KEY=VALUE entries. */
std::vector<std::string> ChildEnv(const std::vector<std::string> &extra) {
  std::vector<std::string> env;
  for (char **e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CHI_TEST_", 9) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

/** Starts a fresh copy of this binary running child routine `role`. */
pid_t SpawnChild(const char *role, std::vector<std::string> extra) {
  extra.push_back(std::string("CHI_TEST_CHILD=") + role);
  std::vector<std::string> env = ChildEnv(extra);
  std::vector<char *> envp;
  for (std::string &s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char *argv[] = {exe, nullptr};
  pid_t pid = fork();
  if (pid == 0) {
    execve(exe, argv, envp.data());
    _exit(127);
  }
  return pid;
}

/** Exit code of child `pid`, waiting at most kChildWaitSeconds (then kills it: -1). */
int WaitChild(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

/** "major.minor.offset" for passing a ShmPtr through the environment. */
std::string PtrToText(ShmPtr<void> p) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%u.%u.%" PRIu64, p.alloc_id_.major_, p.alloc_id_.minor_,
                p.off_);
  return buf;
}

ShmPtr<void> PtrFromText(const char *s) {
  unsigned major = 0, minor = 0;
  unsigned long long off = 0;
  if (s == nullptr || std::sscanf(s, "%u.%u.%llu", &major, &minor, &off) != 3) return {};
  return ShmPtr<void>(AllocatorId(major, minor), off);
}

// ---- Shared state of the first two-process test ----

/** What the parent leaves for the child to read, and where the child answers. */
struct Handshake {
  u64 len_;                 // bytes of pattern in the block at data_
  ShmPtr<u8> data_;         // written by the parent
  u64 parent_base_;         // parent's mapping address (the child maps elsewhere)
  u64 child_base_;          // child's mapping address
  ShmPtr<char> reply_;      // allocated and written by the child
  chi::Atomic<u32> verdict_;  // kVerdictOk once the child has checked everything
};
constexpr u32 kVerdictOk = 0x600d;
constexpr u8 PatternByte(u64 i) { return static_cast<u8>(i * 7 + 3); }

// ---- Shared state of the allocator stress ----

/** Single-producer single-consumer ring of blocks handed to the other worker. */
struct BlockRing {
  static constexpr u32 kSlots = 128;
  struct Entry {
    ShmPtr<void> ptr_;
    u64 size_;
  };
  alignas(64) chi::Atomic<u64> head_;  // next to pop (consumer)
  alignas(64) chi::Atomic<u64> tail_;  // next to fill (producer)
  Entry entries_[kSlots];

  bool TryPush(const Entry &e) {
    u64 t = tail_.Load(chi::MemOrder::kRelaxed);  // only we write tail
    if (t - head_.Load(chi::MemOrder::kAcquire) == kSlots) return false;  // slot reuse after pop
    entries_[t % kSlots] = e;
    tail_.Store(t + 1, chi::MemOrder::kRelease);  // publishes the entry
    return true;
  }
  bool TryPop(Entry *e) {
    u64 h = head_.Load(chi::MemOrder::kRelaxed);  // only we write head
    if (h == tail_.Load(chi::MemOrder::kAcquire)) return false;  // pairs with TryPush
    *e = entries_[h % kSlots];
    head_.Store(h + 1, chi::MemOrder::kRelease);  // hands the slot back to the producer
    return true;
  }
};

struct StressControl {
  BlockRing to_[2];  // to_[r]: blocks for worker r to check and free
  chi::Atomic<u32> child_attached_;
  chi::Atomic<u32> started_;
  chi::Atomic<u32> done_[2];
  chi::Atomic<u32> errors_[2];
  chi::Atomic<u64> allocs_[2];
  chi::Atomic<u64> foreign_frees_[2];
};

constexpr int kStressOps = 100000;
constexpr u64 kStressMinSize = 16;
constexpr u64 kStressMaxSize = 64 * 1024;
constexpr size_t kStressMaxLive = 200;
constexpr u64 kStressSegmentBytes = 128ull << 20;

constexpr int kStressBurst = 1500;  // blocks each side carves at once before the churn

/** Log-uniform size in [kStressMinSize, 2^max_bits] (max_bits <= 16). */
u64 RandomSize(u64 &rng, u32 max_bits) {
  rng = Mix(rng);
  u32 bits = 4 + static_cast<u32>(rng % (max_bits - 3));  // 2^4 .. 2^max_bits
  u64 hi = 1ull << bits;
  u64 size = hi - (Mix(rng) % (hi / 2));
  return size < kStressMinSize ? kStressMinSize : (size > kStressMaxSize ? kStressMaxSize : size);
}

/**
 * One side of the stress. First both sides carve a burst of fresh blocks at once (races
 * on the bump region); then they churn: allocate, fill, check and free, mostly in a few
 * hot small classes (races on the same free-list heads) and sometimes up to 64 KiB,
 * handing a quarter of the blocks to the other side and freeing what it hands over.
 * Every block's pattern is checked before it is freed, so an overlap shows up as a
 * corrupted pattern. Counts every failure in errors_.
 */
void StressWorker(SizeClassAllocator *alloc, StressControl *ctl, int me, u64 seed) {
  const int peer = 1 - me;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds / 2);
  auto fail = [&] { ctl->errors_[me].FetchAdd(1); };
  auto release = [&](ShmPtr<void> p, u64 size) {
    if (!CheckBlock(alloc->ToPointer(p.Cast<u8>()), size)) fail();
    if (!alloc->Free(p)) fail();
  };
  auto drain = [&] {
    BlockRing::Entry e;
    while (ctl->to_[me].TryPop(&e)) {
      release(e.ptr_, e.size_);
      ctl->foreign_frees_[me].FetchAdd(1, chi::MemOrder::kRelaxed);
    }
  };
  // Start together so the two sides really overlap.
  ctl->started_.FetchAdd(1);
  while (ctl->started_.Load() < 2) {
    if (std::chrono::steady_clock::now() > deadline) return fail();
    chi::CpuRelax();
  }
  u64 rng = seed;
  u64 serial = static_cast<u64>(me) << 56;
  auto allocate = [&](u32 max_bits, std::vector<BlockRing::Entry> *into) {
    u64 size = RandomSize(rng, max_bits);
    ShmPtr<void> p = alloc->Allocate(size);
    if (p.IsNull()) return fail();
    FillBlock(alloc->ToPointer(p.Cast<u8>()), size, ++serial);
    into->push_back({p, size});
    ctl->allocs_[me].FetchAdd(1, chi::MemOrder::kRelaxed);
  };
  std::vector<BlockRing::Entry> burst;
  for (int i = 0; i < kStressBurst; ++i) allocate(9, &burst);
  std::vector<BlockRing::Entry> live;
  for (int op = 0; op < kStressOps; ++op) {
    rng = Mix(rng);
    const u64 dice = rng % 100;
    if (live.empty() || (dice < 50 && live.size() < kStressMaxLive)) {
      allocate(dice % 8 == 0 ? 16 : 6, &live);
    } else {
      size_t i = Mix(rng) % live.size();
      BlockRing::Entry e = live[i];
      live[i] = live.back();
      live.pop_back();
      if (dice >= 75 || !ctl->to_[peer].TryPush(e)) release(e.ptr_, e.size_);
    }
    drain();
  }
  for (const BlockRing::Entry &e : live) release(e.ptr_, e.size_);
  for (const BlockRing::Entry &e : burst) release(e.ptr_, e.size_);
  ctl->done_[me].Store(1, chi::MemOrder::kRelease);  // we push nothing more
  // Free what the peer still sends until it is done and its last blocks are drained.
  while (true) {
    bool peer_done = ctl->done_[peer].Load(chi::MemOrder::kAcquire) != 0;
    drain();
    if (peer_done && ctl->to_[me].head_.Load() == ctl->to_[me].tail_.Load()) break;
    if (std::chrono::steady_clock::now() > deadline) return fail();
    chi::CpuRelax();
  }
}

// ---- Child routines (run instead of doctest when CHI_TEST_CHILD is set) ----

enum ChildExit : int {
  kChildOk = 0,
  kChildAttachFailed = 10,
  kChildNoAllocator = 11,
  kChildUnresolved = 12,
  kChildBadBytes = 13,
  kChildAllocFailed = 14,
  kChildUnknownRole = 15,
  kChildStressErrors = 16,
};

/** Attaches, checks the parent's bytes through the registry, allocates and writes a reply. */
int ChildVerifyBytes() {
  // Occupy the parent's address first so our mapping surely lands elsewhere.
  const u64 parent_base = std::strtoull(std::getenv("CHI_TEST_PARENT_BASE"), nullptr, 10);
  mmap(reinterpret_cast<void *>(parent_base), 1 << 20, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  PosixShmBackend backend;
  Status st = backend.Attach(std::getenv("CHI_TEST_SEGMENT"));
  if (!st.ok()) {
    std::fprintf(stderr, "child: %s\n", st.ToString().c_str());
    return kChildAttachFailed;
  }
  SizeClassAllocator *alloc = nullptr;
  if (!chi::AttachAllocator(backend, &alloc).ok()) return kChildNoAllocator;
  FullPtr<Handshake> hs(PtrFromText(std::getenv("CHI_TEST_PTR")).Cast<Handshake>());
  if (hs.IsNull()) return kChildUnresolved;
  FullPtr<u8> data(hs->data_);
  if (data.IsNull()) return kChildUnresolved;
  for (u64 i = 0; i < hs->len_; ++i) {
    if (data.ptr_[i] != PatternByte(i)) return kChildBadBytes;
  }
  FullPtr<void> reply = alloc->AllocateFull(64);
  if (reply.IsNull()) return kChildAllocFailed;
  std::snprintf(static_cast<char *>(reply.ptr_), 64, "child saw %" PRIu64 " bytes", hs->len_);
  hs->reply_ = reply.shm_.Cast<char>();
  hs->child_base_ = reinterpret_cast<u64>(backend.Base());
  hs->verdict_.Store(kVerdictOk, chi::MemOrder::kRelease);  // publishes reply_ and child_base_
  return kChildOk;
}

/** The child half of the two-process allocator stress. */
int ChildStress() {
  PosixShmBackend backend;
  if (!backend.Attach(std::getenv("CHI_TEST_SEGMENT")).ok()) return kChildAttachFailed;
  SizeClassAllocator *alloc = nullptr;
  if (!chi::AttachAllocator(backend, &alloc).ok()) return kChildNoAllocator;
  FullPtr<StressControl> ctl(PtrFromText(std::getenv("CHI_TEST_PTR")).Cast<StressControl>());
  if (ctl.IsNull()) return kChildUnresolved;
  ctl->child_attached_.Store(1);
  StressWorker(alloc, ctl.ptr_, 1, 0xC0FFEE);
  return ctl->errors_[1].Load() == 0 ? kChildOk : kChildStressErrors;
}

/** Runs before doctest's main in a re-executed copy and never returns there. */
struct ChildDispatch {
  ChildDispatch() {
    const char *role = std::getenv("CHI_TEST_CHILD");
    if (role == nullptr) return;
    int rc = kChildUnknownRole;
    if (std::strcmp(role, "verify_bytes") == 0) rc = ChildVerifyBytes();
    if (std::strcmp(role, "stress") == 0) rc = ChildStress();
    _exit(rc);
  }
} g_child_dispatch;

}  // namespace

// ---- Offset pointers and the registry ----

TEST_CASE("ShmPtr and AllocatorId are plain data that serialize as three numbers") {
  static_assert(std::is_trivially_copyable_v<ShmPtr<int>>);
  static_assert(std::is_standard_layout_v<ShmPtr<int>>);
  static_assert(sizeof(ShmPtr<int>) == 16);
  static_assert(std::is_trivially_copyable_v<FullPtr<int>>);
  struct Collect {
    std::vector<u64> values;
    void operator()(u32 a, u32 b, u64 c) { values = {a, b, c}; }
  };
  ShmPtr<int> p(AllocatorId(7, 9), 4096 + 48);
  Collect ar;
  p.serialize(ar);
  CHECK(ar.values == std::vector<u64>{7, 9, 4096 + 48});
  CHECK(ShmPtr<int>().IsNull());
  CHECK(ShmPtr<int>::GetNull().IsNull());
  CHECK_FALSE(p.IsNull());
  CHECK(p.Cast<char>().off_ == p.off_);
}

TEST_CASE("resolving an unknown allocator or an offset past its segment gives null") {
  MemoryRegistry &reg = MemoryRegistry::Get();
  CHECK(reg.Resolve(ShmPtr<int>(AllocatorId(0xdead, 0xbeef), 64)) == nullptr);
  CHECK(reg.Resolve(ShmPtr<int>::GetNull()) == nullptr);
  MallocBackend backend;
  REQUIRE(backend.Create("registry", 1 << 16).ok());
  const AllocatorId id(0xdead, 1);
  REQUIRE(reg.Register(id, backend.Base(), backend.Size()).ok());
  CHECK(reg.Resolve(ShmPtr<char>(id, 100)) == backend.Base() + 100);
  CHECK(reg.Resolve(ShmPtr<char>(id, backend.Size())) == nullptr);
  CHECK(FullPtr<char>(ShmPtr<char>(id, backend.Size() + 1)).IsNull());
  CHECK(FullPtr<char>(reinterpret_cast<char *>(&reg)).IsNull());  // not in any segment
  CHECK_FALSE(reg.Register(AllocatorId::GetNull(), backend.Base(), 64).ok());
  reg.Unregister(id);
  CHECK(reg.Resolve(ShmPtr<char>(id, 100)) == nullptr);
}

TEST_CASE("FullPtr converts between ShmPtr and local pointer in both directions") {
  MallocBackend backend;
  REQUIRE(backend.Create("fullptr", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(50, 1), &alloc).ok());
  FullPtr<void> block = alloc->AllocateFull(256);
  REQUIRE_FALSE(block.IsNull());
  FullPtr<u64> typed = block.Cast<u64>();
  *typed = 0x1234;
  FullPtr<u64> from_shm(typed.shm_);
  CHECK(from_shm.ptr_ == typed.ptr_);
  CHECK(*from_shm == 0x1234);
  FullPtr<u64> from_raw(typed.ptr_ + 3);
  CHECK(from_raw.shm_.alloc_id_ == AllocatorId(50, 1));
  CHECK(from_raw.shm_.off_ == typed.shm_.off_ + 3 * sizeof(u64));
  CHECK(alloc->ToShmPtr(typed.ptr_) == typed.shm_);
  CHECK(alloc->Free(block.shm_));
  backend.Detach();  // forgets the allocators inside: their pointers stop resolving
  CHECK(FullPtr<u64>(typed.shm_).IsNull());
}

// ---- Backends ----

TEST_CASE("two processes share a segment: the child reads the parent's bytes and answers") {
  const std::string name = UniqueName("share");
  SegmentGuard guard{name};
  PosixShmBackend backend;
  REQUIRE(backend.Create(name, 4 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(100, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();

  FullPtr<Handshake> hs = alloc->New<Handshake>();
  REQUIRE_FALSE(hs.IsNull());
  hs->len_ = 100000;
  FullPtr<void> data = alloc->AllocateFull(hs->len_);
  REQUIRE_FALSE(data.IsNull());
  for (u64 i = 0; i < hs->len_; ++i) static_cast<u8 *>(data.ptr_)[i] = PatternByte(i);
  hs->data_ = data.shm_.Cast<u8>();
  hs->parent_base_ = reinterpret_cast<u64>(backend.Base());

  pid_t pid = SpawnChild("verify_bytes",
                         {"CHI_TEST_SEGMENT=" + name,
                          "CHI_TEST_PTR=" + PtrToText(hs.shm_.Cast<void>()),
                          "CHI_TEST_PARENT_BASE=" + std::to_string(hs->parent_base_)});
  REQUIRE(pid > 0);
  CHECK(WaitChild(pid) == kChildOk);
  REQUIRE(hs->verdict_.Load(chi::MemOrder::kAcquire) == kVerdictOk);  // pairs with the child
  CHECK(hs->child_base_ != hs->parent_base_);  // offsets, not addresses, crossed over
  FullPtr<char> reply(hs->reply_);
  REQUIRE_FALSE(reply.IsNull());
  CHECK(std::string(reply.ptr_) == "child saw 100000 bytes");
  CHECK(alloc->Free(hs->reply_));  // allocated by the child, freed by the parent
  CHECK(alloc->Free(data.shm_));
  CHECK(alloc->Delete(hs));
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(backend.Destroy().ok());
}

TEST_CASE("creating over an existing segment fails unless replacing is asked for") {
  const std::string name = UniqueName("exists");
  SegmentGuard guard{name};
  PosixShmBackend first;
  REQUIRE(first.Create(name, 1 << 16).ok());
  first.Header()->version_ = 0;  // mark the old one so a replacement is recognisable
  PosixShmBackend second;
  Status st = second.Create(name, 1 << 16);
  CHECK(st.code() == ErrorCode::kAlreadyExists);
  CHECK(std::string(st.message()).find(name) != std::string::npos);
  CHECK_FALSE(second.IsAttached());
  REQUIRE(second.Create(name, 1 << 16, chi::CreateMode::kReplace).ok());
  PosixShmBackend third;
  REQUIRE(third.Attach(name).ok());
  CHECK(third.Header()->version_ == chi::kBackendVersion);  // the new segment, not the old
  CHECK(second.Destroy().ok());
  CHECK(PosixShmBackend::DestroyByName(name).code() == ErrorCode::kNotFound);
}

TEST_CASE("attaching a missing segment fails with kNotFound and leaves nothing open") {
  const std::string name = UniqueName("missing");
  const int fds_before = CountOpenFds();
  PosixShmBackend backend;
  Status st = backend.Attach(name);
  CHECK(st.code() == ErrorCode::kNotFound);
  CHECK(std::string(st.message()).find(name) != std::string::npos);
  CHECK_FALSE(backend.IsAttached());
  CHECK(CountOpenFds() == fds_before);
  CHECK(backend.Attach("bad/name").code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("attaching a segment with a wrong version or magic fails and maps nothing") {
  const std::string name = UniqueName("version");
  SegmentGuard guard{name};
  {
    PosixShmBackend creator;
    REQUIRE(creator.Create(name, 1 << 16).ok());
    creator.Header()->version_ = chi::kBackendVersion + 1;
  }
  CHECK_FALSE(IsMapped(name));
  const int fds_before = CountOpenFds();
  PosixShmBackend backend;
  Status st = backend.Attach(name);
  CHECK(st.code() == ErrorCode::kVersionMismatch);
  CHECK(std::string(st.message()).find(name) != std::string::npos);
  CHECK_FALSE(backend.IsAttached());
  CHECK_FALSE(IsMapped(name));
  CHECK(CountOpenFds() == fds_before);
  {
    // Not a chi segment at all: someone else's bytes under our name.
    int fd = shm_open(PosixShmBackend::OsName(name).c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    u64 junk = 0x1122334455667788ull;
    CHECK(pwrite(fd, &junk, sizeof(junk), 0) == sizeof(junk));
    close(fd);
  }
  st = backend.Attach(name);
  CHECK(st.code() == ErrorCode::kVersionMismatch);
  CHECK(std::string(st.message()).find("magic") != std::string::npos);
  CHECK_FALSE(IsMapped(name));
  CHECK(CountOpenFds() == fds_before);
}

TEST_CASE("attaching a segment whose file size differs from its header fails and maps nothing") {
  const std::string name = UniqueName("size");
  SegmentGuard guard{name};
  u64 size = 0;
  {
    PosixShmBackend creator;
    REQUIRE(creator.Create(name, 1 << 16).ok());
    size = creator.Size();
  }
  const std::string os_name = PosixShmBackend::OsName(name);
  const int fds_before = CountOpenFds();
  PosixShmBackend backend;
  for (u64 new_size : {size + 4096, size - 4096, u64{100}}) {
    CAPTURE(new_size);
    int fd = shm_open(os_name.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(new_size)) == 0);
    close(fd);
    Status st = backend.Attach(name);
    CHECK(st.code() == ErrorCode::kSizeMismatch);
    CHECK(std::string(st.message()).find(name) != std::string::npos);
    CHECK_FALSE(backend.IsAttached());
    CHECK_FALSE(IsMapped(name));
    CHECK(CountOpenFds() == fds_before);
  }
  // A segment that exists but was never sized (its creator died early) is not there yet.
  int fd = shm_open(os_name.c_str(), O_RDWR | O_TRUNC, 0);
  REQUIRE(fd >= 0);
  close(fd);
  CHECK(backend.Attach(name).code() == ErrorCode::kNotFound);
  CHECK(CountOpenFds() == fds_before);
}

TEST_CASE("an allocator is found again only with the right kind") {
  const std::string name = UniqueName("kind");
  SegmentGuard guard{name};
  PosixShmBackend creator;
  REQUIRE(creator.Create(name, 1 << 20).ok());
  PosixShmBackend attacher;
  REQUIRE(attacher.Attach(name).ok());
  SizeClassAllocator *general = nullptr;
  CHECK(chi::AttachAllocator(attacher, &general).code() == ErrorCode::kNotFound);
  ArenaAllocator *arena = nullptr;
  REQUIRE(chi::CreateAllocator(creator, AllocatorId(101, 1), &arena).ok());
  Status st = chi::AttachAllocator(attacher, &general);
  CHECK(st.code() == ErrorCode::kVersionMismatch);
  CHECK(general == nullptr);
  ArenaAllocator *arena_there = nullptr;
  REQUIRE(chi::AttachAllocator(attacher, &arena_there).ok());
  CHECK(arena_there->Id() == AllocatorId(101, 1));
}

TEST_CASE("a malloc backend offers the same layout but cannot be attached") {
  MallocBackend backend;
  REQUIRE(backend.Create("private", 12345).ok());
  CHECK(backend.IsAttached());
  CHECK(backend.DataSize() >= 12345);
  CHECK(reinterpret_cast<uintptr_t>(backend.Data()) % 4096 == 0);
  CHECK(backend.Header()->magic_.Load() == chi::kBackendMagic);
  CHECK(backend.Header()->kind_ == chi::BackendKind::kMalloc);
  MallocBackend other;
  CHECK(other.Attach("private").code() == ErrorCode::kUnsupported);
  CHECK(backend.Destroy().ok());
  CHECK_FALSE(backend.IsAttached());
}

// ---- Arena ----

TEST_CASE("the arena bumps with alignment, reports used and free bytes, and resets") {
  MallocBackend backend;
  REQUIRE(backend.Create("arena", 64 << 10).ok());
  ArenaAllocator *arena = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(200, 1), &arena).ok());
  const u64 capacity = arena->Capacity();
  CHECK(arena->UsedBytes() == 0);
  CHECK(arena->FreeBytes() == capacity);
  ShmPtr<void> a = arena->Allocate(10);
  ShmPtr<void> b = arena->Allocate(100, 256);
  REQUIRE_FALSE(a.IsNull());
  REQUIRE_FALSE(b.IsNull());
  CHECK(b.off_ % 256 == 0);
  CHECK(b.off_ >= a.off_ + 10);
  CHECK(arena->UsedBytes() >= 110);
  CHECK(arena->UsedBytes() + arena->FreeBytes() == capacity);
  struct Pair {
    u64 x, y;
    Pair(u64 a, u64 b) : x(a), y(b) {}
  };
  FullPtr<Pair> pair = arena->New<Pair>(3, 4);
  REQUIRE_FALSE(pair.IsNull());
  CHECK(pair->x + pair->y == 7);
  CHECK(arena->Allocate(capacity).IsNull());  // more than is left
  CHECK_FALSE(arena->Allocate(16).IsNull());  // the failed request did not use the rest
  CHECK(arena->Allocate(8, 3).IsNull());      // alignment must be a power of two
  arena->Reset();
  CHECK(arena->UsedBytes() == 0);
  CHECK(arena->Allocate(capacity).off_ == arena->Header().begin_);
  CHECK(arena->FreeBytes() == 0);
  CHECK(arena->Allocate(1).IsNull());
}

// ---- General allocator ----

TEST_CASE("size classes cover every size with at most 25 percent rounding") {
  for (u32 c = 1; c < SizeClassAllocator::kNumClasses; ++c) {
    CHECK(SizeClassAllocator::ClassSize(c) > SizeClassAllocator::ClassSize(c - 1));
    CHECK(SizeClassAllocator::ClassSize(c) % SizeClassAllocator::kUnit == 0);
    CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::ClassSize(c)) == c);
    CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::ClassSize(c - 1) + 1) == c);
  }
  for (u64 n = 33; n < (1u << 20); n = n * 9 / 8 + 1) {
    u64 block = SizeClassAllocator::ClassSize(SizeClassAllocator::SizeToClass(n));
    CHECK(block >= n);
    CHECK(block * 4 <= n * 5 + 3 * 16);
  }
  CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::kMaxBlock + 1) ==
        SizeClassAllocator::kNumClasses);
}

TEST_CASE("allocations are aligned, disjoint, and every free is accounted for") {
  MallocBackend backend;
  REQUIRE(backend.Create("general", 8 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(300, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  CHECK(free_at_start == alloc->Capacity());
  struct Block {
    ShmPtr<void> p;
    u64 size;
  };
  std::vector<Block> blocks;
  u64 rng = 42;
  for (int i = 0; i < 2000; ++i) {
    rng = Mix(rng);
    u64 size = 1 + rng % 3000;
    u64 align = 1ull << (rng >> 60) % 13;  // 1 .. 4096
    ShmPtr<void> p = alloc->Allocate(size, align);
    REQUIRE_FALSE(p.IsNull());
    CHECK(reinterpret_cast<uintptr_t>(alloc->ToPointer(p)) % align == 0);
    std::memset(alloc->ToPointer(p), 0, size);
    if (size >= 16) FillBlock(alloc->ToPointer(p.Cast<u8>()), size, rng);
    blocks.push_back({p, size});
  }
  CHECK(alloc->FreeBytes() < free_at_start);
  CHECK(alloc->AuditFreeBytes() == alloc->FreeBytes());
  for (const Block &b : blocks) {
    if (b.size >= 16) CHECK(CheckBlock(alloc->ToPointer(b.p.Cast<u8>()), b.size));
    CHECK(alloc->Free(b.p));
  }
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("double frees and foreign pointers are refused without damage") {
  MallocBackend backend;
  REQUIRE(backend.Create("refuse", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(301, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  ShmPtr<void> p = alloc->Allocate(100);
  ShmPtr<void> aligned = alloc->Allocate(100, 1024);
  REQUIRE_FALSE(p.IsNull());
  REQUIRE_FALSE(aligned.IsNull());
  CHECK(alloc->Free(p));
  CHECK_FALSE(alloc->Free(p));
  CHECK_FALSE(alloc->Free(ShmPtr<void>(AllocatorId(999, 1), aligned.off_)));
  CHECK_FALSE(alloc->Free(ShmPtr<void>::GetNull()));
  CHECK_FALSE(alloc->Free(ShmPtr<void>(alloc->Id(), 8)));  // inside the header
  CHECK(alloc->Free(aligned));
  CHECK_FALSE(alloc->Free(aligned));
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("New constructs in place and Delete runs the destructor") {
  MallocBackend backend;
  REQUIRE(backend.Create("typed", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(302, 1), &alloc).ok());
  static int destroyed = 0;
  struct alignas(128) Tracked {
    u64 value;
    explicit Tracked(u64 v) : value(v) {}
    ~Tracked() { ++destroyed; }
  };
  const u64 free_at_start = alloc->FreeBytes();
  FullPtr<Tracked> t = alloc->New<Tracked>(77);
  REQUIRE_FALSE(t.IsNull());
  CHECK(t->value == 77);
  CHECK(reinterpret_cast<uintptr_t>(t.ptr_) % 128 == 0);
  CHECK(alloc->Delete(t));
  CHECK(destroyed == 1);
  CHECK(alloc->FreeBytes() == free_at_start);
}

TEST_CASE("out of memory returns a null ShmPtr and the allocator recovers after frees") {
  MallocBackend backend;
  REQUIRE(backend.Create("oom", 256 << 10).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(303, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  CHECK(alloc->Allocate(alloc->Capacity()).IsNull());  // too big: nothing carved
  CHECK(alloc->Allocate(~0ull - 8).IsNull());          // absurd: no overflow
  CHECK(alloc->FreeBytes() == free_at_start);
  std::vector<ShmPtr<void>> blocks;
  while (true) {
    ShmPtr<void> p = alloc->Allocate(4000);
    if (p.IsNull()) break;
    blocks.push_back(p);
    REQUIRE(blocks.size() < 1000);
  }
  CHECK(blocks.size() > 40);
  std::vector<ShmPtr<void>> smalls;  // use up the tail too
  while (true) {
    ShmPtr<void> p = alloc->Allocate(16);
    if (p.IsNull()) break;
    smalls.push_back(p);
    REQUIRE(smalls.size() < 1000);
  }
  CHECK(alloc->Allocate(16).IsNull());
  CHECK(alloc->Allocate(4000).IsNull());
  CHECK(alloc->FreeBytes() < 32);
  CHECK(alloc->AuditFreeBytes() == alloc->FreeBytes());

  CHECK(alloc->Free(blocks.back()));
  blocks.pop_back();
  const u64 free_before_borrow = alloc->FreeBytes();
  ShmPtr<void> small = alloc->Allocate(100);  // no 128-byte block anywhere: borrows the 4 KiB one
  REQUIRE_FALSE(small.IsNull());
  CHECK(free_before_borrow - alloc->FreeBytes() == SizeClassAllocator::ClassSize(
                                                       SizeClassAllocator::SizeToClass(4016)));
  CHECK(alloc->Allocate(4000).IsNull());
  CHECK(alloc->Free(small));
  ShmPtr<void> again = alloc->Allocate(4000);  // the block is back in its own class
  REQUIRE_FALSE(again.IsNull());
  blocks.push_back(again);

  for (ShmPtr<void> p : blocks) CHECK(alloc->Free(p));
  for (ShmPtr<void> p : smalls) CHECK(alloc->Free(p));
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
  CHECK_FALSE(alloc->Allocate(4000).IsNull());
}

TEST_CASE("two threads allocating and freeing each other's blocks leak nothing") {
  MallocBackend backend;
  REQUIRE(backend.Create("threads", kStressSegmentBytes).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(400, 1), &alloc).ok());
  FullPtr<StressControl> ctl = alloc->New<StressControl>();
  REQUIRE_FALSE(ctl.IsNull());
  const u64 free_with_control = alloc->FreeBytes();
  std::thread other([&] { StressWorker(alloc, ctl.ptr_, 1, 0xBEEF); });
  StressWorker(alloc, ctl.ptr_, 0, 0xFACE);
  other.join();
  CHECK(ctl->errors_[0].Load() == 0);
  CHECK(ctl->errors_[1].Load() == 0);
  CHECK(ctl->foreign_frees_[0].Load() > 0);
  CHECK(ctl->foreign_frees_[1].Load() > 0);
  CHECK(alloc->FreeBytes() == free_with_control);
  CHECK(alloc->AuditFreeBytes() == free_with_control);
}

TEST_CASE("more threads than cores churning one size class never share a block") {
  // Every thread pops and pushes on the same free-list head, so CASes fail and retry;
  // a block handed to two threads at once shows up as a broken token.
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 500000;
  MallocBackend backend;
  REQUIRE(backend.Create("hot_class", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(402, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  chi::Atomic<u32> errors;
  auto churn = [&](u64 me) {
    ShmPtr<void> held[3];
    u64 token[3] = {0, 0, 0};
    for (int op = 0; op < kOpsPerThread; ++op) {
      const int slot = op % 3;
      if (!held[slot].IsNull()) {
        u64 *p = alloc->ToPointer(held[slot].Cast<u64>());
        if (p[0] != token[slot] || p[1] != ~token[slot]) errors.FetchAdd(1);
        if (!alloc->Free(held[slot])) errors.FetchAdd(1);
      }
      held[slot] = alloc->Allocate(16);
      if (held[slot].IsNull()) {
        errors.FetchAdd(1);
        continue;
      }
      token[slot] = (me << 32) | static_cast<u64>(op);
      u64 *p = alloc->ToPointer(held[slot].Cast<u64>());
      p[0] = token[slot];
      p[1] = ~token[slot];
    }
    for (ShmPtr<void> h : held) {
      if (!h.IsNull() && !alloc->Free(h)) errors.FetchAdd(1);
    }
  };
  std::vector<std::thread> threads;
  for (u64 t = 0; t < kThreads; ++t) threads.emplace_back(churn, t + 1);
  for (std::thread &t : threads) t.join();
  CHECK(errors.Load() == 0);
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("two processes allocating and freeing each other's blocks leak nothing") {
  const std::string name = UniqueName("stress");
  SegmentGuard guard{name};
  PosixShmBackend backend;
  REQUIRE(backend.Create(name, kStressSegmentBytes).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(401, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  FullPtr<StressControl> ctl = alloc->New<StressControl>();
  REQUIRE_FALSE(ctl.IsNull());
  const u64 free_with_control = alloc->FreeBytes();

  pid_t pid = SpawnChild("stress", {"CHI_TEST_SEGMENT=" + name,
                                    "CHI_TEST_PTR=" + PtrToText(ctl.shm_.Cast<void>())});
  REQUIRE(pid > 0);
  // Once the child has the segment mapped its name is no longer needed: removing it now
  // means even a crash below leaves nothing behind in /dev/shm.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds);
  while (ctl->child_attached_.Load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  CHECK(ctl->child_attached_.Load() == 1);
  CHECK(PosixShmBackend::DestroyByName(name).ok());
  StressWorker(alloc, ctl.ptr_, 0, 0xFACE);
  CHECK(WaitChild(pid) == kChildOk);
  CHECK(ctl->errors_[0].Load() == 0);
  CHECK(ctl->errors_[1].Load() == 0);
  CHECK(ctl->allocs_[1].Load() > kStressOps / 4);
  CHECK(ctl->foreign_frees_[0].Load() > 0);  // blocks the child allocated, freed here
  CHECK(ctl->foreign_frees_[1].Load() > 0);  // and the other way round
  CHECK(alloc->FreeBytes() == free_with_control);
  CHECK(alloc->AuditFreeBytes() == free_with_control);
  CHECK(alloc->Delete(ctl));
  CHECK(alloc->FreeBytes() == free_at_start);
}
