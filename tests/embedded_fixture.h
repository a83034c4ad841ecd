// Shared set-up for tests that need an embedded runtime: starts it once per
// test binary and creates demo pools on demand, or a pool of a test's own module under a
// runtime configuration of the test's.
#pragma once

#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>

#include <stdlib.h>  // setenv of CHI_SERVER_CONF

#include <string>

#include "temp_file.h"  // the test's runtime configuration

namespace chi_test {

/** Starts the embedded runtime (once) and returns a client of a fresh demo pool. */
inline chimaera::demo::Client MakeDemoPool(const std::string &name, chi::PoolId id,
                                           chi::u32 containers = 1) {
  static const bool started = chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true);
  REQUIRE(started);
  chimaera::demo::Client c;
  auto f = c.AsyncCreate(chi::PoolQuery::Dynamic(), name, id, containers);
  REQUIRE(f.Wait(30));
  REQUIRE_MESSAGE(f->GetReturnCode() == 0, f->GetMessage());
  return c;
}

/**
 * Starts the embedded runtime once per binary with the server configuration `yaml` and
 * creates a pool of `module` (a module the test registered) with id `pool`.
 */
inline void StartWithPool(const char *yaml, const char *module, chi::PoolId pool) {
  static TempFile conf(yaml);
  static const bool started = [&] {
    setenv("CHI_SERVER_CONF", conf.path().c_str(), 1);
    if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return false;
    auto made = chimaera::admin::Client().AsyncCreatePool(chi::PoolQuery::Local(), module,
                                                          module, pool);
    return made.Wait(30) && made->GetReturnCode() == 0;
  }();
  REQUIRE(started);
}

/** A task of type T for method m of `pool`, routed Local; the caller fills its inputs. */
template <typename T>
T *NewLocalTask(chi::PoolId pool, chi::MethodId m) {
  T *t = chi::NewTask<T>();
  t->pool_id_ = pool;
  t->pool_query_ = chi::PoolQuery::Local();
  t->method_ = m;
  return t;
}

}  // namespace chi_test
