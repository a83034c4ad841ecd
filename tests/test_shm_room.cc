// A runtime starts only when /dev/shm can back its segments: tmpfs hands out pages as they
// are first written, so segments larger than the free space used to map fine and then kill
// whoever wrote the page that did not fit (SIGBUS). The start is refused with a message that
// names the keys and the free space, leaves nothing behind, and the port serves afterwards;
// in a 16 MiB /dev/shm (a container's) the default sizes are refused, sizes that fit carry
// large messages, a client that finds /dev/shm filled since is refused, and one whose
// /dev/shm fills after it connected gets its large messages through the rings. A data
// region's writer has only the pages its blocks reach backed, a prefix that doubles.
#include <sched.h>        // unshare: a mount namespace of the test's own
#include <sys/mount.h>    // a small tmpfs over /dev/shm in that namespace
#include <sys/statvfs.h>  // the free space the refusal is measured against

#include <cstdio>   // the file that fills /dev/shm
#include <cstring>  // memset of a segment's pages

#include <chi/transport/shm_region_backing.h>  // the prefix a data region's writer backs

#include "cross_process_fixture.h"

using namespace xp_test;

namespace {

constexpr u64 kMiB = 1ull << 20;
constexpr u64 kGiB = 1ull << 30;
constexpr int kNoNamespace = 77;  ///< the child could not make a mount namespace

/** Free bytes of /dev/shm (0 when unreadable). */
u64 ShmFree() {
  struct statvfs vfs {};
  if (statvfs(chi::kShmDir, &vfs) != 0) return 0;
  return static_cast<u64>(vfs.f_bavail) * vfs.f_frsize;
}

bool Contains(const std::string &haystack, const std::string &needle) {
  return haystack.find(needle) != std::string::npos;
}

/** A runtime start (this process, CHI_PORT and CHI_SERVER_CONF as given) that must be refused. */
int RefusedStartMain() {
  chi_test::ChildChecks c;
  c.Expect(!chi::CHIMAERA_INIT(chi::ChimaeraMode::kServer, true), "the start is refused");
  const chi::Status &st = chi::Chimaera::Get().LastError();
  const std::string msg = st.message();
  c.Expect(st.code() == chi::ErrorCode::kOutOfMemory, "kOutOfMemory, got: " + st.ToString());
  for (const char *part : {"/dev/shm", "shm.client_data_size", "shm.runtime_data_size",
                           "shm.main_size", "SIGBUS", "--shm-size"}) {
    c.Expect(Contains(msg, part), std::string("the message names ") + part + ": " + msg);
  }
  return c.Result();
}
const chi_test::ChildRoutine kRefusedStart("room_refused_start", RefusedStartMain);

/** Fills /dev/shm with file `path` until it has no room left; true when it filled. */
bool FillShm(const std::string &path) {
  FILE *f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const std::string chunk(64 * 1024, 'f');
  while (std::fwrite(chunk.data(), 1, chunk.size(), f) == chunk.size()) {
  }
  std::fclose(f);  // the last partial chunk fails here or above: either way nothing is free
  return ShmFree() < 64 * 1024;
}

/** A `size`-byte Custom echo through `client`, checked byte for byte. */
void Echo(chi_test::ChildChecks &c, chimaera::demo::Client &client, u64 size) {
  std::string data(size, '\0');
  for (u64 i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + size) % 251);
  auto f = client.AsyncCustom(chi::PoolQuery::Local(), data);
  const std::string what = "the " + std::to_string(size) + "-byte echo ";
  c.Expect(f.Wait(30), what + "is answered");
  c.Expect(f->GetReturnCode() == 0, what + "succeeds: " + f->GetMessage());
  c.Expect(f->data_.view() == data, what + "comes back byte for byte");
}

