// chimaera_start_runtime: runs a standalone runtime in the foreground (CHI_PORT,
// CHI_SERVER_CONF) until `chimaera_stop_runtime`, StopRuntime, SIGTERM or SIGINT.
#include <chi/mods/demo/demo_runtime.h>  // the built-in demo module is always served

#include "runtime_control.h"  // RefuseArguments, RunRuntimeForeground

int main(int argc, char **argv) {
  if (int rc = chi_tools::RefuseArguments(argc, argv); rc != 0) return rc;
  return chi_tools::RunRuntimeForeground();
}
