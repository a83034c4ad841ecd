// The CUDA-free parts of cross-process GPU use, on the host: the runtime's cache of client
// IPC handles (with a fake opener: keying, lazy open once, invalidation on address reuse,
// dead-pid drop), cpu2gpu claims shared by processes (pid in the claim word, sequences that
// continue across claimers, a killed claimer reaped once answered), and the handshake's GPU
// blob (round trip, version check, rebasing onto a second mapping of one segment).
#include <doctest/doctest.h>

#include <signal.h>    // raise(SIGKILL): a client killed holding slots
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, getpid

#include <chi/gpu/gpu_connect_info.h>
#include <chi/gpu/gpu_ipc_cache.h>
#include <chi/gpu/host_slots.h>
#include <chi/gpu/queue_set.h>
#include <chi/memory/posix_shm_backend.h>
#include <chi/transport/client_connect.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using chi::u32;
using chi::u64;
using chi::gpu::IpcHandleBytes;
using chi::gpu::MemoryRegistration;
using chi::gpu::MemoryType;

/** What the fake opener did (shared by the opener copies the cache holds). */
struct FakeDriver {
  std::map<u64, std::vector<char>> allocations;  ///< handle word 0 -> the allocation's bytes
  u32 opens = 0;
  u32 closes = 0;
  std::vector<void *> open_bases;
};

/** Opens "handles" by looking up the allocation that handle word 0 names. */
struct FakeOpener {
  FakeDriver *d;
  chi::Status Open(u32, const IpcHandleBytes &h, void **base) const {
    auto it = d->allocations.find(h.words[0]);
    if (it == d->allocations.end()) return chi::Status::Error(chi::ErrorCode::kIo, "bad handle");
    ++d->opens;
    *base = it->second.data();
    d->open_bases.push_back(*base);
    return chi::Status::Ok();
  }
  void Close(u32, void *base) const {
    ++d->closes;
    for (size_t i = 0; i < d->open_bases.size(); ++i) {
      if (d->open_bases[i] == base) {
        d->open_bases.erase(d->open_bases.begin() + static_cast<long>(i));
        break;
      }
    }
  }
  chi::Status CopyToHost(u32, void *dst, const void *src, u64 n) const {
    std::memcpy(dst, src, n);
    return chi::Status::Ok();
  }
};

constexpr u32 kRuntimePid = 1000;
constexpr u32 kClientPid = 2000;

/** A device registration of client pid: `bytes` at `address`, inside allocation `handle`. */
MemoryRegistration DeviceReg(u32 pid, u64 address, u64 bytes, u64 handle, u64 alloc_offset = 0) {
  MemoryRegistration r;
  r.pid = pid;
  r.type = MemoryType::kGpuDeviceMemory;
  r.device = 0;
  r.address = address;
  r.bytes = bytes;
  r.alloc_offset = alloc_offset;
  r.handle.words[0] = handle;
  return r;
}

/** A driver with allocation `handle` of `bytes` bytes, byte i = (i + seed) % 251. */
void AddAllocation(FakeDriver *d, u64 handle, u64 bytes, u32 seed) {
  std::vector<char> &a = d->allocations[handle];
  a.resize(bytes);
  for (u64 i = 0; i < bytes; ++i) a[i] = static_cast<char>((i + seed) % 251);
}

}  // namespace