/** 1 MiB and 3 MiB echoes and a GpuSubmit through `client`, each checked. */
void LargeEchoes(chi_test::ChildChecks &c, chimaera::demo::Client &client) {
  for (u64 size : {1 * kMiB, 3 * kMiB, 3 * kMiB}) Echo(c, client, size);
  auto g = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 42);
  c.Expect(g.Wait(10) && g->result_value_ == 84, "GpuSubmit 42 -> 84");
}

/** Bytes of segment `name` that pages back now (0 when it cannot be measured). */
u64 BackedBytes(const std::string &name) {
  chi::PosixShmBackend seg;
  chi::ShmRoom room;
  if (!chi::MeasureShmRoom({name}, &room).ok() || !seg.Attach(name).ok()) return 0;
  return seg.Size() - room.unbacked;
}

/** An shm client of CHI_PORT: large echoes (LargeEchoes), then stops the runtime. */
int LargeEchoClientMain() {
  chi_test::ChildChecks c;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&c, &client)) return c.Result();
  LargeEchoes(c, client);
  c.Expect(StopThroughSession(), "the runtime answers the stop");
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kLargeEchoClient("room_large_echo_client", LargeEchoClientMain);

/**
 * An shm client of CHI_PORT that connects, then fills /dev/shm (file ROOM_FILLER) before
 * its first large message: neither its data region nor the runtime's can be backed any
 * more, so the large echoes travel through the rings, and nobody dies of SIGBUS.
 */
int FilledAfterConnectClientMain() {
  chi_test::ChildChecks c;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&c, &client)) return c.Result();
  const std::string filler = EnvStr("ROOM_FILLER");
  c.Expect(FillShm(filler), "this client fills /dev/shm after connecting");
  LargeEchoes(c, client);
  std::remove(filler.c_str());
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kFilledAfterConnect("room_filled_after_connect_client",
                                                 FilledAfterConnectClientMain);

/**
 * An shm client of CHI_PORT whose first 64 KiB echo has only the first pages of its shares
 * of the data segments backed (not the 2 MiB shares), which then fills /dev/shm (file
 * ROOM_FILLER): a second 64 KiB echo travels in those pages, the larger ones that would
 * need more (a 3 MiB one first: chunks, refused before the first) go through the rings, and
 * nobody dies of SIGBUS.
 */
int PartlyBackedClientMain() {
  chi_test::ChildChecks c;
  chimaera::demo::Client client;
  if (!ConnectAndCreatePool(&c, &client)) return c.Result();
  const u32 port = static_cast<u32>(EnvU64("CHI_PORT"));
  const std::string cdata = chi::RuntimeSegmentName(port, "cdata");
  const std::string rdata = chi::RuntimeSegmentName(port, "rdata");
  const u64 cdata_before = BackedBytes(cdata);
  const u64 rdata_before = BackedBytes(rdata);
  Echo(c, client, 64 << 10);
  const u64 cdata_grew = BackedBytes(cdata) - cdata_before;
  const u64 rdata_grew = BackedBytes(rdata) - rdata_before;
  const std::string grew = " grew by " + std::to_string(cdata_grew >> 10) + " and " +
                           std::to_string(rdata_grew >> 10) + " KiB";
  c.Expect(cdata_grew >= 64 << 10 && rdata_grew >= 64 << 10,
           "the 64 KiB request and answer are backed where they lie:" + grew);
  c.Expect(cdata_grew <= 2 * chi::ShmRegionBacking::kFirstBytes &&
               rdata_grew <= 2 * chi::ShmRegionBacking::kFirstBytes,
           "a 64 KiB echo backs no more than the first prefix of each share:" + grew);
  const std::string filler = EnvStr("ROOM_FILLER");
  c.Expect(FillShm(filler), "this client fills /dev/shm after its first echo");
  Echo(c, client, 64 << 10);
  Echo(c, client, 3 * kMiB);  // chunked both ways: refused at its first chunk, then the rings
  LargeEchoes(c, client);
  std::remove(filler.c_str());
  chi::CHIMAERA_FINALIZE();
  return c.Result();
}
const chi_test::ChildRoutine kPartlyBacked("room_partly_backed_client", PartlyBackedClientMain);

