// Host-side compile check of the GPU API layer's HIP paths: the IPC operations RegisterMemory
// relies on (device allocation lookup, IPC handle export, open and close), compiled by hipcc
// with the HIP runtime selected. Never run; tests/packaging.cmake only compiles it. (The whole
// runtime header set does not go through Debian's hipcc: its clang crashes on yaml-cpp.)
#include <chi/gpu/gpu_ipc_ops.h>

static_assert(CHI_MEMORY_USE_HIP == 1, "this check is about the HIP side of the GPU API layer");

/** Calls every IPC operation once, so each is instantiated and type-checked against HIP. */
int main() {
  chi::gpu::MemoryRegistration reg;
  int device = 0;
  char *base = nullptr;
  chi::u64 size = 0;
  chi::Status st = chi::gpu::DeviceAllocationOf(nullptr, &device, &base, &size);
  st = chi::gpu::DescribeDeviceMemory(nullptr, 16, &reg);
  void *mapped = nullptr;
  st = chi::gpu::OpenIpcHandle(0, chi::gpu::IpcHandleBytes{}, &mapped);
  chi::gpu::CloseIpcHandle(0, mapped);
  return st.ok() ? 0 : 1;
}
