// The main of the GPU test binaries that run an embedded runtime (test_gpu_runtime,
// test_gpu_memory): GPU check ("skipped: no GPU", exit 77), eager module loading, the test's
// own memory and kernels, the runtime (2 x 256 orchestrator threads) on GPU 0, the demo pool;
// then doctest. Every kernel is loaded before the orchestrator starts (lazy loading could
// deadlock behind it), and the caller's current GPU must survive CHIMAERA_INIT.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>  // getpid: the config file name

#include <cstdio>   // the config file, messages
#include <cstdlib>  // setenv
#include <string>   // paths

#include "chi/gpu/gpu_manager.h"         // CHI_IPC, PreferEagerModuleLoading
#include "chi/mods/demo/demo_client.h"   // the demo pool the tests use
#include "chi/runtime/chimaera.h"        // CHIMAERA_INIT / FINALIZE

namespace chi_gpu_test {

/**
 * Runs the tests of a binary named `name` against an embedded GPU runtime with the demo
 * pool `pool`. `prepare` allocates the test's memory and preloads its kernels (false:
 * cannot). Returns the exit code: 77 without a GPU, 1 when set-up fails, else doctest's.
 */
template <typename Prepare>
int RunWithRuntime(int argc, char **argv, const char *name, chi::PoolId pool, Prepare prepare) {
  chi::gpu::PreferEagerModuleLoading();  // before the first CUDA call
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  const std::string conf =
      std::string("/tmp/chi_") + name + "_" + std::to_string(getpid()) + ".yaml";
  if (FILE *f = std::fopen(conf.c_str(), "w")) {
    std::fputs("gpu:\n  blocks: 2\n  threads_per_block: 256\n  queue_depth: 1024\n", f);
    std::fclose(f);
  }
  setenv("CHI_SERVER_CONF", conf.c_str(), 1);
  if (!prepare()) {
    std::printf("cannot prepare the GPU test memory\n");
    return 1;
  }
  if (cudaSetDevice(0) != cudaSuccess) return 1;
  const bool started = chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true);
  std::remove(conf.c_str());
  if (!started) return 1;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != 0) {
    std::printf("CHIMAERA_INIT moved this thread from GPU 0 to GPU %d\n", current);
    return 1;
  }
  const chi::Status gpu = CHI_IPC->StartError();
  if (!gpu.ok()) {
    std::printf("GPU runtime did not start: %s\n", gpu.ToString().c_str());
    return 1;
  }
  chimaera::demo::Client client;
  auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), name, pool);
  if (!created.Wait(30) || created->GetReturnCode() != 0) {
    std::printf("cannot create the demo pool\n");
    return 1;
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  chi::CHIMAERA_FINALIZE();
  return rc;
}

}  // namespace chi_gpu_test