/** An shm client of CHI_PORT while /dev/shm is full: its connection is refused, naming why. */
int FullShmClientMain() {
  chi_test::ChildChecks c;
  c.Expect(!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false), "the connection is refused");
  const chi::Status &st = chi::Chimaera::Get().LastError();
  c.Expect(st.code() == chi::ErrorCode::kOutOfMemory, "kOutOfMemory, got: " + st.ToString());
  c.Expect(Contains(st.message(), "/dev/shm") && Contains(st.message(), "rings"),
           std::string("the message names /dev/shm and the rings: ") + st.message());
  return c.Result();
}
const chi_test::ChildRoutine kFullShmClient("room_full_shm_client", FullShmClientMain);


/**
 * In a mount namespace of its own with a 16 MiB tmpfs over /dev/shm: the default sizes
 * are refused; a runtime sized to fit refuses no-one, but a client that finds /dev/shm
 * filled since is refused (its rings could not be backed) and the runtime serves on, and
 * with the room back its large shm messages travel. kNoNamespace when this process may
 * not make the namespace (not root).
 */
int SmallShmMain() {
  if (unshare(CLONE_NEWNS) != 0) return kNoNamespace;
  // Private first, so the tmpfs below stays in this namespace.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount("tmpfs", chi::kShmDir, "tmpfs", MS_NOSUID | MS_NODEV,
            "size=16m,mode=1777,huge=never") != 0) {
    return kNoNamespace;
  }
  chi_test::ChildChecks c;
  const u32 port = static_cast<u32>(std::atoi(std::getenv("CHI_PORT")));
  c.Expect(ShmFree() <= 16 * kMiB, "/dev/shm is the 16 MiB tmpfs");
  c.Expect(chi_test::RunChild("room_refused_start", {{"CHI_PORT", std::to_string(port)}}) == 0,
           "the default sizes (576 MiB of data and rings) are refused");
  c.Expect(CountExisting(RuntimeSegmentFiles(port)) == 0, "the refused start left no segment");
  // 2 MiB of rings and 4 + 4 MiB of data segments: 2 MiB per slot each way, so the 3 MiB
  // echoes travel in chunks through every page of the client's shares.
  const std::string conf = WriteConfigFile(
      "room_fit", "shm:\n  client_slots: 2\n  main_size: 2m\n  client_data_size: 4m\n"
                  "  runtime_data_size: 4m\n");
  {
    ServerProcess server(port, {{"CHI_SERVER_CONF", conf}});
    c.Expect(server.ok(), "a runtime sized to fit starts");
    if (server.ok()) {
      {
        // ServerProcess returns once the segments exist; the room check comes after them,
        // and a /dev/shm filled before it ran refused the start (seen under ASan). A
        // handshake is answered only once the runtime serves.
        ClientSession ready(port, "tcp");
        c.Expect(ready.ok(), "the runtime sized to fit serves");
      }
      const std::string filler = std::string(chi::kShmDir) + "/room_filler";
      c.Expect(FillShm(filler), "another process fills /dev/shm");
      c.Expect(chi_test::RunChild("room_full_shm_client", ClientEnv(port, "shm")) == 0,
               "a client finding /dev/shm full is refused, naming it");
      std::remove(filler.c_str());
      std::vector<std::pair<std::string, std::string>> env = ClientEnv(port, "shm");
      env.emplace_back("ROOM_FILLER", filler);
      const int filled_rc = chi_test::RunChild("room_filled_after_connect_client", env);
      std::remove(filler.c_str());  // a client that died (SIGBUS: exit 135) left it
      c.Expect(filled_rc == 0, "a client whose /dev/shm filled after it connected still gets "
                               "large echoes (exit " + std::to_string(filled_rc) + ")");
      const int partly_rc = chi_test::RunChild("room_partly_backed_client", env);
      std::remove(filler.c_str());
      c.Expect(partly_rc == 0, "a client whose /dev/shm filled after its first large echo "
                               "gets the next ones too (exit " + std::to_string(partly_rc) + ")");
      c.Expect(chi_test::RunChild("room_large_echo_client", ClientEnv(port, "shm")) == 0,
               "with the room back, a client's large echoes come back");
      c.Expect(server.WaitExit() == 0, "the runtime stops cleanly");
    }
  }
  std::remove(conf.c_str());
  c.Expect(CountExisting(RuntimeSegmentFiles(port)) == 0, "the stopped runtime removed its segments");
  return c.Result();
}
const chi_test::ChildRoutine kSmallShm("room_small_shm", SmallShmMain);

}  // namespace