TEST_CASE("a client's device memory is opened lazily, once, and shared by one allocation's ranges") {
  FakeDriver d;
  AddAllocation(&d, 7, 4096, 0);
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, kRuntimePid);
  REQUIRE(cache.Register(DeviceReg(kClientPid, 0x10000, 1024, 7)).ok());
  REQUIRE(cache.Register(DeviceReg(kClientPid, 0x10000 + 2048, 1024, 7, 2048)).ok());
  CHECK(d.opens == 0);  // nothing opened at registration
  void *a = nullptr;
  void *b = nullptr;
  REQUIRE(cache.Translate(kClientPid, 0x10000 + 16, 8, &a).ok());
  REQUIRE(cache.Translate(kClientPid, 0x10000 + 2048, 1024, &b).ok());
  CHECK(d.opens == 1);
  CHECK(cache.OpenMappings() == 1);
  CHECK(a == d.allocations[7].data() + 16);
  CHECK(b == d.allocations[7].data() + 2048);
  std::vector<char> out;
  REQUIRE(cache.Read(kClientPid, 0x10000 + 2048, 4, &out).ok());
  CHECK(out[0] == static_cast<char>(2048 % 251));
  CHECK(d.opens == 1);
}

TEST_CASE("registering another allocation at a reused address closes the old mapping") {
  FakeDriver d;
  AddAllocation(&d, 1, 4096, 0);
  AddAllocation(&d, 2, 4096, 100);
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, kRuntimePid);
  REQUIRE(cache.Register(DeviceReg(kClientPid, 0x20000, 4096, 1)).ok());
  void *p = nullptr;
  REQUIRE(cache.Translate(kClientPid, 0x20000, 4096, &p).ok());
  CHECK(p == d.allocations[1].data());
  SUBCASE("the same registration again keeps the mapping") {
    REQUIRE(cache.Register(DeviceReg(kClientPid, 0x20000, 4096, 1)).ok());
    REQUIRE(cache.Translate(kClientPid, 0x20000, 4096, &p).ok());
    CHECK(d.opens == 1);
    CHECK(d.closes == 0);
  }
  SUBCASE("a different handle at the same address replaces it") {
    REQUIRE(cache.Register(DeviceReg(kClientPid, 0x20000, 4096, 2)).ok());
    CHECK(d.closes == 1);
    REQUIRE(cache.Translate(kClientPid, 0x20000, 4096, &p).ok());
    CHECK(p == d.allocations[2].data());
    CHECK(d.opens == 2);
    CHECK(cache.Regions() == 1);
  }
  SUBCASE("an overlapping range at another address replaces it too") {
    REQUIRE(cache.Register(DeviceReg(kClientPid, 0x20000 + 1024, 4096, 2)).ok());
    CHECK(d.closes == 1);
    CHECK(cache.Translate(kClientPid, 0x20000, 16, &p).code() == chi::ErrorCode::kNotFound);
  }
  SUBCASE("another client's registration at the same address is separate") {
    REQUIRE(cache.Register(DeviceReg(kClientPid + 1, 0x20000, 4096, 2)).ok());
    CHECK(d.closes == 0);
    CHECK(cache.Regions() == 2);
  }
}

TEST_CASE("a dead client's registrations and mappings are dropped") {
  FakeDriver d;
  AddAllocation(&d, 1, 4096, 0);
  AddAllocation(&d, 2, 4096, 0);
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, kRuntimePid);
  REQUIRE(cache.Register(DeviceReg(kClientPid, 0x1000, 4096, 1)).ok());
  REQUIRE(cache.Register(DeviceReg(kClientPid + 1, 0x1000, 4096, 2)).ok());
  void *p = nullptr;
  REQUIRE(cache.Translate(kClientPid, 0x1000, 8, &p).ok());
  REQUIRE(cache.Translate(kClientPid + 1, 0x1000, 8, &p).ok());
  const u32 dropped = cache.DropDead([](u32 pid) { return pid != kClientPid; });
  CHECK(dropped == 1);
  CHECK(d.closes == 1);
  CHECK(cache.Regions() == 1);
  CHECK(cache.Translate(kClientPid, 0x1000, 8, &p).code() == chi::ErrorCode::kNotFound);
  CHECK(cache.Translate(kClientPid + 1, 0x1000, 8, &p).ok());
  cache.Clear();
  CHECK(d.open_bases.empty());
}

