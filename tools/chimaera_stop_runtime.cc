// chimaera_stop_runtime: asks the runtime on this node (CHI_PORT) to drain and
// stop, and waits until its process has exited. Exit 1 when there is none.
#include "runtime_control.h"  // StopRuntime

int main() { return chi_tools::StopRuntime(30); }