TEST_CASE("MeasureShmRoom counts a segment's unwritten pages and what /dev/shm has free") {
  const std::string name = "room_unit_" + std::to_string(getpid());
  chi::PosixShmBackend seg;
  REQUIRE(seg.Create(name, 8 * kMiB).ok());
  chi::ShmRoom before;
  REQUIRE(chi::MeasureShmRoom({name}, &before).ok());
  // Pages of 4 KiB, or 2 MiB where tmpfs uses huge pages: only the header's is written.
  CHECK(before.unbacked >= seg.Size() - 2 * kMiB);
  CHECK(before.unbacked <= seg.Size());
  CHECK(before.free > 0);
  std::memset(seg.Data() + 4 * kMiB, 1, 2 * kMiB);  // away from the header's page
  chi::ShmRoom after;
  REQUIRE(chi::MeasureShmRoom({name}, &after).ok());
  CHECK(before.unbacked - after.unbacked >= 2 * kMiB);
  CHECK(before.unbacked - after.unbacked <= 4 * kMiB);  // at most two huge pages
  CHECK(seg.Destroy().ok());
  chi::ShmRoom gone;
  const chi::Status st = chi::MeasureShmRoom({name}, &gone);
  CHECK(st.code() == chi::ErrorCode::kNotFound);
  CHECK(Contains(st.message(), name));
}

TEST_CASE("a data region's writer has the pages its blocks reach backed, a prefix that doubles") {
  const std::string name = "room_prefix_" + std::to_string(getpid());
  chi::PosixShmBackend seg;
  REQUIRE(seg.Create(name, 8 * kMiB).ok());
  chi::Atomic<u64> released;
  // A 4 MiB share away from the header's page, as every slot's but the first lies.
  const chi::ShmDataRegion region(seg.Data() + 2 * kMiB, 4 * kMiB, &released);
  const u64 at_start = BackedBytes(name);
  // What pages back beyond the start is at least the prefix (plus the page before a share
  // that does not start on one, or a huge page where tmpfs uses them).
  auto backs_prefix = [&](u64 prefix) {
    const u64 grew = BackedBytes(name) - at_start;
    return grew >= prefix && grew <= prefix + 2 * kMiB;
  };
  constexpr u64 kFirst = chi::ShmRegionBacking::kFirstBytes;
  chi::ShmRegionBacking b;
  CHECK(b.Backed() == 0);
  CHECK(b.Covers(region, chi::ShmDataRef{0, 64 << 10, 64 << 10}));
  CHECK(b.Backed() == kFirst);
  CHECK(backs_prefix(kFirst));
  // An encoder at 300 KiB with 3 MiB free gets what lies in backed pages: at least
  // kFirst of it, the prefix grown just that far since that is more than twice it.
  CHECK(b.BackedRoom(region, 300 << 10, 3 * kMiB) == kFirst);
  CHECK(b.Backed() == (300 << 10) + kFirst);
  // A block on the next lap (1 MiB into the share) that ends short of twice the prefix.
  CHECK(b.Covers(region, chi::ShmDataRef{4 * kMiB + kMiB, 10 << 10, 10 << 10}));
  CHECK(b.Backed() == 2 * ((300 << 10) + kFirst));
  CHECK(backs_prefix(b.Backed()));
  const u64 before = b.Backed();
  CHECK(b.Covers(region, chi::ShmDataRef{0, 1000, 1000}));  // inside: nothing more
  CHECK(b.BackedRoom(region, 100 << 10, 50 << 10) == 50 << 10);
  CHECK(b.Backed() == before);
  // A chunk of a message larger than the share: the chunks will cover all of it.
  CHECK(b.Covers(region, chi::ShmDataRef{4 * kMiB, kMiB, 6 * kMiB}));
  CHECK(b.Backed() == 4 * kMiB);
  CHECK(backs_prefix(4 * kMiB));
  CHECK_FALSE(b.Refused());
  CHECK(seg.Destroy().ok());
}