TEST_CASE("bad registrations and translations get clear errors") {
  FakeDriver d;
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, kRuntimePid);
  CHECK(cache.Register(DeviceReg(kClientPid, 0, 16, 1)).code() == chi::ErrorCode::kInvalidArgument);
  CHECK(cache.Register(DeviceReg(kClientPid, 0x1000, 0, 1)).code() ==
        chi::ErrorCode::kInvalidArgument);
  CHECK(cache.Register(DeviceReg(kClientPid, ~0ull - 4, 16, 1)).code() ==
        chi::ErrorCode::kInvalidArgument);
  MemoryRegistration host = DeviceReg(kClientPid, 0x1000, 16, 0);
  host.type = MemoryType::kCpuMemory;
  REQUIRE(cache.Register(host).ok());  // another process's heap: recorded, only ever copied
  void *mapped = &host;
  CHECK(cache.Translate(kClientPid, 0x1000, 16, &mapped).code() == chi::ErrorCode::kUnsupported);
  CHECK(mapped == nullptr);  // no pointer of the runtime's reaches another process's heap
  REQUIRE(cache.Register(DeviceReg(kClientPid, 0x1000, 16, 9)).ok());
  void *p = nullptr;
  CHECK(cache.Translate(kClientPid, 0x1000, 17, &p).code() == chi::ErrorCode::kNotFound);
  CHECK(cache.Translate(kClientPid, 0x0fff, 2, &p).code() == chi::ErrorCode::kNotFound);
  CHECK(cache.Translate(kClientPid, 0x1000, 16, &p).code() == chi::ErrorCode::kIo);  // no such handle
}

TEST_CASE("the runtime's own host memory translates to itself and reads back") {
  FakeDriver d;
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, kRuntimePid);
  std::vector<char> mine(64, 'x');
  MemoryRegistration r;
  r.pid = kRuntimePid;
  r.type = MemoryType::kPinnedHostMemory;
  r.address = reinterpret_cast<u64>(mine.data());
  r.bytes = mine.size();
  REQUIRE(cache.Register(r).ok());
  std::vector<char> out;
  REQUIRE(cache.Read(kRuntimePid, r.address + 8, 8, &out).ok());
  CHECK(std::string(out.begin(), out.end()) == "xxxxxxxx");
  CHECK(d.opens == 0);
}

