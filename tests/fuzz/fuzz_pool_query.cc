// libFuzzer harness for the textual and wire forms of pool queries and pool ids: the text
// a user or a config file gives (PoolQuery::Parse, PoolId::Parse) and the bytes a task's
// routing header carries (Task::SerializeBaseIn, with PoolQuery's SetWireMode and
// SerializeArgs, and PoolQuery's full serialize checked by IsValid). The first input byte
// picks the form; the rest is the text or the bytes.
#include <cstdint>      // uint8_t
#include <cstring>      // memcmp
#include <string>       // ToString
#include <string_view>  // the text
#include <vector>       // encoded bytes

#include "chi/core/ids.h"           // PoolId
#include "chi/core/pool_query.h"    // PoolQuery
#include "chi/serialize/archive.h"  // InputArchive, OutputArchive
#include "chi/task/task.h"          // Task::SerializeBaseIn
#include "fuzz_check.h"             // FuzzCheck, FuzzBytes

using chi::ErrorCode;
using chi::PoolId;
using chi::PoolQuery;
using chi::Status;
using chi::fuzz::FuzzBytes;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;

namespace {

/** A query no parse produces, to see that a refused parse leaves its output alone. */
constexpr PoolQuery kUntouchedQuery = PoolQuery::Range(0xdead, 0xbeef);
/** A pool id no parse of the fuzzer's refused text may write. */
constexpr PoolId kUntouchedId{0xdead, 0xbeef};

/**
 * Text form: what parses prints back to text that parses to the same query (and prints the
 * same again); what is refused is kInvalidArgument with a message, its output untouched.
 */
void CheckQueryText(std::string_view text) {
  PoolQuery q = kUntouchedQuery;
  Status st = PoolQuery::Parse(text, &q);
  if (!st.ok()) {
    FuzzCheckRefusal(st, "refused query text has a code and a message");
    FuzzCheck(st.code() == ErrorCode::kInvalidArgument, "refused query text is kInvalidArgument");
    FuzzCheck(q == kUntouchedQuery, "refused query text leaves the output untouched");
    return;
  }
  FuzzCheck(q.IsValid(), "a parsed query is valid");
  const std::string printed = q.ToString();
  PoolQuery back;
  FuzzCheck(PoolQuery::Parse(printed, &back).ok(), "a parsed query's ToString parses");
  FuzzCheck(back == q, "a parsed query's ToString parses back to the same query");
  FuzzCheck(back.ToString() == printed, "ToString of the parsed-back query is the same text");
}

/** Text form of pool ids: the same round trip as for queries. */
void CheckIdText(std::string_view text) {
  PoolId id = kUntouchedId;
  Status st = PoolId::Parse(text, &id);
  if (!st.ok()) {
    FuzzCheckRefusal(st, "refused pool id text has a code and a message");
    FuzzCheck(st.code() == ErrorCode::kInvalidArgument, "refused pool id text is kInvalidArgument");
    FuzzCheck(id == kUntouchedId, "refused pool id text leaves the output untouched");
    return;
  }
  const std::string printed = id.ToString();
  PoolId back;
  FuzzCheck(PoolId::Parse(printed, &back).ok(), "a parsed pool id's ToString parses");
  FuzzCheck(back == id, "a parsed pool id's ToString parses back to the same id");
  FuzzCheck(back.ToString() == printed, "ToString of the parsed-back pool id is the same text");
}

/** A decoded query prints as text that parses, and printing that again gives the same text. */
void CheckPrintable(const PoolQuery &q) {
  const std::string printed = q.ToString();
  PoolQuery back;
  FuzzCheck(PoolQuery::Parse(printed, &back).ok(), "a decoded query's ToString parses");
  FuzzCheck(back.ToString() == printed, "a decoded query's text is a fixed point");
}

/** Periods read the same: equal numbers (-0 is written as 0, its usual value), or both NaN. */
bool SamePeriod(double a, double b) { return a == b || (a != a && b != b); }

/** Encodes a task's routing header the way every transport does (it fits in 128 bytes). */
std::vector<char> EncodeHeader(chi::Task &t) {
  char buf[128];
  chi::OutputArchive ar(buf, sizeof(buf));
  t.SerializeBaseIn(ar);
  FuzzCheck(ar.ok(), "a decoded routing header encodes");
  return std::vector<char>(buf, buf + ar.Size());
}

/**
 * Wire form in a routing header: a header that decodes carries a valid query; encoding it,
 * decoding that and encoding again gives the same bytes. A refused header is kTruncated
 * or kMalformed with a message.
 */
void CheckRoutingHeader(const char *data, size_t size) {
  chi::InputArchive ar(data, size);
  chi::Task t;
  t.SerializeBaseIn(ar);
  if (!ar.ok()) {
    FuzzCheckRefusal(ar.status(), "refused routing header has a code and a message");
    FuzzCheck(ar.code() == ErrorCode::kTruncated || ar.code() == ErrorCode::kMalformed,
              "refused routing header is kTruncated or kMalformed");
    return;
  }
  FuzzCheck(t.pool_query_.IsValid(), "a decoded routing header's query is valid");
  CheckPrintable(t.pool_query_);
  const std::vector<char> once = EncodeHeader(t);
  chi::InputArchive again(once.data(), once.size());
  chi::Task u;
  u.SerializeBaseIn(again);
  FuzzCheck(again.ok(), "a re-encoded routing header decodes");
  FuzzCheck(again.Remaining() == 0, "a re-encoded routing header decodes to its end");
  FuzzCheck(u.pool_query_ == t.pool_query_, "a re-encoded routing header keeps its query");
  FuzzCheck(u.pool_id_ == t.pool_id_ && u.method_ == t.method_ && u.task_id_ == t.task_id_ &&
                u.task_node_ == t.task_node_ && u.task_flags_.Bits() == t.task_flags_.Bits() &&
                SamePeriod(u.period_ns_, t.period_ns_),
            "a re-encoded routing header keeps pool, method, task id, node, flags and period");
  FuzzCheck(EncodeHeader(u) == once, "a routing header's second encoding is the first");
}

/**
 * Full wire form (PoolQuery::serialize, as inside other messages): the archive refuses an
 * invalid query; a decoded one is printable and encodes back to the bytes it came from.
 */
void CheckFullForm(const char *data, size_t size) {
  chi::InputArchive ar(data, size);
  PoolQuery q = kUntouchedQuery;
  ar(q);
  if (!ar.ok()) {
    FuzzCheckRefusal(ar.status(), "refused query bytes have a code and a message");
    return;
  }
  FuzzCheck(q.IsValid(), "a decoded query is valid");
  CheckPrintable(q);
  std::vector<char> out;
  chi::OutputArchive w(out);
  w(q);
  FuzzCheck(w.ok() && out.size() == ar.Position() &&
                std::memcmp(out.data(), data, out.size()) == 0,
            "a decoded query encodes to the bytes it was read from");
}

}  // namespace

/** Byte 0 picks the form (query text, pool id text, routing header, full query bytes). */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzBytes in(data, size);
  switch (in.TakeByte() % 4) {
    case 0: CheckQueryText(in.RestText()); break;
    case 1: CheckIdText(in.RestText()); break;
    case 2: CheckRoutingHeader(in.RestData(), in.RestSize()); break;
    default: CheckFullForm(in.RestData(), in.RestSize()); break;
  }
  return 0;
}
