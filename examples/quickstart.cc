// Quick start: a program that embeds a runtime, makes a pool of the demo module and runs
// two tasks on it. The README shows this file as it is (a test checks that they agree).
#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>  // in one .cc of the program: registers the module

#include <cstdio>
#include <string>

int main() {
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true)) return 1;  // embedded runtime
  chimaera::demo::Client client;
  auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "my_pool", chi::PoolId(200, 0));
  created.Wait();
  if (created->GetReturnCode() != 0) {
    std::fprintf(stderr, "create failed: %s\n", created->GetMessage());
    return 1;
  }
  auto echo = client.AsyncCustom(chi::PoolQuery::Local(), "hello");  // both run at once
  auto sum = client.AsyncGpuSubmit(chi::PoolQuery::Local(), /*gpu_id=*/0, /*value=*/21);
  echo.Wait();
  sum.Wait();
  const bool ok = echo->data_.view() == "hello" && sum->result_value_ == 42;
  std::printf("echo: %s; 21 * 2 + 0 = %u\n", std::string(echo->data_.view()).c_str(),
              sum->result_value_);
  chi::CHIMAERA_FINALIZE();
  return ok ? 0 : 1;
}
