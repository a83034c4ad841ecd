// libFuzzer harness for the runtime's request decoder, RequestDispatcher::Decode, over a
// PoolManager holding the admin pool and a demo pool (no workers: Decode submits nothing).
// The input is one request envelope. A request that decodes encodes canonically
// (EncodeRequest, decoded and encoded again: the same bytes) and holds its pool until
// released; a refusal has one of Decode's documented codes and a message, and holds none.
#include <cstdint>  // uint8_t
#include <cstdio>   // fprintf of a re-encoded request refused
#include <memory>   // unique_ptr<PoolInfo>
#include <vector>   // encoded requests

#include "chi/mods/admin/admin_runtime.h"      // the admin module (registers itself)
#include "chi/mods/demo/demo_runtime.h"        // the demo module (registers itself)
#include "chi/runtime/pool_manager.h"          // PoolManager
#include "chi/transport/request_dispatcher.h"  // RequestDispatcher, EncodeRequest
#include "fuzz_check.h"                        // FuzzCheck

using chi::ErrorCode;
using chi::PoolInfo;
using chi::PoolManager;
using chi::Status;
using chi::u64;
using chi::fuzz::FuzzCheck;
using chi::fuzz::FuzzCheckRefusal;

namespace {

/** The demo pool's id (the first id a runtime picks itself is 100.0). */
constexpr chi::PoolId kDemoPool{200, 0};

/** Creates and publishes one pool of `module` with `containers` containers. */
void AddPool(PoolManager *pools, std::string_view module, std::string_view name, chi::PoolId id,
             chi::u32 containers) {
  std::unique_ptr<PoolInfo> info;
  Status st = pools->PreparePool(module, name, id, containers, &info);
  FuzzCheck(st.ok(), "the harness's pools can be prepared");
  st = pools->CommitPool(std::move(info));
  FuzzCheck(st.ok(), "the harness's pools can be published");
}

/** The runtime's pools, made once: the admin pool and a demo pool of two containers. */
PoolManager &Pools() {
  static PoolManager *pools = [] {
    auto *p = new PoolManager();
    AddPool(p, chimaera::admin::kModuleName, "admin", chi::kAdminPoolId, 1);
    AddPool(p, chimaera::demo::kModuleName, "demo", kDemoPool, 2);
    return p;
  }();
  return *pools;
}

/** Tasks in flight on pool `id` (the references Decode took and nobody released). */
u64 Held(PoolManager &pools, chi::PoolId id) {
  PoolInfo *p = pools.Acquire(id);
  FuzzCheck(p != nullptr, "the harness's pools stay registered");
  const u64 n = p->inflight_.Sum(chi::MemOrder::kRelaxed) - 1;  // less our own
  pools.Release(p);
  return n;
}

/** The codes RequestDispatcher::Decode documents for a refusal. */
bool DocumentedRefusal(ErrorCode c) {
  return c == ErrorCode::kTruncated || c == ErrorCode::kMalformed ||
         c == ErrorCode::kUnsupported || c == ErrorCode::kUnknownPool ||
         c == ErrorCode::kUnknownMethod;
}

/** Encodes a decoded request again, as a client's transport would send it. */
std::vector<char> Encode(chi::Task *t, u64 request_id) {
  std::vector<char> out;
  chi::EncodeRequest(t, request_id, &out);
  return out;
}

}  // namespace

/** The input is one request envelope: [u64 request id][routing header][inputs]. */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  PoolManager &pools = Pools();
  chi::RequestDispatcher dispatcher(&pools, nullptr);
  u64 request_id = 0;
  PoolInfo *pool = nullptr;
  Status why;
  chi::Task *t = dispatcher.Decode(reinterpret_cast<const char *>(data), size, &request_id,
                                   &pool, &why);
  if (t == nullptr) {
    FuzzCheckRefusal(why, "a refused request has a code and a message");
    FuzzCheck(DocumentedRefusal(why.code()), "a refused request has one of Decode's codes");
  } else {
    FuzzCheck(pool != nullptr && pool->id_ == t->pool_id_,
              "a decoded request holds the pool it names");
    FuzzCheck(t->ops_ != nullptr, "a decoded request's task has its operations");
    const std::vector<char> once = Encode(t, request_id);
    u64 id_again = 0;
    PoolInfo *pool_again = nullptr;
    Status why_again;
    chi::Task *u = dispatcher.Decode(once.data(), once.size(), &id_again, &pool_again, &why_again);
    if (u == nullptr) std::fprintf(stderr, "re-encoded request refused: %s\n", why_again.message());
    FuzzCheck(u != nullptr, "a re-encoded request decodes");
    FuzzCheck(id_again == request_id && pool_again == pool && u->method_ == t->method_,
              "a re-encoded request keeps its id, pool and method");
    FuzzCheck(Encode(u, id_again) == once, "a request's second encoding is the first");
    chi::DeleteTask(u);
    pools.Release(pool_again);
    chi::DeleteTask(t);
    pools.Release(pool);
  }
  FuzzCheck(Held(pools, chi::kAdminPoolId) == 0 && Held(pools, kDemoPool) == 0,
            "no pool stays held once the decoded tasks are released");
  return 0;
}