TEST_CASE("another process's host memory is copied by the kernel, only inside its range") {
  // The buffer has the same address in the forked child, which fills it with its own bytes.
  std::vector<char> buf(8192, 'p');
  int ready[2], done[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(done) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::memset(buf.data(), 'c', buf.size());
    char b = 1;
    if (write(ready[1], &b, 1) != 1) _exit(1);
    if (read(done[0], &b, 1) != 1) _exit(1);  // keep the memory until the parent has read it
    _exit(0);
  }
  char b = 0;
  REQUIRE(read(ready[0], &b, 1) == 1);
  FakeDriver d;
  chi::gpu::GpuIpcCache<FakeOpener> cache(FakeOpener{&d}, static_cast<u32>(getpid()));
  MemoryRegistration r;
  r.pid = static_cast<u32>(child);
  r.type = MemoryType::kCpuMemory;
  r.address = reinterpret_cast<u64>(buf.data()) + 4096;
  r.bytes = 1024;
  REQUIRE(cache.Register(r).ok());
  std::vector<char> out;
  REQUIRE(cache.Read(r.pid, r.address + 16, 64, &out).ok());
  CHECK(std::string(out.begin(), out.end()) == std::string(64, 'c'));  // the child's, not ours
  CHECK(cache.Read(r.pid, r.address - 1, 8, &out).code() == chi::ErrorCode::kNotFound);
  CHECK(cache.Read(r.pid, r.address + 1000, 64, &out).code() == chi::ErrorCode::kNotFound);
  CHECK(cache.Read(r.pid + 1, r.address, 8, &out).code() == chi::ErrorCode::kNotFound);
  b = 1;
  REQUIRE(write(done[1], &b, 1) == 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WEXITSTATUS(status) == 0);
  // Gone: the kernel refuses, and the error names the process.
  const chi::Status gone = cache.Read(r.pid, r.address, 8, &out);
  CHECK(gone.code() == chi::ErrorCode::kPermissionDenied);
  CHECK(std::string(gone.message()).find(std::to_string(child)) != std::string::npos);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

namespace {

/** One cpu2gpu queue carved in plain zeroed memory. */
struct PlainQueue {
  std::vector<char> pinned, device;
  chi::gpu::GpuQueueSet set;
  PlainQueue() {
    chi::gpu::GpuQueueConfig qc;
    qc.server_threads = 2;
    qc.depth = 4;
    pinned.assign(chi::gpu::GpuQueueSet::PinnedBytes(qc) + 64, 0);
    device.assign(chi::gpu::GpuQueueSet::DeviceBytes(qc) + 64, 0);
    set = chi::gpu::GpuQueueSet::Carve(qc, Align(pinned.data()), Align(device.data()));
  }
  static char *Align(char *p) {
    return reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
  }
  const chi::gpu::HostQueue &Q() const { return set.host.cpu2gpu; }
  /** Plays the GPU: answers slot s's pending request. */
  void Serve(u32 s) const {
    const u64 w = Q().PeekRequest(s);
    Q().served_[s] = static_cast<u32>(w);
    Q().Answer(s, static_cast<u32>(w), 0);
  }
};

}  // namespace

TEST_CASE("cpu2gpu claims hold the claimer's pid and sequences continue across claimers") {
  PlainQueue pq;
  const auto &q = pq.Q();
  const u32 a = chi::gpu::ClaimHostSlot(q, 0, 111);
  REQUIRE(a == 0);
  CHECK(chi::gpu::HostSlotOwner(q, 0) == 111);
  CHECK(chi::gpu::ClaimHostSlot(q, 0, 222) == 1);  // slot 0 is taken: the next one
  u32 seq = chi::gpu::NextHostSeq(q, 0);
  CHECK(seq == 1);
  q.Post(0, seq, 0);
  pq.Serve(0);
  u32 len = 0;
  CHECK(q.Answered(0, seq, &len));
  chi::gpu::ReleaseHostSlot(q, 0);
  // Another process takes slot 0: its first request must differ from the served sequence.
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, 333) == 0);
  CHECK(chi::gpu::NextHostSeq(q, 0) == 2);
  CHECK(chi::gpu::CountHeldHostSlots(q) == 2);
  for (u32 s = 2; s < q.num_slots_; ++s) CHECK(chi::gpu::ClaimHostSlot(q, 0, 444) == s);
  CHECK(chi::gpu::ClaimHostSlot(q, 0, 444) == chi::gpu::kNoSlot);
}

TEST_CASE("a dead claimer's slot is freed only once its request is answered") {
  PlainQueue pq;
  const auto &q = pq.Q();
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, 500) == 0);   // dead, posted
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, 600) == 1);   // dead, never posted
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, 700) == 2);   // alive
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, 42) == 3);    // the runtime itself
  q.Post(0, chi::gpu::NextHostSeq(q, 0), 0);
  auto alive = [](u32 pid) { return pid == 700; };
  CHECK(chi::gpu::ReapDeadHostClaims(q, 42, alive) == 1);  // slot 1 only
  CHECK(chi::gpu::HostSlotOwner(q, 0) == 500);
  CHECK(chi::gpu::HostSlotOwner(q, 1) == 0);
  pq.Serve(0);
  CHECK(chi::gpu::ReapDeadHostClaims(q, 42, alive) == 1);  // now slot 0
  CHECK(chi::gpu::HostSlotOwner(q, 0) == 0);
  CHECK(chi::gpu::HostSlotOwner(q, 2) == 700);
  CHECK(chi::gpu::HostSlotOwner(q, 3) == 42);
}

