// chimaera_start_runtime [--with-demo]: runs a standalone runtime in the foreground
// (CHI_PORT, CHI_SERVER_CONF) until `chimaera_stop_runtime`, StopRuntime, SIGTERM or SIGINT.
// The demo module, a test module whose methods read registered memory and allocate on
// request, is served only with --with-demo or when the configuration's compose names it.
#include <chi/mods/demo/demo_runtime.h>  // linked in; served only when asked for

#include "runtime_control.h"  // ParseStartArguments, RunRuntimeForeground

int main(int argc, char **argv) {
  bool with_demo = false;
  if (int rc = chi_tools::ParseStartArguments(argc, argv, &with_demo); rc != 0) return rc;
  if (!with_demo && !chi_tools::ConfigComposes(chimaera::demo::kModuleName)) {
    chi::ModuleManager::Get().Remove(chimaera::demo::kModuleName);
  }
  return chi_tools::RunRuntimeForeground();
}
