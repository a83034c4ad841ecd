// Shared set-up for tests that need an embedded runtime: starts it once per
// test binary and creates demo pools on demand.
#pragma once

#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>

#include <string>

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

}  // namespace chi_test