TEST_CASE("the GPU connect blob round-trips and is refused in another version") {
  PlainQueue pq;
  chi::gpu::GpuConnectInfo info;
  info.runtime_pid = 77;
  chi::gpu::GpuQueueAttachInfo g = chi::gpu::DescribeCpu2Gpu(0, pq.Q(), PlainQueue::Align(pq.pinned.data()));
  g.segment = "seg";
  g.segment_size = pq.pinned.size();
  info.gpus.push_back(g);
  const std::vector<char> blob = chi::gpu::EncodeGpuConnectInfo(info);
  chi::gpu::GpuConnectInfo back;
  REQUIRE(chi::gpu::DecodeGpuConnectInfo(blob, &back).ok());
  REQUIRE(back.gpus.size() == 1);
  CHECK(back.runtime_pid == 77);
  CHECK(back.gpus[0].segment == "seg");
  CHECK(back.gpus[0].cpu2gpu_slots == pq.Q().num_slots_);
  CHECK(back.gpus[0].claims_off == g.claims_off);
  CHECK(chi::gpu::DecodeGpuConnectInfo({}, &back).ok());
  CHECK(back.gpus.empty());
  std::vector<char> other = blob;
  other[0] = static_cast<char>(other[0] + 1);  // the version is the first field
  CHECK(chi::gpu::DecodeGpuConnectInfo(other, &back).code() == chi::ErrorCode::kVersionMismatch);
  chi::gpu::GpuQueue<chi::MemScope::kSystem> q;
  CHECK(chi::gpu::RebaseCpu2Gpu(g, pq.pinned.data(), 256, &q).code() ==
        chi::ErrorCode::kMalformed);  // arrays past a too-small segment
}

TEST_CASE("a GPU connect blob with sizes past this build's maxima is refused before any use") {
  PlainQueue pq;
  const chi::gpu::GpuQueueAttachInfo good =
      chi::gpu::DescribeCpu2Gpu(0, pq.Q(), PlainQueue::Align(pq.pinned.data()));
  auto decode = [](const chi::gpu::GpuQueueAttachInfo &g) {
    chi::gpu::GpuConnectInfo info;
    info.gpus.push_back(g);
    chi::gpu::GpuConnectInfo back;
    const chi::Status st = chi::gpu::DecodeGpuConnectInfo(chi::gpu::EncodeGpuConnectInfo(info), &back);
    if (!st.ok()) CHECK(back.gpus.empty());  // nothing half-decoded is handed on
    return st;
  };
  REQUIRE(decode(good).ok());
  struct Case {
    const char *what;
    u32 slots;
    u32 payload;
  };
  const Case cases[] = {
      {"payloads larger than the client's answer buffers", good.cpu2gpu_slots,
       chi::gpu::kGpuPayloadBytes + 16},
      // 4294967281 slots of 4294967232 bytes: their region's size wraps past 2^64.
      {"a slot count and payload whose region size wraps", 4294967281u, 4294967232u},
      {"more slots than a queue can have", chi::gpu::kMaxGpuQueueSlots + 1, 64},
      {"no slots", 0, 64},
      {"a payload that is no multiple of 16", good.cpu2gpu_slots, 100},
  };
  for (const Case &c : cases) {
    CAPTURE(c.what);
    chi::gpu::GpuQueueAttachInfo bad = good;
    bad.cpu2gpu_slots = c.slots;
    bad.payload_bytes = c.payload;
    const chi::Status st = decode(bad);
    CHECK(st.code() == chi::ErrorCode::kMalformed);
    CHECK(std::string(st.message()).find("GPU 0") != std::string::npos);
    chi::gpu::GpuQueue<chi::MemScope::kSystem> q;
    // Rebasing checks the same, whoever decoded the description.
    CHECK(chi::gpu::RebaseCpu2Gpu(bad, pq.pinned.data(), pq.pinned.size(), &q).code() ==
          chi::ErrorCode::kMalformed);
  }
  chi::gpu::GpuQueueAttachInfo counts = good;
  counts.gpu2cpu_slots = ~0u;  // informational fields are bounded too
  CHECK(decode(counts).code() == chi::ErrorCode::kMalformed);
}

