// chimaera_stop_runtime: asks the runtime on this node (CHI_PORT) to drain and
// stop, and waits until its process has exited. Exit 1 (after about a second) when there
// is none.
#include "runtime_control.h"  // RefuseArguments, StopRuntime

int main(int argc, char **argv) {
  if (int rc = chi_tools::RefuseArguments(argc, argv); rc != 0) return rc;
  return chi_tools::StopRuntime(30);
}