TEST_CASE("an encode in place gets the backed pages, and once more the pages it said it needs") {
  const std::string name = "room_encode_" + std::to_string(getpid());
  chi::PosixShmBackend seg;
  REQUIRE(seg.Create(name, 4 * kMiB).ok());
  chi::Atomic<u64> released;
  const chi::ShmDataRegion region(seg.Data(), 2 * kMiB, &released);
  // An encoder of a `len`-byte message: writes it when it fits, else says what it needs.
  int calls = 0;
  u64 len = 0;
  auto encode = [&](char *dst, u64 cap, u64 *need) -> u64 {
    ++calls;
    if (cap < len) {
      *need = len;
      return 0;
    }
    std::memset(dst, 7, len);
    return len;
  };
  chi::ShmRegionBacking b;
  len = 100 << 10;
  CHECK(b.EncodeIn(region, 0, 2 * kMiB, encode) == len);
  CHECK(calls == 1);
  CHECK(b.Backed() == chi::ShmRegionBacking::kFirstBytes);
  calls = 0;
  len = 1536 << 10;  // more than is backed: a second try, in pages backed for it
  CHECK(b.EncodeIn(region, 0, 2 * kMiB, encode) == len);
  CHECK(calls == 2);
  CHECK(b.Backed() == len);
  calls = 0;
  CHECK(b.EncodeIn(region, 1 * kMiB, 1 * kMiB, encode) == 0);  // more than the room
  CHECK(calls == 1);
  CHECK(b.Backed() == len);  // nothing backed for a message that cannot fit
  CHECK(seg.Destroy().ok());
}

TEST_CASE("a runtime /dev/shm cannot back refuses to start, leaves nothing, and the port serves after") {
  const u32 port = TestPort(0);
  // One GiB more than /dev/shm has free, in whole GiB (the config's largest size is 1024g).
  const u64 data_gib = ShmFree() / kGiB + 2;
  REQUIRE_MESSAGE(data_gib <= 1024, "/dev/shm has more than 1 TiB free; no size can exceed it");
  const std::string conf = WriteConfigFile(
      "room_huge", "shm:\n  client_data_size: " + std::to_string(data_gib) + "g\n");
  CHECK(chi_test::RunChild("room_refused_start",
                           {{"CHI_PORT", std::to_string(port)}, {"CHI_SERVER_CONF", conf}}) == 0);
  std::remove(conf.c_str());
  CHECK(CountExisting(RuntimeSegmentFiles(port)) == 0);
  ServerProcess server(port);
  REQUIRE(server.ok());
  {
    ClientSession session(port, "shm");
    REQUIRE(session.ok());
    chimaera::demo::Client c = DemoClient();
    SequentialGpuSubmits(c, 0, 10);
    CHECK(StopThroughSession());
  }
  CHECK(server.WaitExit() == 0);
}

TEST_CASE("in a 16 MiB /dev/shm: defaults refused, sizes that fit serve 3 MiB echoes, a full one refuses clients") {
  const int rc = chi_test::RunChild("room_small_shm", {{"CHI_PORT", std::to_string(TestPort(1))}});
  if (rc == kNoNamespace) {
    MESSAGE("skipped: this process may not make a mount namespace (needs root); the refusal "
            "itself is checked by the case above");
    return;
  }
  CHECK(rc == 0);
}
