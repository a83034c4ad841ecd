// Shared-memory layer: offset pointers and the registry, the POSIX and malloc backends
// (including two real processes sharing one segment), finding an allocator again by its
// kind, and the arena. The general size-class allocator is in
// test_shm_size_class_allocator.cc; the child-process plumbing in shm_memory_fixture.h.
#include <doctest/doctest.h>

#include <dirent.h>    // counting /proc/self/fd
#include <fcntl.h>     // shm_open flags
#include <sys/mman.h>  // shm_open, mmap
#include <unistd.h>    // pwrite, ftruncate, close

#include <cinttypes>    // PRIu64 in the child's reply
#include <cstdio>       // snprintf, fprintf in child routines
#include <cstdlib>      // getenv, strtoull
#include <fstream>      // /proc/self/maps
#include <string>       // names
#include <type_traits>  // POD checks
#include <vector>       // serialized values

#include "shm_memory_fixture.h"

using namespace shm_memory_test;

namespace {

// ---- Helpers ----

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
/** The byte the parent writes at offset i of the block and the child expects there. */
constexpr u8 PatternByte(u64 i) { return static_cast<u8>(i * 7 + 3); }

// ---- Child routines (run instead of doctest when CHI_TEST_CHILD is set) ----

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

const chi_test::ChildRoutine kVerifyBytesChild("verify_bytes", ChildVerifyBytes);

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
                         {{"CHI_TEST_SEGMENT", name},
                          {"CHI_TEST_PTR", PtrToText(hs.shm_.Cast<void>())},
                          {"CHI_TEST_PARENT_BASE", std::to_string(hs->parent_base_)}});
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