TEST_CASE("a client process killed holding cpu2gpu slots loses them to the reaper") {
  const std::string name = "gpux_test_" + std::to_string(getpid());
  chi::PosixShmBackend runtime_seg;
  chi::gpu::GpuQueueConfig qc;
  qc.server_threads = 2;
  qc.depth = 4;
  REQUIRE(runtime_seg.Create(name, chi::gpu::GpuQueueSet::PinnedBytes(qc),
                             chi::CreateMode::kReplace).ok());
  std::vector<char> device(chi::gpu::GpuQueueSet::DeviceBytes(qc) + 64, 0);
  const chi::gpu::GpuQueueSet set =
      chi::gpu::GpuQueueSet::Carve(qc, runtime_seg.Data(), PlainQueue::Align(device.data()));
  chi::gpu::GpuConnectInfo info;
  chi::gpu::GpuQueueAttachInfo g = chi::gpu::DescribeCpu2Gpu(0, set.host.cpu2gpu, runtime_seg.Data());
  g.segment = name;
  g.segment_size = runtime_seg.Size();
  info.gpus.push_back(g);
  const std::vector<char> blob = chi::gpu::EncodeGpuConnectInfo(info);

  const pid_t child = fork();
  if (child == 0) {  // the client: its own mapping of the segment, rebased from the blob
    chi::gpu::GpuConnectInfo got;
    chi::PosixShmBackend mine;
    chi::gpu::GpuQueue<chi::MemScope::kSystem> q;
    if (!chi::gpu::DecodeGpuConnectInfo(blob, &got).ok() || got.gpus.size() != 1 ||
        !mine.Attach(got.gpus[0].segment).ok() ||
        !chi::gpu::RebaseCpu2Gpu(got.gpus[0], mine.Data(), mine.DataSize(), &q).ok()) {
      _exit(2);
    }
    const u32 me = static_cast<u32>(getpid());
    if (chi::gpu::ClaimHostSlot(q, 0, me) != 0 || chi::gpu::ClaimHostSlot(q, 0, me) != 1) _exit(3);
    q.Post(0, chi::gpu::NextHostSeq(q, 0), 0);  // slot 0 waits for an answer; slot 1 does not
    raise(SIGKILL);
    _exit(4);
  }
  REQUIRE(child > 0);
  int status = 0;
  pid_t r = 0;
  for (int i = 0; i < 5000 && r == 0; ++i) {  // bounded: 10 s
    r = waitpid(child, &status, WNOHANG);
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (r == 0) kill(child, SIGKILL), waitpid(child, &status, 0);
  REQUIRE(r == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  const auto &q = set.host.cpu2gpu;
  CHECK(chi::gpu::HostSlotOwner(q, 0) == static_cast<u32>(child));  // the claim is shared
  CHECK(chi::gpu::HostSlotOwner(q, 1) == static_cast<u32>(child));
  const u32 self = static_cast<u32>(getpid());
  auto alive = [](u32 pid) { return chi::ProcessAlive(pid); };
  CHECK(chi::gpu::ReapDeadHostClaims(q, self, alive) == 1);  // slot 1: never posted
  const u64 w = q.PeekRequest(0);
  q.served_[0] = static_cast<u32>(w);
  q.Answer(0, static_cast<u32>(w), 0);                        // the "GPU" answers slot 0
  CHECK(chi::gpu::ReapDeadHostClaims(q, self, alive) == 1);
  CHECK(chi::gpu::CountHeldHostSlots(q) == 0);
  REQUIRE(chi::gpu::ClaimHostSlot(q, 0, self) == 0);  // usable again, sequence continues
  CHECK(chi::gpu::NextHostSeq(q, 0) == static_cast<u32>(w) + 1);
  runtime_seg.Destroy();
}
